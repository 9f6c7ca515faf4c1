"""When will each waiting job start? The engine replayed forward from now on the simulator's clock.

`estimate_starts(snapshot, ...)` takes what a cycle plans from (the nodes, the shares, the placed
jobs and the queue, with the snapshot's `now`), how long each job is expected to run, and
replays the same engine forward: the placed jobs end when expected (a stopping one when its
grace period is over), the queue goes in its real order, reclaims, minimum runtimes and churn
holds apply as they would live. Nothing new is submitted: an estimate assumes no new arrival,
and whoever shows it says so. Pure, like the engine: no Django.

The replay is bounded: it stops at `horizon` seconds from now, and a job not started by then
has no estimate (it starts later than that, if at all). It is coarser the further ahead it is
(`RESOLUTION`), so that it sees further within a time budget.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

from scheduler.engine.collector import collector_paused
from scheduler.engine.snapshot import Allocation, PlacedJob, Snapshot
from scheduler.simulator.clock import Simulation
from scheduler.simulator.scenario import JobSpec, Scenario

# A placed job past its expected time is assumed to end this soon.
OVERDUE_SECONDS = 60.0
# The instants within this part of the time ahead share one cycle (`Simulation.resolution`):
# the replay is exact for what happens alone, and sees further ahead within its time budget.
RESOLUTION = 0.1


@dataclass(frozen=True)
class Estimates:
    """The estimated starts by job id, and how far ahead the replay got (seconds from now; the
    horizon, or less when its time budget ran out): a job without an estimate starts later
    than that."""

    starts: dict[str, Estimate]
    replayed: float


@dataclass(frozen=True)
class Estimate:
    """A waiting job's estimated start, in seconds from the snapshot's `now`, and the GPUs it
    would start on."""

    start: float
    allocations: tuple[Allocation, ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(allocation.node for allocation in self.allocations)


def estimate_starts(
    snapshot: Snapshot,
    *,
    expected: Mapping[str, float],
    remaining: Mapping[str, float],
    horizon: float,
    budget: float | None = None,
    resolution: float = RESOLUTION,
) -> Estimates:
    """The estimated start of every runnable job of `snapshot` that would start within
    `horizon` seconds, replayed within `budget` seconds of this process's time (None: no
    limit). `expected`: each runnable job's expected run time (seconds), and each stopping
    job's, for when it runs again; `remaining`: each placed job's expected time left (a
    stopping job: what is left of its grace period). `resolution`: what happens within that
    part of the time ahead shares one cycle (0: a cycle at every instant)."""
    with collector_paused():
        return _estimate_starts(snapshot, expected, remaining, horizon, budget, resolution)


def _estimate_starts(
    snapshot: Snapshot,
    expected: Mapping[str, float],
    remaining: Mapping[str, float],
    horizon: float,
    budget: float | None,
    resolution: float,
) -> Estimates:
    deadline = None if budget is None else time.perf_counter() + budget
    if snapshot.now is None:
        raise ValueError("an estimate needs the snapshot's time (Snapshot.now)")
    if not snapshot.runnable:
        return Estimates({}, horizon)
    now = snapshot.now
    # The queue in its order of submission: on the simulated clock every job is submitted at 0,
    # so among equal priorities the engine keeps this order (its last tie break, the place in
    # the snapshot), which is the order of the real submission times.
    queue = sorted(enumerate(snapshot.runnable), key=lambda entry: (entry[1].submitted, entry[0]))
    specs = tuple(
        JobSpec(
            id=job.id,
            share=job.share,
            gpu_type=job.gpu_type,
            gpus=job.gpus,
            submit=0.0,
            duration=max(1.0, expected[job.id]),
            priority=job.priority,
            nodes=job.nodes,
            preemptible=job.preemptible,
        )
        for _, job in queue
    )
    scenario = Scenario(
        nodes=snapshot.nodes,
        shares=snapshot.shares,
        jobs=specs,
        borrow_order=snapshot.borrow_order,
        churn_preemptions=snapshot.churn_preemptions,
        churn_window_seconds=snapshot.churn_window_seconds,
    )
    simulation = Simulation(scenario, resolution=resolution)
    simulation.first_starts = first = {}
    for _, job in queue:
        if job.preempted_at:
            simulation.preempted_before(job.id, tuple(at - now for at in job.preempted_at))
    for placed in _held(snapshot):
        if placed.stopping:
            left = max(0.0, remaining[placed.id])
            work = expected.get(placed.id, left)
        else:
            left = work = max(OVERDUE_SECONDS, remaining[placed.id])
        view = _shifted(placed, now)
        simulation.seed_placed(view, _spec(view, work), left)
    simulation.run(until=horizon, deadline=deadline)
    # The placed jobs seeded above had started: only the waiting jobs' first starts are here.
    estimates = {job_id: Estimate(at, on) for job_id, (at, on) in first.items()}
    return Estimates(estimates, min(horizon, simulation.replayed))


def _held(snapshot: Snapshot) -> list[PlacedJob]:
    """The placed jobs, each once. The cycle's snapshot reads the placed jobs, then the queue,
    not in one transaction: a job whose attempt ended in between is read both ways, and waits
    (the later read; its GPUs were released with the end). Of a job read with two attempts,
    the later one (the snapshot lists them by attempt)."""
    waiting = {job.id for job in snapshot.runnable}
    held = {placed.id: placed for placed in snapshot.placed if placed.id not in waiting}
    return list(held.values())


def _shifted(placed: PlacedJob, now: float) -> PlacedJob:
    """The placed job with its times on the simulated clock (now is 0)."""
    return replace(
        placed,
        started=placed.started - now,
        submitted=placed.submitted - now,
        checkpointed=None if placed.checkpointed is None else placed.checkpointed - now,
    )


def _spec(placed: PlacedJob, work: float) -> JobSpec:
    return JobSpec(
        id=placed.id,
        share=placed.share,
        gpu_type=placed.gpu_type,
        gpus=placed.gpus,
        submit=placed.submitted,
        duration=max(1.0, work),
        priority=placed.priority,
        nodes=len(placed.allocations),
        preemptible=placed.preemptible,
    )
