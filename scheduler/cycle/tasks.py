"""The cycle's Celery task: thin, it calls the cycle and records its metrics."""

import logging
import time

from celery import shared_task

from dashboards.services import cycle_record, history_sample
from scheduler.cycle.estimates import estimates_refresh, estimates_wanted
from scheduler.cycle.run import cycle_run

logger = logging.getLogger(__name__)


# The name it has always had, so messages queued by an older portal still run.
@shared_task(name="scheduler.tasks.cycle", ignore_result=True)
def cycle(after_change: int | None = None) -> None:
    """One scheduling cycle (load snapshot → engine plan → apply), then the cycle's metrics and
    a history sample (which skips itself when the last one is recent). `after_change`: asked
    for by that change (see cycle_run); a cycle it finds already done is not counted."""
    start = time.perf_counter()
    try:
        result = cycle_run(after_change=after_change)
    except Exception:
        cycle_record(time.perf_counter() - start, False)
        raise
    if result.covered:
        return
    cycle_record(time.perf_counter() - start, True)
    if result.ended_unstarted:
        # Their GPUs were freed by the cycle itself: the next one gives them out.
        cycle.delay()
    history_sample()
    if estimates_wanted(planned=not result.skipped):
        try:
            # Not a countdown: a worker holds a task with an ETA unacknowledged until it is due,
            # and a broker restart meanwhile must not leave it with a message to restore.
            estimates.delay()
        except Exception:  # noqa: BLE001 — the broker being down must not fail a cycle
            logger.warning("could not queue an estimate refresh", exc_info=True)


@shared_task(name="scheduler.tasks.estimates", ignore_result=True)
def estimates() -> None:
    """Refresh the waiting jobs' estimated starts (queued after cycles, coalesced)."""
    estimates_refresh()
