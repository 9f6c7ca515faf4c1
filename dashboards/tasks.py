"""Celery tasks of the utilization history: thin, they call services."""

from celery import Celery, shared_task
from django.conf import settings

from dashboards import services


@shared_task(name="dashboards.tasks.history_sample", ignore_result=True)
def history_sample() -> None:
    """Take a utilization sample (skipped when the last one is younger than the interval)."""
    services.history_sample()


@shared_task(name="dashboards.tasks.history_rollup", ignore_result=True)
def history_rollup() -> None:
    """Roll samples up into minutes and hours, then prune by retention."""
    services.history_rollup()
    services.history_prune()


def add_periodic_tasks(app: Celery) -> None:
    """Beat samples every HISTORY_SAMPLE_SECONDS and rolls up every HISTORY_ROLLUP_SECONDS."""
    app.add_periodic_task(
        settings.HISTORY_SAMPLE_SECONDS,
        app.signature("dashboards.tasks.history_sample"),
        name="history_sample",
    )
    app.add_periodic_task(
        settings.HISTORY_ROLLUP_SECONDS,
        app.signature("dashboards.tasks.history_rollup"),
        name="history_rollup",
    )
