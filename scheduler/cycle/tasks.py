"""The cycle's Celery task: thin, it calls the cycle and records its metrics."""

import time

from celery import shared_task

from dashboards.services import cycle_record, history_sample
from scheduler.cycle.run import cycle_run


# The name it has always had, so messages queued by an older portal still run.
@shared_task(name="scheduler.tasks.cycle", ignore_result=True)
def cycle() -> None:
    """One scheduling cycle (load snapshot → engine plan → apply), then the cycle's metrics and
    a history sample (which skips itself when the last one is recent)."""
    start = time.perf_counter()
    try:
        cycle_run()
    except Exception:
        cycle_record(time.perf_counter() - start, False)
        raise
    cycle_record(time.perf_counter() - start, True)
    history_sample()
