"""The portal's own housekeeping on beat: thin tasks that call what Django provides."""

from importlib import import_module

from celery import Celery, shared_task
from django.conf import settings

# Once a day: an expired session is refused when it comes back anyway, so clearing it is only
# about the table's size.
SESSIONS_CLEAR_SECONDS = 24 * 60 * 60


@shared_task(name="portal.tasks.sessions_clear_expired", ignore_result=True)
def sessions_clear_expired() -> None:
    """Deletes the sessions past their expiry, as `manage.py clearsessions` does, through
    SESSION_ENGINE's store: with the default database sessions, the django_session rows of
    sessions nobody ended (a closed browser, a login abandoned at the provider, an API client
    that keeps a cookie) go; live sessions stay."""
    import_module(settings.SESSION_ENGINE).SessionStore.clear_expired()


def add_periodic_tasks(app: Celery) -> None:
    """Beat clears expired sessions every SESSIONS_CLEAR_SECONDS (daily)."""
    app.add_periodic_task(
        SESSIONS_CLEAR_SECONDS,
        app.signature("portal.tasks.sessions_clear_expired"),
        name="sessions_clear_expired",
    )
