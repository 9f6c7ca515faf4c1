"""Celery tasks: thin, they call services."""

import time

from celery import shared_task


@shared_task(name="scheduler.tasks.cycle", ignore_result=True)
def cycle() -> None:
    """One scheduling cycle (load snapshot → engine plan → apply), then the cycle's metrics and
    a history sample (which skips itself when the last one is recent)."""
    from dashboards.services import cycle_record, history_sample
    from scheduler.cycle import cycle_run

    start = time.perf_counter()
    try:
        cycle_run()
    except Exception:
        cycle_record(time.perf_counter() - start, False)
        raise
    cycle_record(time.perf_counter() - start, True)
    history_sample()
