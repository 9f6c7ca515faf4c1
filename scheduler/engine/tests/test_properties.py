"""Properties of §2 that hold for every cluster, share set and job stream, checked over several
cycles: placements start, victims stop for one cycle then return to the queue, jobs finish."""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.engine import (
    Allocation,
    PlacedJob,
    Plan,
    RunnableJob,
    ShareView,
    Snapshot,
    plan,
    planner,
    victims,
)
from scheduler.engine.snapshot import (
    DRAINING,
    FAIR,
    FIFO,
    LEND_AND_BORROW,
    READY,
    RECLAIM,
    RESERVE,
    STRATEGIES,
    NodeView,
)
from scheduler.engine.tests.helpers import H100, advance, requeue_stopped

WAITING_ON_RELEASE = ("reclaiming", "preempting", "waiting for")
# Preemptions of one job in a cluster where nothing finishes and nothing is submitted.
MAX_PREEMPTIONS_WHEN_SETTLED = 2


@st.composite
def clusters(draw) -> Snapshot:
    node_count = draw(st.integers(1, 4))
    nodes = tuple(
        NodeView(
            f"n{i}",
            H100,
            draw(st.sampled_from((4, 8))),
            draw(st.sampled_from((READY, READY, READY, DRAINING))),
        )
        for i in range(node_count)
    )
    shares = []
    for i in range(draw(st.integers(1, 4))):
        strategy = draw(st.sampled_from(STRATEGIES))
        limit = draw(st.integers(1, 12))
        shares.append(
            ShareView(
                f"s{i}",
                {H100: limit},
                strategy,
                borrow_limit=(
                    draw(st.sampled_from((-1, 0, 50, 100))) if strategy == LEND_AND_BORROW else -1
                ),
                lend_limit=draw(st.sampled_from((None, {H100: limit // 2}))),
                in_share_preemption=draw(st.booleans()),
                weight=draw(st.sampled_from((1.0, 2.0))),
                strict_fifo=draw(st.integers(0, 4)) == 0,
                min_runtime_seconds=draw(st.sampled_from((0, 0, 2, 50))),
            )
        )
    jobs = []
    for i in range(draw(st.integers(1, 12))):
        gpus, spread = draw(st.sampled_from(((1, 1), (2, 1), (4, 1), (8, 1), (8, 2))))
        jobs.append(
            RunnableJob(
                f"j{i}",
                f"s{draw(st.integers(0, len(shares) - 1))}",
                H100,
                gpus,
                spread,
                draw(st.integers(0, 3)),
                float(i),
                preemptible=draw(st.integers(0, 3)) > 0,
                # Earlier preemptions: some jobs are already held off borrowed GPUs.
                preempted_at=draw(st.sampled_from(((), (), (60.0, 70.0, 80.0), (5.0,)))),
            )
        )
    return Snapshot(
        nodes,
        tuple(shares),
        (),
        tuple(jobs),
        draw(st.sampled_from((FIFO, FAIR))),
        now=100.0,
        churn_preemptions=draw(st.sampled_from((0, 2, 3))),
        churn_window_seconds=draw(st.sampled_from((30.0, 3600.0))),
    )


# --- an independent recount of the quota rules -------------------------------------------------


def _usage(jobs) -> dict[str, int]:
    usage: dict[str, int] = defaultdict(int)
    for job in jobs:
        usage[job.share] += job.gpus
    return usage


def _borrowing_fits(snapshot: Snapshot, usage: dict[str, int]) -> bool:
    capacity = sum(n.gpus for n in snapshot.nodes if n.state == READY)
    free_pool = max(0, capacity - sum(s.capacity_limits[H100] for s in snapshot.shares))
    borrowed = lendable = 0
    for share in snapshot.shares:
        limit = share.capacity_limits[H100]
        borrowed += max(0, usage[share.name] - limit)
        if share.strategy != RESERVE:
            idle = max(0, limit - usage[share.name])
            if share.lend_limit is not None:
                idle = min(idle, share.lend_limit[H100])
            lendable += idle
    return borrowed <= free_pool + lendable


def _within_cap(share: ShareView, usage: int) -> bool:
    limit = share.capacity_limits[H100]
    if share.strategy != LEND_AND_BORROW:
        return usage <= limit
    return share.borrow_limit == -1 or usage - limit <= limit * share.borrow_limit // 100


def _free_gpus(snapshot: Snapshot) -> dict[str, int]:
    held: dict[str, int] = defaultdict(int)
    for job in snapshot.placed:
        for allocation in job.allocations:
            held[allocation.node] += len(allocation.gpu_indices)
    return {n.name: n.gpus - held[n.name] for n in snapshot.nodes if n.state == READY}


def check_plan(snapshot: Snapshot, outcome: Plan) -> None:
    shares = {s.name: s for s in snapshot.shares}
    nodes = {n.name: n for n in snapshot.nodes}
    runnable = {j.id: j for j in snapshot.runnable}
    placed = {p.id: p for p in snapshot.placed}

    # Every runnable job is placed, rejected or waiting, exactly once.
    decided = (
        [p.job_id for p in outcome.placements]
        + [r.job_id for r in outcome.rejections]
        + list(outcome.waiting)
    )
    assert sorted(decided) == sorted(runnable)

    # No node over-allocated, no GPU index given twice, gangs on distinct READY nodes.
    taken = {(a.node, i) for p in snapshot.placed for a in p.allocations for i in a.gpu_indices}
    for placement in outcome.placements:
        job = runnable[placement.job_id]
        assert len({a.node for a in placement.allocations}) == job.nodes
        for allocation in placement.allocations:
            node = nodes[allocation.node]
            assert node.state == READY
            assert len(allocation.gpu_indices) == job.gpus // job.nodes
            for index in allocation.gpu_indices:
                assert 0 <= index < node.gpus
                assert (node.name, index) not in taken
                taken.add((node.name, index))

    # Victims: running jobs, cross-share only from shares above their limit. The plan decides
    # first for jobs that victims stopped for, so their GPUs count, as do this plan's
    # placements: a share that goes above its limit that way lends no more.
    before = _usage(snapshot.placed)
    claimants = {p.preempted_for for p in snapshot.placed if p.stopping}
    claimants |= {j.preempted_for for j in snapshot.runnable}
    placed_now = {p.job_id for p in outcome.placements}
    for job in snapshot.runnable:
        if job.id in claimants or job.id in placed_now:
            before[job.share] += job.gpus
    now = snapshot.now if snapshot.now is not None else planner.latest_time(snapshot)
    for preemption in outcome.preemptions:
        victim = placed[preemption.job_id]
        assert not victim.stopping
        assert victim.preemptible, f"{victim.id} is not preemptible"
        minimum = shares[victim.share].min_runtime_seconds
        assert now - victim.started >= minimum, f"{victim.id} has not run its minimum runtime"
        for_job = runnable[preemption.for_job_id]
        if preemption.kind == RECLAIM:
            assert victim.share != for_job.share
            assert before[victim.share] > shares[victim.share].capacity_limits[H100]
        else:
            assert victim.share == for_job.share and victim.priority < for_job.priority

    # Admissions: total borrowed within free pool + lendable, each share within its cap.
    if outcome.placements:
        preempted = {p.job_id for p in outcome.preemptions}
        after = _usage(
            [p for p in snapshot.placed if not p.stopping and p.id not in preempted]
            + [runnable[p.job_id] for p in outcome.placements]
        )
        assert _borrowing_fits(snapshot, after)
        for placement in outcome.placements:
            share = shares[runnable[placement.job_id].share]
            assert _within_cap(share, after[share.name])
            # A job that is not preemptible never borrows, nor does a job held off.
            assert runnable[placement.job_id].preemptible or placement.borrowed == 0
            assert placement.borrowed == 0 or not _held_off(snapshot, runnable[placement.job_id])
    if outcome.wake_at is not None:
        assert outcome.wake_at > now

    # A job with victims already stopping for it triggers no new preemption.
    promised = {p.preempted_for for p in snapshot.placed if p.stopping and p.preempted_for}
    assert not promised & {p.for_job_id for p in outcome.preemptions}

    # Work-conserving: if some job fits its share's rules on free GPUs, something happens.
    if not outcome.placements and not outcome.preemptions:
        if any(r.startswith(WAITING_ON_RELEASE) for r in outcome.waiting.values()):
            return
        free = _free_gpus(snapshot)
        rejected = {r.job_id for r in outcome.rejections}
        for job in snapshot.runnable:
            share = shares.get(job.share)
            if job.id in rejected or share is None or share.strict_fifo:
                continue
            usage = dict(before)
            usage[job.share] = usage.get(job.share, 0) + job.gpus
            usage = defaultdict(int, usage)
            if (not job.preemptible or _held_off(snapshot, job)) and usage[
                job.share
            ] > share.capacity_limits[H100]:
                continue  # it would borrow: it waits for its share's own GPUs
            roomy = sum(1 for f in free.values() if f >= job.gpus // job.nodes)
            assert not (
                roomy >= job.nodes
                and _within_cap(share, usage[job.share])
                and _borrowing_fits(snapshot, usage)
            ), f"{job.id} fits but nothing was placed"


def _held_off(snapshot: Snapshot, job: RunnableJob) -> bool:
    """The churn breaker's rule, recounted."""
    now = snapshot.now if snapshot.now is not None else planner.latest_time(snapshot)
    recent = [at for at in job.preempted_at if now - snapshot.churn_window_seconds < at <= now]
    return 0 < snapshot.churn_preemptions <= len(recent)


def _minimal_search(original):
    """Wrap the victim search: every victim set it returns must be minimal."""

    def search(self, job, attempt, promised, base_deltas):
        chosen = original(self, job, attempt, promised, base_deltas)
        if chosen:
            for left_out in chosen:
                capacity = victims.NodeRoom(self.pool, job.gpus // job.nodes, promised)
                trial = self.ledger.trial(job.share, attempt != victims.TRY_OWN_SHARE)
                for name, delta in base_deltas.items():
                    trial.change(name, delta)
                for victim in chosen:
                    if victim is not left_out:
                        trial.change(victim.share, -victim.gpus)
                        for allocation in victim.allocations:
                            if allocation.node in self.pool.ready:
                                capacity.add(allocation.node, len(allocation.gpu_indices))
                assert not (capacity.nodes >= job.nodes and trial.reason() is None), (
                    f"{left_out.id} is not needed for {job.id}"
                )
        return chosen

    return search


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(cluster=clusters(), finishes=st.lists(st.booleans(), min_size=5, max_size=5))
def test_every_cycle_keeps_the_rules(cluster, finishes):
    """Over five cycles no GPU is double-booked, borrowing never exceeds what is lendable, caps
    hold, only borrowers are reclaimed, victim sets are minimal, the cluster does not idle while
    a job fits, and the same snapshot always gives the same plan."""
    original = planner._TypePlan._search
    planner._TypePlan._search = _minimal_search(original)
    try:
        snapshot = cluster
        history: dict[str, tuple[float, ...]] = {}
        for cycle, finish in enumerate(finishes):
            outcome = plan(snapshot)
            assert plan(snapshot) == outcome
            check_plan(snapshot, outcome)
            snapshot = next_cycle(snapshot, outcome, cycle, finish, history)
    finally:
        planner._TypePlan._search = original


def next_cycle(
    snapshot: Snapshot,
    outcome: Plan,
    cycle: int,
    finish: bool,
    history: dict[str, tuple[float, ...]],
) -> Snapshot:
    """Apply the plan; jobs that were stopping have stopped and are back in the queue, keeping
    their submission time and naming the job they were preempted for until it starts, and
    their preemptions (`history`, by job, kept up to date); with `finish`, the first running
    job ends. Each cycle runs 20 s after the last (minimum runtimes and windows pass)."""
    for job in snapshot.runnable:
        history.setdefault(job.id, job.preempted_at)
    stopped = {p.id for p in snapshot.placed if p.stopping}
    now = float(100 + 20 * cycle)
    snapshot = requeue_stopped(
        replace(advance(snapshot, outcome, now=now), now=now),
        started={p.job_id for p in outcome.placements},
        only=stopped,
        preempted_at=history,
    )
    snapshot = replace(snapshot, now=now + 20)
    for job in snapshot.runnable:
        history[job.id] = job.preempted_at
    if finish:
        running = [p for p in snapshot.placed if not p.stopping]
        if running:
            snapshot = replace(
                snapshot, placed=tuple(p for p in snapshot.placed if p is not running[0])
            )
    return snapshot


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(cluster=clusters())
def test_preemptions_settle_when_nothing_else_changes(cluster):
    """With no job finishing and none submitted, victims stop and return to the queue, and
    preemption dies out: no job is preempted twice for the same job, none more than twice,
    and the last cycles preempt nothing (no two jobs preempt each other forever)."""
    preempted: list[tuple[str, str]] = []
    cycles = 24
    quiet_from = cycles - 8
    history: dict[str, tuple[float, ...]] = {}
    for cycle in range(cycles):
        outcome = plan(cluster)
        assert cycle < quiet_from or outcome.preemptions == ()
        preempted.extend((p.job_id, p.for_job_id) for p in outcome.preemptions)
        cluster = next_cycle(cluster, outcome, cycle, finish=False, history=history)
    assert len(set(preempted)) == len(preempted)
    per_job = defaultdict(int)
    for victim, _ in preempted:
        per_job[victim] += 1
    assert max(per_job.values(), default=0) <= MAX_PREEMPTIONS_WHEN_SETTLED


def test_placed_job_builder_keeps_fields():
    """advance() turns a placement into a PlacedJob with the job's own fields."""
    snapshot = Snapshot(
        (NodeView("n0", H100, 8),),
        (ShareView("s", {H100: 8}, RESERVE),),
        runnable=(RunnableJob("j", "s", H100, 2, priority=3, submitted=7.0),),
    )
    after = advance(snapshot, plan(snapshot), now=9.0)
    assert after.placed == (PlacedJob("j", "s", H100, 2, 3, 7.0, 9.0, after.placed[0].allocations),)
    assert after.runnable == ()


@st.composite
def busy_clusters(draw) -> Snapshot:
    """A cluster with most GPUs held by many small jobs of many shares, and a queue of jobs of
    every size and priority: victim searches walk long lists of candidates here."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    nodes = tuple(NodeView(f"n{i}", H100, 8, READY) for i in range(draw(st.integers(4, 40))))
    share_count = draw(st.integers(2, 8))
    shares = tuple(
        ShareView(
            f"s{i}",
            {H100: max(1, len(nodes) * 8 * 9 // 10 // share_count)},
            rng.choice(STRATEGIES),
            borrow_limit=rng.choice((-1, 50, 100)),
            in_share_preemption=rng.random() < 0.6,
            weight=rng.choice((1.0, 2.0)),
        )
        for i in range(share_count)
    )
    placed = []
    for node in nodes:
        index = 0
        while index < 8 and rng.random() < 0.95:
            gpus = min(8 - index, rng.choice((1, 1, 1, 2, 4)))
            placed.append(
                PlacedJob(
                    f"p{len(placed)}",
                    rng.choice(shares).name,
                    H100,
                    gpus,
                    rng.choice((0, 0, 5, 10)),
                    float(rng.randrange(1000)),
                    float(rng.randrange(1000)),
                    (Allocation(node.name, tuple(range(index, index + gpus))),),
                    preemptible=rng.random() < 0.9,
                )
            )
            index += gpus
    runnable = tuple(
        RunnableJob(
            f"r{i}",
            rng.choice(shares).name,
            H100,
            *rng.choice(((1, 1), (2, 1), (4, 1), (8, 1), (16, 2))),
            rng.choice((0, 5, 10, 20)),
            float(1000 + i),
        )
        for i in range(draw(st.integers(1, 200)))
    )
    return Snapshot(nodes, shares, tuple(placed), runnable, rng.choice((FIFO, FAIR)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=busy_clusters())
def test_victim_search_shortcuts_choose_the_same_victims(cluster):
    """The victim search's shortcuts (stopping a walk that can never fit, taking the share's own
    jobs without walking other shares' ones first, pruning by bisection) give exactly the plan
    of walking and pruning every candidate one by one."""
    assert plan(cluster) == plan(cluster, exhaustive=True)
