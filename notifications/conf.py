"""Settings of notifications (docs/notifications.md), read from the environment.

portal/settings.py star-imports this module, so each name here is a Django setting. Numbers and
yes/no settings are read with portal/env.py's readers: a malformed value stops the portal at
start, naming the variable and its rule."""

import environ

from portal.env import count, days, flag, seconds

_env = environ.Env()

# E-mail goes out through Django's mail with these SMTP settings (Django's own names).
EMAIL_BACKEND = _env.str("EMAIL_BACKEND", default="django.core.mail.backends.smtp.EmailBackend")
EMAIL_HOST = _env.str("EMAIL_HOST", default="localhost")
EMAIL_PORT = count("EMAIL_PORT", default=25, most=65535)
EMAIL_HOST_USER = _env.str("EMAIL_HOST_USER", default="")
EMAIL_HOST_PASSWORD = _env.str("EMAIL_HOST_PASSWORD", default="")
EMAIL_USE_TLS = flag("EMAIL_USE_TLS", default=False)
EMAIL_USE_SSL = flag("EMAIL_USE_SSL", default=False)
# A mail server that does not answer must not hold a sender for long.
EMAIL_TIMEOUT = seconds("EMAIL_TIMEOUT", default=10.0)
DEFAULT_FROM_EMAIL = _env.str("DEFAULT_FROM_EMAIL", default="gpu-portal@localhost")

# Beat runs the notifications' dispatch this often: new job events and share changes become
# deliveries, and the deliveries that are due are sent.
NOTIFICATIONS_ENABLED = flag("NOTIFICATIONS_ENABLED", default=True)
NOTIFICATIONS_POLL_SECONDS = seconds("NOTIFICATIONS_POLL_SECONDS", default=5.0)
# One webhook request (connect and answer) or one SMTP conversation gets at most this long.
NOTIFICATIONS_TIMEOUT_SECONDS = seconds("NOTIFICATIONS_TIMEOUT_SECONDS", default=5.0)
# A delivery that fails is tried again after BASE × 2^(tries − 1) seconds, at most MAX, and is
# given up (FAILED) after this many tries.
NOTIFICATIONS_MAX_ATTEMPTS = count("NOTIFICATIONS_MAX_ATTEMPTS", default=8)
NOTIFICATIONS_RETRY_BASE_SECONDS = seconds("NOTIFICATIONS_RETRY_BASE_SECONDS", default=30.0)
NOTIFICATIONS_RETRY_MAX_SECONDS = seconds("NOTIFICATIONS_RETRY_MAX_SECONDS", default=3600.0)
# Endpoints are sent to in parallel, on at most this many threads of one dispatch.
NOTIFICATIONS_SEND_THREADS = count("NOTIFICATIONS_SEND_THREADS", default=8)
# How many events one read of the outbox takes, and deliveries one dispatch sends at most.
NOTIFICATIONS_BATCH = count("NOTIFICATIONS_BATCH", default=1000)
# An event id the outbox has not seen while later ids were already visible belongs to a
# transaction still open (or one rolled back): it is looked for this long, then given up.
NOTIFICATIONS_OUTBOX_SETTLE_SECONDS = seconds("NOTIFICATIONS_OUTBOX_SETTLE_SECONDS", default=600.0)
# Sent and failed deliveries are kept this long (the record of what went out), then pruned.
NOTIFICATIONS_RETENTION_DAYS = days("NOTIFICATIONS_RETENTION_DAYS", default=30.0)
# The Celery queue of the dispatch task: empty, the default queue (the worker that runs the
# cycle); name one to run notifications on a worker of their own (`celery worker -Q NAME`).
NOTIFICATIONS_QUEUE = _env.str("NOTIFICATIONS_QUEUE", default="")
# Webhook and Slack targets that resolve to a loopback, private, link-local, multicast,
# reserved or other non-public address are refused (at subscription and at each send), unless
# the address is inside one of these networks: comma-separated CIDRs, e.g. "10.20.0.0/16".
NOTIFICATIONS_WEBHOOK_ALLOWED_NETS = _env.str("NOTIFICATIONS_WEBHOOK_ALLOWED_NETS", default="")
# The portal's address as people reach it, for links in messages (empty: no links).
NOTIFICATIONS_PORTAL_URL = _env.str("NOTIFICATIONS_PORTAL_URL", default="").rstrip("/")
