"""Celery tasks of the utilization history: thin, they call services."""

from celery import Celery, shared_task


@shared_task(name="dashboards.tasks.history_sample", ignore_result=True)
def history_sample() -> None:
    """Take a utilization sample (skipped when the last one is younger than the interval)."""
    from dashboards.services import history_sample as sample

    sample()


@shared_task(name="dashboards.tasks.history_rollup", ignore_result=True)
def history_rollup() -> None:
    """Roll samples up into minutes and hours, then prune by retention."""
    from dashboards.services import history_prune, history_rollup

    history_rollup()
    history_prune()


def add_periodic_tasks(app: Celery) -> None:
    """Beat samples every HISTORY_SAMPLE_SECONDS and rolls up every HISTORY_ROLLUP_SECONDS."""
    from django.conf import settings

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
