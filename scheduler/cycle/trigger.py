"""How services ask for a scheduling cycle: `request_cycle()`, after their commit. Requests share
a cycle without waiting for one: while a cycle is queued and has not started reading, every
request is covered by it, so at most one cycle waits behind the running one. Only services ask
for a cycle."""

from __future__ import annotations

import logging

from django.db import transaction

from scheduler.cycle.idle import note_change
from scheduler.cycle.tasks import cycle

logger = logging.getLogger(__name__)


def request_cycle() -> None:
    """Ask for a scheduling cycle that starts after the current transaction commits: published
    at once unless a queued one will already see this commit; beat runs the cycle anyway every
    CYCLE_INTERVAL_SECONDS."""

    def enqueue() -> None:
        change = note_change()
        try:
            if change.publish:
                # It may find a cycle has already run since this change (see cycle_run).
                cycle.delay(after_change=change.number)
        except Exception:  # noqa: BLE001 — the broker being down must not fail a submit
            logger.warning("could not enqueue a cycle; beat will run it", exc_info=True)

    transaction.on_commit(enqueue)
