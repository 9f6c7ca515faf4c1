"""Applying a plan with conditional updates: a job is placed only if it is still RUNNABLE and
not being cancelled, on nodes still READY, on GPUs nobody holds; a job is preempted only if it
still runs and is not already stopping. A stale plan therefore changes nothing it should not."""

from __future__ import annotations

from django.db.models import F
from django.utils import timezone

from portal.db.bulk import id_batches, rows_insert
from scheduler import engine
from scheduler.cycle.result import CycleResult
from scheduler.cycle.snapshot import SnapshotContext
from scheduler.models import GpuAssignment, Job, JobAttempt, Node
from scheduler.transitions import Transitions, jobs_set_reasons

SCHEDULED_REASON = "scheduled on {where}"
# The job row's reason while its agents pick it up; where it runs is in its attempt and event.
SCHEDULED_JOB_REASON = "scheduled: waiting for its node agent(s) to start it"


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


def _apply_rejections(rejections: tuple[engine.Rejection, ...], *, result: CycleResult) -> None:
    """Jobs that could never run here end FAILED with the engine's reason."""
    if not rejections:
        return
    by_job = {int(r.job_id): r.reason for r in rejections}
    jobs = _lock_jobs(list(by_job), state=Job.State.RUNNABLE)
    Transitions().move_rows(
        to_state=Job.State.FAILED,
        changes=[(job_id, row["state"], by_job[job_id]) for job_id, row in jobs.items()],
    ).save()
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
