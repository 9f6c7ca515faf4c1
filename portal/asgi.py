"""The portal as an ASGI application, for the production server (`gpu-portal-server web`,
uvicorn). The agents' endpoints are served here on the event loop (scheduler.nodes.asgi): a
waiting long poll holds no thread and no database connection. Everything else (the REST API, the
admin, the dashboards) is Django's WSGI application on WEB_THREADS threads (`portal.threaded_wsgi`):
a request runs start to end on one thread, as under a WSGI server, instead of hopping between the
loop and a thread of its own at every middleware, as Django's ASGI handler does (several times
slower per request here)."""

import gc
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
django_application = get_wsgi_application()

# After Django's setup (the settings and the apps are loaded).
from django.conf import settings  # noqa: E402

from portal.db.threads import use_database_threads  # noqa: E402
from portal.threaded_wsgi import ThreadedWsgi  # noqa: E402
from scheduler.nodes.asgi import AgentEndpoints  # noqa: E402

use_database_threads()
application = AgentEndpoints(ThreadedWsgi(django_application, threads=settings.WEB_THREADS))

# What the start-up loaded (Django, the apps, their modules: most of the heap) stays out of every
# collection, and the youngest generation is collected every 5,000 allocations instead of 700, so
# fewer short-lived objects of the requests are promoted and full collections become rare. With
# Python's defaults, at 2,000 agents (bench/agents.py), a full collection came every 2-3 s in
# each web process and stopped its event loop, polls and stop orders with it, for 180-600 ms.
gc.freeze()
gc.set_threshold(5000, 20, 100)
