"""The Celery app: the worker runs the scheduling cycle; beat triggers it on a timer."""

import os

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
app.autodiscover_tasks(["scheduler.cycle"])  # the cycle's task
app.autodiscover_tasks(["portal"])  # housekeeping: portal/tasks.py


@signals.setup_logging.connect
def log_as_django_does(**kwargs) -> None:
    """The worker and beat log through Django's LOGGING (JSON lines under the production
    server), not Celery's own format."""
    import logging.config

    from django.conf import settings

    logging.config.dictConfig(settings.LOGGING)


@signals.task_prerun.connect
@signals.task_postrun.connect
def end_task_as_a_request(sender=None, **kwargs) -> None:
    """Around each task, what Django does around each request: a connection that failed, or is
    older than CONN_MAX_AGE, is closed; with DATABASE_POOL_SIZE, the connection goes back to
    the pool. The rest stay open for the next task (settings.CELERY_DB_REUSE_MAX keeps Celery's
    Django fixup from closing them all). Not for a task run eagerly, inside its caller."""
    if sender is not None and getattr(sender.request, "is_eager", False):
        return
    from django.db import close_old_connections

    close_old_connections()


@app.on_after_finalize.connect
def schedule_cycle(sender: Celery, **kwargs) -> None:
    """Beat runs the scheduling cycle every CYCLE_INTERVAL_SECONDS."""
    from django.conf import settings

    sender.add_periodic_task(
        settings.CYCLE_INTERVAL_SECONDS, sender.signature("scheduler.tasks.cycle"), name="cycle"
    )


@app.on_after_finalize.connect
def schedule_history(sender: Celery, **kwargs) -> None:
    """Beat samples utilization history and rolls it up (dashboards/tasks.py)."""
    from dashboards.tasks import add_periodic_tasks

    add_periodic_tasks(sender)


@app.on_after_finalize.connect
def schedule_notifications(sender: Celery, **kwargs) -> None:
    """Beat dispatches notifications (notifications/tasks.py)."""
    from notifications.tasks import add_periodic_tasks

    add_periodic_tasks(sender)


@app.on_after_finalize.connect
def schedule_housekeeping(sender: Celery, **kwargs) -> None:
    """Beat clears expired sessions daily (portal/tasks.py)."""
    from portal.tasks import add_periodic_tasks

    add_periodic_tasks(sender)
