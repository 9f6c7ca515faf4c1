"""The Celery app: the worker runs the scheduling cycle; beat triggers it on a timer."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")

app = Celery("portal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
app.autodiscover_tasks(["scheduler.cycle"])  # the cycle's task


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
