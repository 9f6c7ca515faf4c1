"""The portal as an ASGI application, for the production server (`gpu-portal-server web`,
uvicorn). The agents' long polls wait on its event loop; the database work of its async views
runs on a few threads of their own (portal.db.threads), and the agent endpoints are served
beside Django's request handling (scheduler.nodes.asgi), which would hold a thread per request."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django_application = get_asgi_application()

# After Django's setup (the settings and the apps are loaded).
from portal.db.threads import use_database_threads  # noqa: E402
from scheduler.nodes.asgi import AgentEndpoints  # noqa: E402

use_database_threads()
application = AgentEndpoints(django_application)
