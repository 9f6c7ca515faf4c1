"""Small builders so scenario tests read like the rule they check."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace

from scheduler.engine import Allocation, NodeView, PlacedJob, Plan, RunnableJob, ShareView, Snapshot
from scheduler.engine.snapshot import LEND, READY

H100 = "h100"


def nodes(count: int, gpus: int = 8, prefix: str = "n", state: str = READY) -> tuple[NodeView, ...]:
    return tuple(NodeView(f"{prefix}{i}", H100, gpus, state) for i in range(count))


def share(name: str, limit: int, strategy: str = LEND, **settings) -> ShareView:
    return ShareView(name, {H100: limit}, strategy, **settings)


def job(job_id: str, share_name: str, gpus: int, **fields) -> RunnableJob:
    return RunnableJob(job_id, share_name, H100, gpus, **fields)


def running(
    job_id: str,
    share_name: str,
    node: str,
    indices: range | tuple[int, ...],
    *,
    priority: int = 0,
    started: float = 0.0,
    submitted: float = 0.0,
    **fields,
) -> PlacedJob:
    indices = tuple(indices)
    return PlacedJob(
        job_id,
        share_name,
        H100,
        len(indices),
        priority,
        submitted,
        started,
        (Allocation(node, indices),),
        **fields,
    )


def where(outcome: Plan) -> dict[str, list[tuple[str, tuple[int, ...]]]]:
    """Placed job id → [(node, GPU indices)]."""
    return {p.job_id: [(a.node, a.gpu_indices) for a in p.allocations] for p in outcome.placements}


def victims(outcome: Plan) -> dict[str, str]:
    """Preempted job id → the job it is preempted for."""
    return {p.job_id: p.for_job_id for p in outcome.preemptions}


def advance(snapshot: Snapshot, outcome: Plan, now: float) -> Snapshot:
    """The next cycle's snapshot: placements run, victims are stopping for their job."""
    runnable = {j.id: j for j in snapshot.runnable}
    preempted = victims(outcome)
    placed = []
    for p in snapshot.placed:
        if p.id in preempted:
            p = replace(p, stopping=True, preempted_for=preempted[p.id])
        placed.append(p)
    for p in outcome.placements:
        j = runnable[p.job_id]
        placed.append(
            PlacedJob(
                j.id,
                j.share,
                j.gpu_type,
                j.gpus,
                j.priority,
                j.submitted,
                now,
                p.allocations,
                borrowed=p.borrowed,
                preemptible=j.preemptible,
            )
        )
    done = {p.job_id for p in outcome.placements} | {r.job_id for r in outcome.rejections}
    return replace(
        snapshot,
        placed=tuple(placed),
        runnable=tuple(j for j in snapshot.runnable if j.id not in done),
        held_gpus=None,
    )


def release_stopped(snapshot: Snapshot) -> Snapshot:
    """Stopping jobs have stopped: their GPUs are free and they are runnable again."""
    return replace(
        snapshot, placed=tuple(p for p in snapshot.placed if not p.stopping), held_gpus=None
    )


def requeue_stopped(
    snapshot: Snapshot,
    started: Collection[str] = frozenset(),
    only: Collection[str] | None = None,
    preempted_at: Mapping[str, tuple[float, ...]] = {},
) -> Snapshot:
    """Stopping jobs (or those of them in `only`) have stopped: their GPUs are free and they
    are runnable again, naming the job they were preempted for (as the cycle does) until that
    job has started. `started`: jobs placed since, whose victims' claims are spent.
    `preempted_at`: the victims' earlier preemptions; this one is at the snapshot's `now`."""
    stopped = [p for p in snapshot.placed if p.stopping and (only is None or p.id in only)]
    preemptions = dict(preempted_at)
    gone = {p.id for p in stopped}
    waiting = tuple(
        replace(j, preempted_for=None) if j.preempted_for in started else j
        for j in snapshot.runnable
    )
    requeued = tuple(
        RunnableJob(
            p.id,
            p.share,
            p.gpu_type,
            p.gpus,
            len(p.allocations),
            p.priority,
            p.submitted,
            preempted_for=p.preempted_for,
            preempted_at=(*preemptions.get(p.id, ()), snapshot.now or 0.0),
        )
        for p in stopped
    )
    return replace(
        snapshot,
        placed=tuple(p for p in snapshot.placed if p.id not in gone),
        runnable=waiting + requeued,
        held_gpus=None,
    )
