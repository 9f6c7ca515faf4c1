"""The scheduling cycle: load a snapshot, ask the engine for a plan, apply it.

One call of `cycle_run()` is one cycle, in one transaction, under one lock (a PostgreSQL
advisory lock; on SQLite the IMMEDIATE transaction is the database's write lock), so two
workers never run it at once. Applying a plan uses conditional updates: a job is placed only if
it is still RUNNABLE and not being cancelled, on nodes still READY, on GPUs nobody holds; a job
is preempted only if it still runs and is not already stopping. A stale plan therefore changes
nothing it should not.

The steps are separate functions so tests can run one step at a time:
`nodes_mark_lost`, `cancels_to_stop_orders`, `cycle_snapshot`, `cycle_apply`.

Two test-only hooks, off unless their settings are set (tests/reliability): a trace line per
cycle (CYCLE_TEST_TRACE_FILE) and a pause before the commit
(CYCLE_TEST_PAUSE_BEFORE_COMMIT_SECONDS).
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cache

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Expression, F, FloatField, Func, Max
from django.db.models.functions import Coalesce
from django.utils import timezone

from portal.sql import prepared_cursor
from scheduler import engine
from scheduler.bulk import id_batches, jobs_set_reasons, rows_insert
from scheduler.models import GpuAssignment, Job, JobAttempt, JobEvent, Node
from scheduler.notify import notify_nodes
from scheduler.services import jobs_transition
from shares.models import QuotaShare, ShareChange

logger = logging.getLogger(__name__)

# pg_advisory_xact_lock key of the cycle ("gpucycle" as a number).
CYCLE_LOCK_KEY = 0x67707563796C65
FINGERPRINT_KEY = "portal:cycle:fingerprint:{db}"
# Counts the commits that asked for a cycle (`note_change`): a cycle that saw the count change
# since the last one started does not skip, even if the data it reads looks the same.
CHANGES_KEY = "portal:cycle:changes:{db}"

SCHEDULED_REASON = "scheduled on {where}"
# The job row's reason while its agents pick it up; where it runs is in its attempt and event.
SCHEDULED_JOB_REASON = "scheduled: waiting for its node agent(s) to start it"
NODE_LOST_REASON = "node {node} lost (no heartbeat for {seconds:g} s); requeued"
NODE_LOST_CANCELLED = "node {node} lost while the job was being cancelled"
NODE_DOWN_ATTEMPT = "node {node} stopped sending heartbeats"
CANCELLED_NOT_RUNNING = "cancelled: the job was not running any more"


@dataclass
class CycleResult:
    """What one cycle did."""

    skipped: bool = False
    placed: int = 0
    preempted: int = 0
    rejected: int = 0
    stop_orders: int = 0
    nodes_lost: int = 0
    attempts_lost: int = 0
    reasons_updated: int = 0
    stale: list[str] = field(default_factory=list)  # plan entries refused at apply
    nodes_to_notify: set[int] = field(default_factory=set)
    # Seconds spent in each step, for the benchmark and for logs of slow cycles.
    timings: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def timed(self, step: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[step] = self.timings.get(step, 0.0) + time.perf_counter() - start


@dataclass
class SnapshotContext:
    """What applying a plan needs to know about the snapshot it came from."""

    reasons: dict[int, str]  # runnable job id → its reason when loaded
    node_ids: dict[str, int]  # node name → id


def cycle_run(*, force: bool = False) -> CycleResult:
    """Run one scheduling cycle. When nothing changed since the last cycle (same jobs, nodes,
    shares and held GPUs) it skips the engine: an idle cycle is a handful of small queries.
    `force` plans anyway."""
    result = CycleResult()
    now = timezone.now()
    timed = result.timed
    with timed("total"), transaction.atomic():
        with timed("lock"):
            _lock()
        locked_ns = time.monotonic_ns()
        with timed("nodes_lost"):
            nodes_mark_lost(now=now, result=result)
        with timed("cancels"):
            cancels_to_stop_orders(now=now, result=result)
        with timed("fingerprint"):
            # Read before the snapshot: a commit after this point (which the fingerprint taken
            # after applying the plan would already show, though the plan did not see it)
            # changes the count, so the next cycle plans instead of skipping.
            changes = _changes_seen()
            before = _fingerprint(changes)
            if not force and not result.nodes_to_notify and before == _last_fingerprint():
                result.skipped = True
                _test_trace("cycle", locked_ns, time.monotonic_ns())
                return result
        with timed("snapshot"):
            snapshot, context = cycle_snapshot()
        with timed("plan"):
            plan = engine.plan(snapshot)
        cycle_apply(plan, context, now=now, result=result)
        _test_pause(result)
        with timed("fingerprint"):
            # Safe to remember before the commit: after a rollback the database is back in the
            # state of `before`, which differs from `after` unless this cycle changed nothing.
            _remember_fingerprint(_fingerprint(changes))
        nodes = set(result.nodes_to_notify)
        transaction.on_commit(lambda: notify_nodes(nodes))
        _test_trace("cycle", locked_ns, time.monotonic_ns())
    if result.placed or result.preempted or result.rejected or result.attempts_lost:
        logger.info(
            "cycle: placed %d, preempted %d, rejected %d, lost %d attempts",
            result.placed,
            result.preempted,
            result.rejected,
            result.attempts_lost,
        )
    return result


def _test_trace(*fields: object) -> None:
    """Test-only (CYCLE_TEST_TRACE_FILE): append one line, in one write, while the cycle lock
    is still held."""
    path = settings.CYCLE_TEST_TRACE_FILE
    if not path:
        return
    line = " ".join(str(f) for f in (fields[0], os.getpid(), *fields[1:])) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _test_pause(result: CycleResult) -> None:
    """Test-only (CYCLE_TEST_PAUSE_BEFORE_COMMIT_SECONDS): a cycle that changed something
    sleeps before its commit, so a test can kill the worker in the middle of a cycle."""
    seconds = settings.CYCLE_TEST_PAUSE_BEFORE_COMMIT_SECONDS
    if seconds > 0 and (result.placed or result.preempted):
        _test_trace("paused", result.placed, result.preempted)
        time.sleep(seconds)


def _lock() -> None:
    """Hold the cycle lock until the transaction ends."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [CYCLE_LOCK_KEY])
    # SQLite: settings open every transaction with BEGIN IMMEDIATE, which takes the database's
    # write lock at once, so this transaction already excludes every other cycle.


# --- Nodes that stopped sending heartbeats --------------------------------------------------


def nodes_mark_lost(*, now: datetime, result: CycleResult) -> None:
    """Mark DOWN every node not heard from for NODE_HEARTBEAT_TIMEOUT_SECONDS; end its attempts
    as NODE_LOST, release their GPUs (on every node of a gang) and requeue their jobs."""
    timeout = settings.NODE_HEARTBEAT_TIMEOUT_SECONDS
    cutoff = now - timedelta(seconds=timeout)
    with prepared_cursor() as cursor:
        at = connection.ops.adapt_datetimefield_value(cutoff)
        cursor.execute(_silent_nodes_sql(), [Node.State.DOWN, at, at])
        lost = dict(cursor.fetchall())
    if not lost:
        return
    Node.objects.filter(pk__in=lost).update(state=Node.State.DOWN)
    result.nodes_lost += len(lost)
    attempt_nodes: dict[int, int] = {}
    for attempt_id, node_id in GpuAssignment.objects.filter(
        node_id__in=lost, released=False
    ).values_list("attempt_id", "node_id"):
        attempt_nodes.setdefault(attempt_id, node_id)
    if not attempt_nodes:
        return
    attempts = list(
        JobAttempt.objects.filter(pk__in=attempt_nodes, ended_at__isnull=True).values_list(
            "pk", "job_id"
        )
    )
    job_ids = [job_id for _, job_id in attempts]
    jobs = {
        row["pk"]: row
        for row in Job.objects.select_for_update()
        .filter(pk__in=job_ids, state__in=Job.PLACED_STATES)
        .values("pk", "state", "cancel_requested")
    }
    for peer in GpuAssignment.objects.filter(
        attempt_id__in=attempt_nodes, released=False
    ).values_list("node_id", flat=True):
        result.nodes_to_notify.add(peer)
    GpuAssignment.objects.filter(attempt_id__in=attempt_nodes, released=False).update(released=True)
    requeue, cancel = [], []
    for attempt_id, job_id in attempts:
        node = lost[attempt_nodes[attempt_id]]
        JobAttempt.objects.filter(pk=attempt_id, ended_at__isnull=True).update(
            ended_at=now,
            outcome=JobAttempt.Outcome.NODE_LOST,
            end_reason=NODE_DOWN_ATTEMPT.format(node=node),
        )
        job = jobs.get(job_id)
        if job is None:
            continue
        if job["cancel_requested"]:
            cancel.append((job_id, job["state"], NODE_LOST_CANCELLED.format(node=node)))
        else:
            reason = NODE_LOST_REASON.format(node=node, seconds=timeout)
            requeue.append((job_id, job["state"], reason))
    result.attempts_lost += len(attempts)
    jobs_transition(to_state=Job.State.RUNNABLE, changes=requeue)
    jobs_transition(to_state=Job.State.CANCELLED, changes=cancel)


@cache
def _silent_nodes_sql() -> str:
    """(id, name) of the nodes not DOWN (the first parameter) not heard from since a time (the
    other two), or never heard from and created before it."""
    return (
        f"SELECT id, name FROM {connection.ops.quote_name(Node._meta.db_table)} "
        "WHERE state <> %s AND (last_heartbeat < %s "
        "OR (last_heartbeat IS NULL AND created_at < %s))"
    )


# --- Cancels of placed jobs -----------------------------------------------------------------


def cancels_to_stop_orders(*, now: datetime, result: CycleResult) -> None:
    """A job cancelled while it held GPUs (PREEMPTING, cancel_requested) gets a stop order on
    its attempt; one with no attempt left ends CANCELLED."""
    with prepared_cursor() as cursor:
        cursor.execute(_cancelled_sql(), [Job.State.PREEMPTING, True])
        pending = dict(cursor.fetchall())
    if not pending:
        return
    open_attempts = dict(
        JobAttempt.objects.filter(job_id__in=pending, ended_at__isnull=True).values_list(
            "job_id", "pk"
        )
    )
    to_stop = [
        attempt_id
        for attempt_id in JobAttempt.objects.filter(
            pk__in=open_attempts.values(), stop_requested_at__isnull=True
        ).values_list("pk", flat=True)
    ]
    if to_stop:
        JobAttempt.objects.filter(pk__in=to_stop, stop_requested_at__isnull=True).update(
            stop_requested_at=now
        )
        result.stop_orders += len(to_stop)
        result.nodes_to_notify.update(
            GpuAssignment.objects.filter(attempt_id__in=to_stop, released=False).values_list(
                "node_id", flat=True
            )
        )
    orphans = [
        (job_id, state, CANCELLED_NOT_RUNNING)
        for job_id, state in pending.items()
        if job_id not in open_attempts
    ]
    jobs_transition(to_state=Job.State.CANCELLED, changes=orphans)


@cache
def _cancelled_sql() -> str:
    """(id, state) of the jobs in a state (the first parameter) being cancelled (the second)."""
    return (
        f"SELECT id, state FROM {connection.ops.quote_name(Job._meta.db_table)} "
        "WHERE state = %s AND cancel_requested = %s"
    )


# --- Snapshot -------------------------------------------------------------------------------


def _epoch(value: datetime | None) -> float:
    return value.timestamp() if value is not None else 0.0


class Epoch(Func):
    """A timestamp as seconds since the epoch, computed by PostgreSQL: the same float as
    `datetime.timestamp()` (both round the exact value), without parsing 20,000 timestamps in
    Python for a snapshot of a long queue."""

    template = "EXTRACT(EPOCH FROM %(expressions)s)::double precision"
    output_field = FloatField()


def _epoch_columns(*columns: str | Expression) -> tuple[list, Callable[[object], float]]:
    """Datetime columns (names or expressions) for values_list() that load as epoch seconds on
    PostgreSQL, and the conversion to epoch seconds their values still need."""
    if connection.vendor == "postgresql":
        return [Epoch(column) for column in columns], lambda value: value or 0.0
    return list(columns), _epoch


def cycle_snapshot() -> tuple[engine.Snapshot, SnapshotContext]:
    """Load what the engine needs: nodes, shares, placed jobs (open attempts) and runnable jobs,
    as tuples of the needed columns (no model instances but the few shares)."""
    nodes = list(Node.objects.values_list("pk", "name", "gpu_type", "gpus", "state"))
    node_views = tuple(
        engine.NodeView(name=name, gpu_type=gpu_type, gpus=gpus, state=state)
        for _, name, gpu_type, gpus, state in nodes
    )
    share_views = []
    share_names: dict[int, str] = {}
    for share in QuotaShare.objects.prefetch_related("capacity_limits"):
        share_names[share.pk] = share.name
        share_views.append(share.engine_view())
    (submitted_column, started_column), to_epoch = _epoch_columns(
        "job__submitted_at", Coalesce("started_at", "scheduled_at")
    )
    placed = []
    attempts = JobAttempt.objects.filter(
        ended_at__isnull=True, job__state__in=Job.PLACED_STATES
    ).values_list(
        "job_id",
        "job__share_id",
        "job__gpu_type",
        "job__gpus",
        "job__priority",
        submitted_column,
        "job__state",
        started_column,
        "stop_requested_at",
        "preempted_for_id",
        "allocations",
        "borrowed_gpus",
    )
    for (
        job_id,
        share_id,
        gpu_type,
        gpus,
        priority,
        submitted,
        state,
        started,
        stop_requested_at,
        preempted_for,
        allocations,
        borrowed,
    ) in attempts:
        placed.append(
            engine.PlacedJob(
                id=str(job_id),
                share=share_names[share_id],
                gpu_type=gpu_type,
                gpus=gpus,
                priority=priority,
                submitted=to_epoch(submitted),
                started=to_epoch(started),
                allocations=tuple(
                    engine.Allocation(node=a["node"], gpu_indices=tuple(a["gpu_indices"]))
                    for a in allocations
                ),
                stopping=stop_requested_at is not None or state == Job.State.PREEMPTING,
                preempted_for=str(preempted_for) if preempted_for else None,
                # Victim ties: jobs on borrowed GPUs go before jobs on their own quota.
                borrowed=borrowed,
            )
        )
    (submitted_column,), to_epoch = _epoch_columns("submitted_at")
    claims = _reclaim_claims()
    runnable = []
    reasons = {}
    # The index job_state_gpu_type serves WHERE state = 'RUNNABLE'.
    for job_id, share_id, gpu_type, gpus, nodes_wanted, priority, submitted, reason in (
        Job.objects.filter(state=Job.State.RUNNABLE)
        .order_by()
        .values_list(
            "pk", "share_id", "gpu_type", "gpus", "nodes", "priority", submitted_column, "reason"
        )
    ):
        reasons[job_id] = reason
        runnable.append(
            engine.RunnableJob(
                id=str(job_id),
                share=share_names[share_id],
                gpu_type=gpu_type,
                gpus=gpus,
                nodes=nodes_wanted,
                priority=priority,
                submitted=to_epoch(submitted),
                preempted_for=claims.get(job_id),
            )
        )
    snapshot = engine.Snapshot(
        nodes=node_views,
        shares=tuple(share_views),
        placed=tuple(placed),
        runnable=tuple(runnable),
        borrow_order=settings.BORROW_ORDER,
    )
    context = SnapshotContext(reasons=reasons, node_ids={name: pk for pk, name, *_ in nodes})
    return snapshot, context


def _reclaim_claims() -> dict[int, str]:
    """{requeued victim: the job it was last preempted for}, while that job has not been placed
    since: the engine lets the claimant start on the freed GPUs before its victims return
    (without it, within-limit victims retake them and the same preemption repeats forever)."""
    victims = list(
        JobAttempt.objects.filter(
            job__state=Job.State.RUNNABLE,
            outcome=JobAttempt.Outcome.PREEMPTED,
            preempted_for__isnull=False,
            number=F("job__attempt_count"),  # the victim's latest attempt
        ).values_list("job_id", "preempted_for_id", "ended_at")
    )
    if not victims:
        return {}
    last_placed = dict(
        JobAttempt.objects.filter(job_id__in={claimant for _, claimant, _ in victims})
        .values("job_id")
        .annotate(latest=Max("scheduled_at"))
        .values_list("job_id", "latest")
        .order_by()
    )
    return {
        victim: str(claimant)
        for victim, claimant, ended_at in victims
        if last_placed.get(claimant) is None or last_placed[claimant] < ended_at
    }


# --- Applying a plan ------------------------------------------------------------------------


def _lock_jobs(ids: list[int], **conditions) -> dict[int, dict]:
    """Lock the jobs among `ids` that still meet `conditions` (the conditional part of every
    update below) and return their rows by id. Rows are locked in id order."""
    rows: dict[int, dict] = {}
    for batch in id_batches(sorted(ids)):
        for row in (
            Job.objects.select_for_update()
            .filter(pk__in=batch, **conditions)
            .order_by("pk")
            .values("pk", "state", "attempt_count")
        ):
            rows[row["pk"]] = row
    return rows


def cycle_apply(
    plan: engine.Plan, context: SnapshotContext, *, now: datetime, result: CycleResult
) -> None:
    """Apply a plan with conditional updates; entries that no longer hold are skipped."""
    with result.timed("apply_preemptions"):
        _apply_preemptions(plan.preemptions, now=now, result=result)
    with result.timed("apply_placements"):
        _apply_placements(plan.placements, context, now=now, result=result)
    with result.timed("apply_rejections"):
        _apply_rejections(plan.rejections, result=result)
    with result.timed("apply_waiting"):
        _apply_waiting(plan.waiting, context, result=result)


def _apply_preemptions(
    preemptions: tuple[engine.Preemption, ...], *, now: datetime, result: CycleResult
) -> None:
    """Preempted jobs get a stop order: PREEMPTING, attempt.stop_requested_at, preempted_for."""
    if not preemptions:
        return
    by_job = {int(p.job_id): p for p in preemptions}
    running = (Job.State.SCHEDULED, Job.State.STARTING, Job.State.RUNNING)
    jobs = _lock_jobs(list(by_job), state__in=running, cancel_requested=False)
    attempts = list(
        JobAttempt.objects.filter(
            job_id__in=jobs, ended_at__isnull=True, stop_requested_at__isnull=True
        ).only("pk", "job_id")
    )
    stopping_jobs = set()
    for attempt in attempts:
        attempt.stop_requested_at = now
        attempt.preempted_for_id = int(by_job[attempt.job_id].for_job_id)
        stopping_jobs.add(attempt.job_id)
    JobAttempt.objects.bulk_update(attempts, ["stop_requested_at", "preempted_for"], batch_size=500)
    for job_id in set(by_job) - stopping_jobs:
        result.stale.append(f"preempt {job_id}: no longer running")
    jobs_transition(
        to_state=Job.State.PREEMPTING,
        changes=[
            (job_id, jobs[job_id]["state"], by_job[job_id].reason) for job_id in stopping_jobs
        ],
    )
    result.preempted += len(stopping_jobs)
    result.nodes_to_notify.update(
        GpuAssignment.objects.filter(
            attempt_id__in=[a.pk for a in attempts], released=False
        ).values_list("node_id", flat=True)
    )


def _describe(allocations: tuple[engine.Allocation, ...]) -> str:
    return ", ".join(
        f"{a.node} (GPU {','.join(str(i) for i in a.gpu_indices)})" for a in allocations
    )


def _apply_placements(
    placements: tuple[engine.Placement, ...],
    context: SnapshotContext,
    *,
    now: datetime,
    result: CycleResult,
) -> None:
    """Placements become attempts with their GPU assignments; jobs go SCHEDULED."""
    if not placements:
        return
    jobs = _lock_jobs(
        [int(p.job_id) for p in placements], state=Job.State.RUNNABLE, cancel_requested=False
    )
    names = {a.node for p in placements for a in p.allocations}
    ready = dict(
        Node.objects.filter(name__in=names, state=Node.State.READY).values_list("name", "pk")
    )
    held = set(
        GpuAssignment.objects.filter(node_id__in=ready.values(), released=False).values_list(
            "node_id", "gpu_index"
        )
    )
    accepted: list[tuple[engine.Placement, dict]] = []
    for placement in placements:
        job = jobs.get(int(placement.job_id))
        if job is None:
            result.stale.append(f"place {placement.job_id}: no longer runnable")
            continue
        wanted = set()
        for allocation in placement.allocations:
            node_id = ready.get(allocation.node)
            if node_id is None:
                wanted = None
                break
            wanted.update((node_id, index) for index in allocation.gpu_indices)
        if wanted is None or wanted & held:
            result.stale.append(f"place {placement.job_id}: node not ready or GPU held")
            continue
        held |= wanted
        accepted.append((placement, job))
    attempt_ids = dict(
        rows_insert(
            JobAttempt,
            ("job_id", "number", "allocations", "borrowed_gpus"),
            [
                (
                    job["pk"],
                    job["attempt_count"] + 1,
                    [{"node": a.node, "gpu_indices": list(a.gpu_indices)} for a in p.allocations],
                    p.borrowed,
                )
                for p, job in accepted
            ],
            returning=("job_id", "id"),
        )
    )
    # The partial unique index gpu_held_by_one_attempt refuses a GPU that is still held.
    rows_insert(
        GpuAssignment,
        ("attempt_id", "node_id", "gpu_index"),
        [
            (attempt_ids[job["pk"]], ready[a.node], index)
            for placement, job in accepted
            for a in placement.allocations
            for index in a.gpu_indices
        ],
    )
    for placement, _job in accepted:
        result.nodes_to_notify.update(ready[a.node] for a in placement.allocations)
    jobs_transition(
        to_state=Job.State.SCHEDULED,
        changes=[
            (job["pk"], job["state"], SCHEDULED_REASON.format(where=_describe(p.allocations)))
            for p, job in accepted
        ],
        job_reason=SCHEDULED_JOB_REASON,
        # The rows are locked: this is the attempt number given above.
        attempt_count=F("attempt_count") + 1,
    )
    result.placed += len(accepted)


def _apply_rejections(rejections: tuple[engine.Rejection, ...], *, result: CycleResult) -> None:
    """Jobs that could never run here end FAILED with the engine's reason."""
    if not rejections:
        return
    by_job = {int(r.job_id): r.reason for r in rejections}
    jobs = _lock_jobs(list(by_job), state=Job.State.RUNNABLE)
    jobs_transition(
        to_state=Job.State.FAILED,
        changes=[(job_id, row["state"], by_job[job_id]) for job_id, row in jobs.items()],
    )
    result.rejected += len(jobs)


def _apply_waiting(waiting, context: SnapshotContext, *, result: CycleResult) -> None:
    """Write why each job waits, only where it changed (an idle cycle writes nothing). Not a
    state change, so no event; the update is conditional on the job still being RUNNABLE."""
    changed = {
        int(job_id): reason
        for job_id, reason in waiting.items()
        if context.reasons.get(int(job_id)) != reason
    }
    jobs_set_reasons(changed, state=Job.State.RUNNABLE)
    result.reasons_updated += len(changed)


# --- Idle cycles ----------------------------------------------------------------------------


# The jobs a plan depends on: those waiting and those holding GPUs.
_ACTIVE_STATES = (Job.State.RUNNABLE, *Job.PLACED_STATES)


def _fingerprint(changes: int | None) -> str:
    """A digest of everything the plan depends on, and of the count of commits that asked for
    a cycle. Equal digests: the plan would be the same."""
    with prepared_cursor() as cursor:
        cursor.execute(_fingerprint_sql(), [*_ACTIVE_STATES, False])
        totals = cursor.fetchone()
        cursor.execute(_fingerprint_nodes_sql())
        nodes = cursor.fetchall()
    text = repr((totals, nodes, changes, settings.BORROW_ORDER))
    return hashlib.sha256(text.encode()).hexdigest()


@cache
def _fingerprint_sql() -> str:
    """One row: active jobs (count, last update, priorities), GPUs held (count, last id), open
    attempts (count, stopping), shares (count, last update), last share change, last job
    event. Every table's part is served by an index or a small table."""
    table = {
        model: connection.ops.quote_name(model._meta.db_table)
        for model in (Job, GpuAssignment, JobAttempt, QuotaShare, ShareChange, JobEvent)
    }
    states = ", ".join(["%s"] * len(_ACTIVE_STATES))
    return (
        "SELECT * FROM "
        f"(SELECT COUNT(id), MAX(updated_at), SUM(priority) FROM {table[Job]} "
        f"WHERE state IN ({states})) AS jobs, "
        f"(SELECT COUNT(id), MAX(id) FROM {table[GpuAssignment]} WHERE released = %s) AS held, "
        f"(SELECT COUNT(id), COUNT(stop_requested_at) FROM {table[JobAttempt]} "
        "WHERE ended_at IS NULL) AS attempts, "
        f"(SELECT COUNT(id), MAX(updated_at) FROM {table[QuotaShare]}) AS shares, "
        f"(SELECT MAX(id) FROM {table[ShareChange]}) AS share_changes, "
        f"(SELECT MAX(id) FROM {table[JobEvent]}) AS events"
    )


@cache
def _fingerprint_nodes_sql() -> str:
    return (
        f"SELECT id, state, gpus, gpu_type FROM {connection.ops.quote_name(Node._meta.db_table)} "
        "ORDER BY id"
    )


def note_change() -> None:
    """After a commit that asks for a cycle: count it (see CHANGES_KEY)."""
    from scheduler.notify import redis_client

    try:
        redis_client().incr(CHANGES_KEY.format(db=connection.settings_dict["NAME"]))
    except Exception:  # noqa: BLE001 — without Redis nothing is skipped (no fingerprint kept)
        logger.warning("could not count a change for the cycle", exc_info=True)


def _changes_seen() -> int | None:
    from scheduler.notify import redis_client

    try:
        value = redis_client().get(CHANGES_KEY.format(db=connection.settings_dict["NAME"]))
    except Exception:  # noqa: BLE001
        return None
    return int(value) if value else 0


def _fingerprint_key() -> str:
    return FINGERPRINT_KEY.format(db=connection.settings_dict["NAME"])


def _last_fingerprint() -> str | None:
    from scheduler.notify import redis_client

    try:
        value = redis_client().get(_fingerprint_key())
    except Exception:  # noqa: BLE001 — without Redis every cycle is a full one
        return None
    return value.decode() if value else None


def _remember_fingerprint(value: str) -> None:
    from scheduler.notify import redis_client

    try:
        redis_client().set(
            _fingerprint_key(), value, ex=max(1, int(settings.CYCLE_FULL_EVERY_SECONDS))
        )
    except Exception:  # noqa: BLE001
        logger.warning("could not store the cycle fingerprint", exc_info=True)
