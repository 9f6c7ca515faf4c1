"""Applying a plan with conditional updates: a job is placed only if it is still RUNNABLE and
not being cancelled, on nodes still READY, on GPUs nobody holds; a job is preempted only if it
still runs and is not already stopping. A stale plan therefore changes nothing it should not."""

from __future__ import annotations

from functools import cache

from django.db import connection
from django.db.models import F
from django.utils import timezone

from portal.db.bulk import json_insert
from portal.db.sql import ids_param, ids_sql, json_value, prepared_cursor
from scheduler import engine
from scheduler.cycle.orders import NewAttempt, new_run_orders, new_stop_orders
from scheduler.cycle.result import CycleResult
from scheduler.cycle.snapshot import SnapshotContext
from scheduler.cycle.unstarted import attempts_end_unstarted
from scheduler.models import GpuAssignment, Job, JobAttempt, Node, allocations_data
from scheduler.transitions import Transitions, jobs_set_reasons

SCHEDULED_REASON = "scheduled on {where}"
# The job row's reason while its agents pick it up; where it runs is in its attempt and event.
SCHEDULED_JOB_REASON = "scheduled: waiting for its node agent(s) to start it"


def _lock_jobs(
    ids: list[int],
    *,
    states: tuple[str, ...],
    cancel_requested: bool | None = None,
    with_orders: bool = False,
) -> dict[int, dict]:
    """Lock the jobs among `ids` that are still in one of `states` (and, when given, whose
    cancel_requested is that), the conditional part of every update below, and return their
    rows by id. Rows are locked in id order, in one statement. `with_orders`: each row also
    has what its run order needs of the job (`_ORDER_COLUMNS`, and its share's grace period as
    "grace_seconds"), read with the lock rather than queried again once placed."""
    if not ids:
        return {}
    params = [ids_param(ids), *states]
    if cancel_requested is not None:
        params.append(cancel_requested)
    names = ("pk", "state", "attempt_count", *(_ORDER_NAMES if with_orders else ()))
    with prepared_cursor() as cursor:
        cursor.execute(_lock_sql(len(states), cancel_requested is not None, with_orders), params)
        rows = {row[0]: dict(zip(names, row, strict=True)) for row in cursor.fetchall()}
    if with_orders:
        for row in rows.values():
            row["env"] = json_value(row["env"])
    return rows


# What a run order needs of its job (scheduler.cycle.orders.run_order), read by _lock_jobs.
_ORDER_COLUMNS = ("command", "env", "working_dir", "timeout_seconds", "nodes")
_ORDER_NAMES = (*_ORDER_COLUMNS, "grace_seconds")


@cache
def _lock_sql(states: int, cancel_condition: bool, with_orders: bool) -> str:
    """The jobs among the ids (the first parameter) in one of `states` states (the next
    parameters), with cancel_requested equal to the last parameter if `cancel_condition`;
    `with_orders`: with _ORDER_COLUMNS and their share's grace period."""
    quote = connection.ops.quote_name
    table = quote(Job._meta.db_table)
    columns = "id, state, attempt_count"
    if with_orders:
        share = Job._meta.get_field("share").related_model
        grace = (
            f"(SELECT s.grace_seconds FROM {quote(share._meta.db_table)} s "
            f"WHERE s.id = {table}.share_id)"
        )
        columns += ", " + ", ".join((*_ORDER_COLUMNS, grace))
    sql = (
        f"SELECT {columns} FROM {table} "
        f"WHERE {ids_sql('id')} AND state IN ({', '.join(['%s'] * states)})"
    )
    if cancel_condition:
        sql += " AND cancel_requested = %s"
    sql += " ORDER BY id"
    if connection.features.has_select_for_update:
        sql += " FOR UPDATE"
    return sql


def cycle_apply(plan: engine.Plan, context: SnapshotContext, *, result: CycleResult) -> None:
    """Apply a plan with conditional updates; entries that no longer hold are skipped."""
    with result.timed("apply_preemptions"):
        _apply_preemptions(plan.preemptions, result=result)
    with result.timed("apply_placements"):
        _apply_placements(plan.placements, context, result=result)
    with result.timed("apply_rejections"):
        _apply_rejections(plan.rejections, result=result)
    with result.timed("apply_waiting"):
        _apply_waiting(plan.waiting, context, result=result)


def _apply_preemptions(preemptions: tuple[engine.Preemption, ...], *, result: CycleResult) -> None:
    """Preempted jobs get a stop order: PREEMPTING, attempt.stop_requested_at, preempted_for.
    An attempt whose start no agent was granted yet ends at once (`attempts_end_unstarted`)."""
    if not preemptions:
        return
    by_job = {int(p.job_id): p for p in preemptions}
    running = (Job.State.SCHEDULED, Job.State.STARTING, Job.State.RUNNING)
    jobs = _lock_jobs(list(by_job), states=running, cancel_requested=False)
    attempts = list(
        JobAttempt.objects.filter(
            job_id__in=jobs, ended_at__isnull=True, stop_requested_at__isnull=True
        ).only("pk", "job_id", "started_at")
    )
    # The stop's time is taken under the jobs' locks, which an agent's start takes too
    # (scheduler.nodes.attempts.attempts_start): a stop of an attempt started in the meantime
    # is timed after its start, never before it.
    stopped_at = timezone.now()
    stopping_jobs = set()
    for attempt in attempts:
        attempt.stop_requested_at = stopped_at
        attempt.preempted_for_id = int(by_job[attempt.job_id].for_job_id)
        stopping_jobs.add(attempt.job_id)
    JobAttempt.objects.bulk_update(attempts, ["stop_requested_at", "preempted_for"], batch_size=500)
    for job_id in set(by_job) - stopping_jobs:
        result.stale.append(f"preempt {job_id}: no longer running")
    Transitions().move_rows(
        to_state=Job.State.PREEMPTING,
        changes=[
            (job_id, jobs[job_id]["state"], by_job[job_id].reason) for job_id in stopping_jobs
        ],
    ).save()
    result.preempted += len(stopping_jobs)
    unstarted = attempts_end_unstarted(
        attempts, outcome=JobAttempt.Outcome.PREEMPTED, now=stopped_at, result=result
    )
    result.ended_unstarted += len(unstarted)
    result.orders_given(new_stop_orders(a.pk for a in attempts if a.pk not in unstarted))


def _describe(allocations: tuple[engine.Allocation, ...]) -> str:
    return ", ".join(
        f"{a.node} (GPU {','.join(str(i) for i in a.gpu_indices)})" for a in allocations
    )


def _apply_placements(
    placements: tuple[engine.Placement, ...],
    context: SnapshotContext,
    *,
    result: CycleResult,
) -> None:
    """Placements become attempts with their GPU assignments; jobs go SCHEDULED."""
    if not placements:
        return
    jobs = _lock_jobs(
        [int(p.job_id) for p in placements],
        states=(Job.State.RUNNABLE,),
        cancel_requested=False,
        with_orders=True,
    )
    # Only the nodes the placements name: a busy cluster holds thousands of GPUs, and reading
    # them all took up to 0.4 s of a placing cycle at 2,000 nodes.
    names = sorted({a.node for placement in placements for a in placement.allocations})
    with prepared_cursor() as cursor:
        cursor.execute(_ready_nodes_sql(len(names)), [Node.State.READY, *names])
        ready = dict(cursor.fetchall())
        held = set()
        if ready:
            cursor.execute(_held_gpus_sql(len(ready)), [False, *ready.values()])
            held = set(cursor.fetchall())
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
            wanted.update([(node_id, index) for index in allocation.gpu_indices])
        if wanted is None or not held.isdisjoint(wanted):
            result.stale.append(f"place {placement.job_id}: node not ready or GPU held")
            continue
        held |= wanted
        accepted.append((placement, job))
    attempt_ids = dict(
        json_insert(
            JobAttempt,
            ("job_id", "number", "allocations", "borrowed_gpus"),
            [
                (
                    job["pk"],
                    job["attempt_count"] + 1,
                    allocations_data(p.allocations),
                    p.borrowed,
                )
                for p, job in accepted
            ],
            returning=("job_id", "id"),
        )
    )
    # The partial unique index gpu_held_by_one_attempt refuses a GPU that is still held.
    json_insert(
        GpuAssignment,
        ("attempt_id", "node_id", "gpu_index"),
        [
            (attempt_ids[job["pk"]], ready[a.node], index)
            for placement, job in accepted
            for a in placement.allocations
            for index in a.gpu_indices
        ],
    )
    result.orders_given(
        new_run_orders(
            NewAttempt(
                attempt_id=attempt_ids[job["pk"]],
                job_id=job["pk"],
                number=job["attempt_count"] + 1,
                command=job["command"],
                env=job["env"],
                working_dir=job["working_dir"],
                timeout_seconds=job["timeout_seconds"],
                grace_seconds=job["grace_seconds"],
                node_count=job["nodes"],
                gpus={ready[a.node]: a.gpu_indices for a in placement.allocations},
            )
            for placement, job in accepted
        )
    )
    Transitions().move_rows(
        to_state=Job.State.SCHEDULED,
        changes=[
            (job["pk"], job["state"], SCHEDULED_REASON.format(where=_describe(p.allocations)))
            for p, job in accepted
        ],
        job_reason=SCHEDULED_JOB_REASON,
        # The rows are locked: this is the attempt number given above.
        attempt_count=F("attempt_count") + 1,
    ).save()
    result.placed += len(accepted)


@cache
def _ready_nodes_sql(count: int) -> str:
    """(name, id) of the nodes in a state (the first parameter) among `count` names (the
    others)."""
    return (
        f"SELECT name, id FROM {connection.ops.quote_name(Node._meta.db_table)} "
        f"WHERE state = %s AND name IN ({', '.join(['%s'] * count)})"
    )


@cache
def _held_gpus_sql(count: int) -> str:
    """(node id, GPU index) of the GPUs held (released is the first parameter) on `count`
    nodes (their ids, the others)."""
    return (
        f"SELECT node_id, gpu_index FROM {connection.ops.quote_name(GpuAssignment._meta.db_table)}"
        f" WHERE released = %s AND node_id IN ({', '.join(['%s'] * count)})"
    )


def _apply_rejections(rejections: tuple[engine.Rejection, ...], *, result: CycleResult) -> None:
    """Jobs that could never run here end FAILED with the engine's reason."""
    if not rejections:
        return
    by_job = {int(r.job_id): r.reason for r in rejections}
    jobs = _lock_jobs(list(by_job), states=(Job.State.RUNNABLE,))
    Transitions().move_rows(
        to_state=Job.State.FAILED,
        changes=[(job_id, row["state"], by_job[job_id]) for job_id, row in jobs.items()],
    ).save()
    result.rejected += len(jobs)


def _apply_waiting(waiting, context: SnapshotContext, *, result: CycleResult) -> None:
    """Write why each job waits, only where it changed (an idle cycle writes nothing), in one
    statement. Not a state change, so no event; the update is conditional on the job still
    being RUNNABLE. A kept snapshot's reasons (`context.keeps_reasons`) are written without
    a record in the change feed and updated here: a job whose row changed meanwhile is in the
    feed anyway, and the next cycle reads it again; the feed's history names the jobs for the
    other worker processes' copies (`context.reasons_written`)."""
    reasons = context.reasons  # by the engine's ids, as `waiting`: no conversion per job
    changed = {job: reason for job, reason in waiting.items() if reasons.get(job) != reason}
    if not changed:
        return
    by_id = {int(job_id): reason for job_id, reason in changed.items()}
    quiet = context.keeps_reasons and connection.vendor == "postgresql"
    if quiet:
        _feed_quiet(True)
    try:
        jobs_set_reasons(by_id, state=Job.State.RUNNABLE)
    finally:
        if quiet:
            _feed_quiet(False)
    if quiet:
        context.reasons_written(by_id)
    reasons.update(changed)
    result.reasons_updated += len(changed)


def _feed_quiet(quiet: bool) -> None:
    """Whether this transaction's changes of job reasons go unrecorded in the change feed
    (PostgreSQL; the setting ends with the transaction anyway)."""
    with prepared_cursor() as cursor:
        cursor.execute(
            "SELECT set_config('portal.snapshot_quiet', %s, true)", ["on" if quiet else "off"]
        )
