"""The portal's safety invariants, checked against the database at any moment.

    from tests.reliability.invariants import check_invariants
    check_invariants()                        # anywhere, as often as you like
    check_invariants(accepted_job_ids=ids)    # and no job the client got a 2xx for is lost
    check_invariants(settled=True)            # and every job ended or is still queued

`check_invariants` raises AssertionError listing every violation found; it writes nothing, so
it may run while the web server, the worker and agents are busy (each check reads a consistent
enough view: the rules below hold between any two committed transactions).

Rules (DESIGN §2):
- every job is in exactly one known state, the one its last event moved it to; a placed job
  (SCHEDULED, STARTING, RUNNING, PREEMPTING) has exactly one open attempt, any other job none;
  an ended job has finished_at; `settled`: every job is final or still RUNNABLE;
- no GPU index of a node is held by two open attempts (by the assignment rows and, separately,
  by the attempts' own allocations), and every held index exists on its node;
- at every admission the share stayed within its borrow cap (attempt.borrowed_gpus ≤ cap; 0 for
  RESERVE and LEND); now, usage ≤ limit + cap, unless the share's settings changed since;
- borrowers use no RESERVE GPU: per GPU type, all borrowed GPUs ≤ free pool + what lenders can
  lend (`shares.selectors.share_usage`), while the capacity and the shares' settings are those
  the jobs were admitted under (no node draining or down holding GPUs, no share changed);
- every preemption is recorded: a PREEMPTED attempt names the job it made room for, the job
  counts it, and the job came back (RUNNABLE, a later attempt, or a final state);
- `accepted_job_ids`: each is in the database, and the database holds exactly that many jobs
  (pass every job the test submitted).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable

from django.db import connection, transaction
from django.db.models import Max

from scheduler.models import GpuAssignment, Job, JobAttempt, JobEvent, Node
from shares.models import QuotaShare, ShareChange
from shares.selectors import share_usage

__all__ = ["check_invariants", "violations"]

KNOWN_STATES = set(Job.State.values) - {Job.State.SUBMITTED}  # SUBMITTED never outlives a submit
SETTLED_STATES = {Job.State.RUNNABLE, *Job.FINAL_STATES}


def check_invariants(
    *, accepted_job_ids: Iterable[int] | None = None, settled: bool = False
) -> None:
    """Raise AssertionError naming every violated invariant; return None when all hold."""
    found = violations(accepted_job_ids=accepted_job_ids, settled=settled)
    if found:
        raise AssertionError(
            f"{len(found)} invariant violation(s):\n" + "\n".join(f"- {v}" for v in found)
        )


def violations(
    *, accepted_job_ids: Iterable[int] | None = None, settled: bool = False
) -> list[str]:
    """Every violated invariant, as a sentence; empty when all hold. Reads one snapshot of the
    database (one transaction; REPEATABLE READ on PostgreSQL), so that writers committing
    meanwhile cannot make it see half a change."""
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        return _violations(accepted_job_ids=accepted_job_ids, settled=settled)


def _violations(*, accepted_job_ids: Iterable[int] | None, settled: bool) -> list[str]:
    found: list[str] = []
    found += _job_states(settled=settled)
    found += _gpus_held_once()
    found += _borrow_caps()
    found += _lending()
    found += _preemptions()
    if accepted_job_ids is not None:
        found += _accepted(set(accepted_job_ids))
    return found


def _job_states(*, settled: bool) -> list[str]:
    found = []
    open_attempts = Counter(
        JobAttempt.objects.filter(ended_at__isnull=True).values_list("job_id", flat=True)
    )
    last_event = dict(
        JobEvent.objects.values("job_id").annotate(last=Max("pk")).values_list("job_id", "last")
    )
    event_state = dict(
        JobEvent.objects.filter(pk__in=last_event.values()).values_list("job_id", "to_state")
    )
    for pk, state, finished_at in Job.objects.values_list("pk", "state", "finished_at"):
        if state not in KNOWN_STATES:
            found.append(f"job {pk} is in state {state!r}")
        if event_state.get(pk) != state:
            found.append(f"job {pk} is {state} but its last event says {event_state.get(pk)}")
        wanted = 1 if state in Job.PLACED_STATES else 0
        if open_attempts[pk] != wanted:
            found.append(f"job {pk} is {state} with {open_attempts[pk]} open attempt(s)")
        if state in Job.FINAL_STATES and finished_at is None:
            found.append(f"job {pk} is {state} without finished_at")
        if settled and state not in SETTLED_STATES:
            found.append(f"job {pk} is still {state}: neither ended nor queued")
    return found


def _gpus_held_once() -> list[str]:
    found = []
    sizes = dict(Node.objects.values_list("pk", "gpus"))
    names = dict(Node.objects.values_list("name", "pk"))
    held = Counter()
    for node_id, index, attempt_id, ended_at in GpuAssignment.objects.filter(
        released=False
    ).values_list("node_id", "gpu_index", "attempt_id", "attempt__ended_at"):
        held[(node_id, index)] += 1
        if ended_at is not None:
            found.append(
                f"attempt {attempt_id} ended but still holds GPU {index} of node {node_id}"
            )
        if index >= sizes.get(node_id, 0):
            found.append(f"GPU index {index} held on node {node_id}, which has {sizes[node_id]}")
    for (node_id, index), count in held.items():
        if count > 1:
            found.append(f"GPU {index} of node {node_id} held by {count} attempts")
    # The same, from the attempts' own allocations (CUDA_VISIBLE_DEVICES), independent of the
    # assignment table and its unique index.
    by_allocation: dict[tuple[int | None, int], list[int]] = defaultdict(list)
    for attempt_id, allocations in JobAttempt.objects.filter(ended_at__isnull=True).values_list(
        "pk", "allocations"
    ):
        for allocation in allocations:
            for index in allocation["gpu_indices"]:
                by_allocation[(names.get(allocation["node"]), index)].append(attempt_id)
    for (node_id, index), attempts in by_allocation.items():
        if len(attempts) > 1:
            found.append(f"GPU {index} of node {node_id} allocated to open attempts {attempts}")
    return found


def _cap(share: QuotaShare, limit: int) -> int | None:
    """Extra GPUs the share may borrow above `limit`; None: no cap beyond the cluster."""
    if share.strategy != QuotaShare.Strategy.LEND_AND_BORROW:
        return 0
    if share.borrow_limit == -1:
        return None
    return limit * share.borrow_limit // 100


def _changed_since_created() -> set[int]:
    """Shares whose settings changed after they were created (creating a share records every
    field changed from '')."""
    return set(ShareChange.objects.exclude(old_value="").values_list("share_id", flat=True))


def _borrow_caps() -> list[str]:
    found = []
    changed = _changed_since_created()
    shares = {share.pk: share for share in QuotaShare.objects.prefetch_related("capacity_limits")}
    for attempt_id, job_id, share_id, gpu_type, gpus, borrowed in JobAttempt.objects.values_list(
        "pk", "job_id", "job__share_id", "job__gpu_type", "job__gpus", "borrowed_gpus"
    ):
        if borrowed > gpus:
            found.append(f"attempt {attempt_id} of job {job_id} borrows {borrowed} of {gpus} GPUs")
        if share_id in changed:
            continue  # admitted under settings this check no longer knows
        share = shares[share_id]
        cap = _cap(share, share.limits.get(gpu_type, 0))
        if cap is not None and borrowed > cap:
            found.append(
                f"attempt {attempt_id} of job {job_id} was admitted borrowing {borrowed} "
                f"{gpu_type} GPUs; share {share.name} may borrow {cap}"
            )
    usage = share_usage()
    for share in shares.values():
        if share.pk in changed:
            continue
        for gpu_type, row in usage.shares.get(share.name, {}).items():
            cap = _cap(share, row.limit)
            if cap is not None and row.used > row.limit + cap:
                found.append(
                    f"share {share.name} uses {row.used} {gpu_type} GPUs; its limit {row.limit} "
                    f"+ borrow cap {cap} allows {row.limit + cap}"
                )
    return found


def _lending() -> list[str]:
    if _changed_since_created():
        return []
    found = []
    not_ready_holding = set(
        GpuAssignment.objects.filter(released=False)
        .exclude(node__state=Node.State.READY)
        .values_list("node__gpu_type", flat=True)
    )
    usage = share_usage()
    for gpu_type, pool in usage.pool.items():
        if gpu_type in not_ready_holding:
            continue
        rows = [types[gpu_type] for types in usage.shares.values() if gpu_type in types]
        borrowed = sum(row.borrowed for row in rows)
        lent = sum(row.lent for row in rows)
        if borrowed > pool.borrowed_from_pool + lent:
            found.append(
                f"{gpu_type}: borrowers use {borrowed} GPUs, but only {pool.free_pool} are in "
                f"the free pool and {lent} lendable: a RESERVE (or unlendable) GPU is used"
            )
    return found


def _preemptions() -> list[str]:
    found = []
    jobs = {
        pk: (state, count)
        for pk, state, count in Job.objects.values_list("pk", "state", "preemption_count")
    }
    preempted: Counter[int] = Counter()
    last_number = dict(
        JobAttempt.objects.values("job_id").annotate(n=Max("number")).values_list("job_id", "n")
    )
    for attempt_id, job_id, number, preempted_for in JobAttempt.objects.filter(
        outcome=JobAttempt.Outcome.PREEMPTED
    ).values_list("pk", "job_id", "number", "preempted_for_id"):
        preempted[job_id] += 1
        if preempted_for is None:
            found.append(f"attempt {attempt_id} of job {job_id} PREEMPTED without preempted_for")
        state, _ = jobs[job_id]
        came_back = (
            number < last_number[job_id] or state == Job.State.RUNNABLE or state in Job.FINAL_STATES
        )
        if not came_back:
            found.append(f"job {job_id} was preempted (attempt {number}) and is stuck in {state}")
    for job_id, (_, count) in jobs.items():
        if count != preempted[job_id]:
            found.append(
                f"job {job_id} counts {count} preemption(s); {preempted[job_id]} attempt(s) "
                "ended PREEMPTED"
            )
    return found


def _accepted(accepted: set[int]) -> list[str]:
    found = []
    present = set(Job.objects.filter(pk__in=accepted).values_list("pk", flat=True))
    for job_id in sorted(accepted - present):
        found.append(f"job {job_id} was accepted (2xx) but is not in the database")
    total = Job.objects.count()
    if total != len(accepted):
        found.append(f"{len(accepted)} job(s) accepted, {total} in the database")
    return found
