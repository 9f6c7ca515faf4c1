"""Celery tasks: thin, they call services."""

from celery import shared_task


@shared_task(name="scheduler.tasks.cycle", ignore_result=True)
def cycle() -> None:
    """One scheduling cycle (load snapshot → engine plan → apply)."""
    from scheduler.cycle import cycle_run

    cycle_run()
