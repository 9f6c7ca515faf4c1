"""One call of `cycle_run()` is one scheduling cycle: housekeeping, then load a snapshot, ask
the engine for a plan and apply it, in one transaction, under one lock (a PostgreSQL advisory
lock; on SQLite the IMMEDIATE transaction is the database's write lock), so two workers never
run it at once.

The steps are separate functions so tests can run one step at a time:
`housekeeping.nodes_mark_lost`, `housekeeping.cancels_to_stop_orders`,
`snapshot.SnapshotCache.load` (the snapshot kept between cycles; `snapshot.cycle_snapshot`
reads it all), `apply.cycle_apply`. Two signals let a process watch the cycle:
`plan_applied` (after the plan is applied, before the commit) and `cycle_done` (at its end,
while the lock is still held).
"""

from __future__ import annotations

import logging
import time

from django.db import connection, transaction
from django.dispatch import Signal
from django.utils import timezone

from scheduler import engine
from scheduler.cycle import idle
from scheduler.cycle.apply import cycle_apply
from scheduler.cycle.housekeeping import cancels_to_stop_orders, nodes_mark_lost
from scheduler.cycle.result import CycleResult
from scheduler.cycle.snapshot import snapshot_cache
from scheduler.cycle.wake import notify_nodes
from scheduler.engine.collector import collector_paused

logger = logging.getLogger(__name__)

# pg_advisory_xact_lock key of the cycle ("gpucycle" as a number).
CYCLE_LOCK_KEY = 0x67707563796C65

# Sent with `result` (a CycleResult) once a plan is applied, before the transaction commits.
plan_applied = Signal()
# Sent with `result` and `locked_ns` (time.monotonic_ns() when the lock was taken) at the end of
# every cycle, skipped ones included, while the lock is still held.
cycle_done = Signal()


def cycle_run(*, force: bool = False, after_change: int | None = None) -> CycleResult:
    """Run one scheduling cycle. When nothing changed since the last cycle (same jobs, nodes,
    shares and held GPUs) it skips the engine: an idle cycle is a handful of small queries.
    `after_change`: the cycle was asked for by the change of that number (`idle.note_change`);
    when a committed cycle has seen it already, there is nothing to do (no query at all).
    `force` plans anyway."""
    result = CycleResult()
    if not force and after_change is not None and idle.covered(after_change):
        # The request that published this cycle may have marked it queued after the covering
        # cycle cleared the mark: clear it, or later requests would count on this cycle.
        idle.cycle_started()
        result.skipped = result.covered = True
        return result
    try:
        with collector_paused():
            return _cycle(force=force, result=result)
    except BaseException:
        # Whatever the kept snapshot took in, the transaction is gone: read everything next.
        snapshot_cache.forget()
        raise


def _cycle(*, force: bool, result: CycleResult) -> CycleResult:
    now = timezone.now()
    timed = result.timed
    with timed("total"), transaction.atomic():
        with timed("lock"):
            _lock()
        idle.cycle_started()
        locked_ns = time.monotonic_ns()
        with timed("nodes_lost"):
            nodes_mark_lost(now=now, result=result)
        with timed("cancels"):
            cancels_to_stop_orders(now=now, result=result)
        with timed("fingerprint"):
            # Read before the snapshot: a commit after this point (which the fingerprint taken
            # after applying the plan would already show, though the plan did not see it)
            # changes the count, so the next cycle plans instead of skipping.
            changes = idle.changes_seen()
            notifying = result.nodes_to_notify or result.orders_to_send
            if not force and not notifying and idle.unchanged(changes):
                result.skipped = True
                cycle_done.send(sender=cycle_run, result=result, locked_ns=locked_ns)
                return result
        with timed("snapshot"):
            snapshot, context = snapshot_cache.load()
        with timed("plan"):
            plan = engine.plan(snapshot)
        cycle_apply(plan, context, result=result)
        plan_applied.send(sender=cycle_run, result=result)
        with timed("fingerprint"):
            # Safe to remember before the commit: after a rollback the database is back in the
            # state this cycle read, whose fingerprint differs from the one remembered unless
            # this cycle changed nothing.
            idle.remember(changes, changed=result.changed, wake_at=plan.wake_at)
        nodes, orders = set(result.nodes_to_notify), dict(result.orders_to_send)
        transaction.on_commit(lambda: notify_nodes(nodes, orders=orders))
        transaction.on_commit(lambda: idle.cover(changes))
        cycle_done.send(sender=cycle_run, result=result, locked_ns=locked_ns)
    if result.placed or result.preempted or result.rejected or result.attempts_lost:
        ms = {step: seconds * 1000 for step, seconds in result.timings.items()}.get
        logger.info(
            "cycle: placed %d, preempted %d, rejected %d, lost %d attempts in %.0f ms "
            "(waiting for the cycle lock %.0f, snapshot %.0f, plan %.0f, stop orders %.0f, "
            "placements %.0f, waiting reasons %.0f)",
            result.placed,
            result.preempted,
            result.rejected,
            result.attempts_lost,
            ms("total", 0),
            ms("lock", 0),
            ms("snapshot", 0),
            ms("plan", 0),
            ms("apply_preemptions", 0),
            ms("apply_placements", 0) + ms("apply_rejections", 0),
            ms("apply_waiting", 0),
        )
    return result


def _lock() -> None:
    """Hold the cycle lock until the transaction ends."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [CYCLE_LOCK_KEY])
    # SQLite: settings open every transaction with BEGIN IMMEDIATE, which takes the database's
    # write lock at once, so this transaction already excludes every other cycle.
