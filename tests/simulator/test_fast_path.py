"""The simulator's fast path (cycles and jobs left out of the engine's snapshot when they could
decide nothing) gives the same result as a full snapshot at every instant."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.engine import plan
from scheduler.simulator import parse_scenario, simulate

STRATEGIES = ("RESERVE", "LEND", "LEND_AND_BORROW")


def random_scenario(seed: int, jobs: int, min_runtimes: bool = False) -> dict[str, Any]:
    """A small, busy cluster of two GPU types, shares of every kind, and a stream of jobs
    that queue up: some borrow, some reclaim, some preempt in their share, a few can never
    run or are rejected, and shares change along the way. `min_runtimes`: some shares' jobs
    are no victims before a minimum runtime, which some changes set too (drawn after the rest,
    so the same seed gives the same scenario otherwise)."""
    rng = random.Random(seed)
    h100_nodes, a100_nodes = rng.randint(2, 5), rng.randint(1, 3)
    capacity = {"h100": 8 * h100_nodes, "a100": 4 * a100_nodes}
    names = [f"s{i}" for i in range(rng.randint(2, 4))]
    shares = []
    for name in names:
        strategy = rng.choice(STRATEGIES)
        limits = {
            t: max(1, int(gpus * rng.uniform(0.2, 0.6)))
            for t, gpus in capacity.items()
            if rng.random() < 0.85 or t == "h100"
        }
        share: dict[str, Any] = {
            "name": name,
            "capacity_limits": limits,
            "strategy": strategy,
            "grace_seconds": rng.choice([0, 0, 30, 120]),
            "in_share_preemption": rng.random() < 0.5,
            "strict_fifo": rng.random() < 0.15,
            "weight": rng.choice([1, 1, 2, 0.5]),
        }
        if strategy == "LEND_AND_BORROW" and rng.random() < 0.4:
            share["borrow_limit"] = rng.choice([0, 50, 100, 200])
        if strategy != "RESERVE" and rng.random() < 0.3:
            share["lend_limit"] = {t: rng.randint(0, limit) for t, limit in limits.items()}
        shares.append(share)
    job_list = []
    for i in range(jobs):
        gpu_type = "h100" if rng.random() < 0.7 else "a100"
        gpus, nodes = rng.choice([(1, 1), (1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (16, 2)])
        job: dict[str, Any] = {
            "id": f"j{i}",
            "share": rng.choice(names),
            "gpu_type": gpu_type,
            "gpus": gpus,
            "nodes": nodes,
            "submit": rng.randrange(0, 6000, 10),
            "duration": rng.randrange(60, 4000),
            "priority": rng.choice([0, 0, 0, 5, 9]),
        }
        if rng.random() < 0.5:
            job["checkpoint_interval"] = rng.choice([60, 300])
        if rng.random() < 0.1:
            job["max_preemptions"] = rng.randint(0, 2)
        job_list.append(job)
    changes = []
    for _ in range(rng.randint(0, 3)):
        name = rng.choice(names)
        change = rng.choice(
            [
                {"in_share_preemption": rng.random() < 0.5},
                {"grace_seconds": rng.choice([0, 60])},
                {"state": rng.choice(["ENABLED", "DISABLED"])},
                {"capacity_limits": {"h100": rng.randint(1, capacity["h100"])}},
            ]
        )
        if "capacity_limits" in change:
            # A lend_limit above the new limit would be refused: drop it with the limits.
            change["lend_limit"] = None
        changes.append({"at": rng.randrange(0, 8000, 10), "share": name, "set": change})
    if min_runtimes:
        for share in shares:
            if rng.random() < 0.4:
                share["min_runtime_seconds"] = rng.choice([60, 300, 900])
        for _ in range(rng.randint(0, 2)):
            at, minimum = rng.randrange(0, 8000, 10), rng.choice([0, 120, 600])
            changes.append({"at": at, "share": rng.choice(names),
                            "set": {"min_runtime_seconds": minimum}})  # fmt: skip
    return {
        "borrow_order": "fair" if rng.random() < 0.25 else "fifo",
        "nodes": [
            {"name": "h", "gpu_type": "h100", "gpus": 8, "count": h100_nodes},
            {"name": "a", "gpu_type": "a100", "gpus": 4, "count": a100_nodes},
        ],
        "shares": shares,
        "jobs": job_list,
        "changes": changes,
    }


class CountingEngine:
    """The engine, counting the waiting jobs it is sent."""

    def __init__(self) -> None:
        self.jobs_sent = 0

    def __call__(self, snapshot):
        self.jobs_sent += len(snapshot.runnable)
        return plan(snapshot)


def assert_same_result(data: dict[str, Any]) -> tuple[int, int]:
    """Both modes give the same result JSON; returns the jobs each sent to the engine."""
    scenario = parse_scenario(data)
    fast_engine, full_engine = CountingEngine(), CountingEngine()
    fast = simulate(scenario, engine=fast_engine).data
    full = simulate(scenario, engine=full_engine, full_snapshots=True).data
    assert fast["events"] == full["events"]
    assert fast["jobs"] == full["jobs"]
    assert fast["shares"] == full["shares"]
    assert fast["cluster"] == full["cluster"]
    return fast_engine.jobs_sent, full_engine.jobs_sent


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), min_runtimes=st.booleans())
def test_fast_path_gives_the_result_of_full_snapshots(seed, min_runtimes):
    """Whatever the shares (minimum runtimes included), jobs and changes: the same starts,
    preemptions, finishes, failures and rejections at the same times, the same reasons for
    jobs left waiting, the same figures."""
    assert_same_result(random_scenario(seed, jobs=50, min_runtimes=min_runtimes))


def test_fast_path_on_a_long_busy_trace_sends_fewer_jobs():
    """Over hundreds of jobs queueing behind each other, the fast path sends the engine far
    fewer waiting jobs, for the same result."""
    data = random_scenario(20260, jobs=400)
    data["borrow_order"] = "fifo"
    fast_sent, full_sent = assert_same_result(data)
    assert fast_sent < full_sent / 2


def test_fast_path_plans_at_the_instants_of_full_snapshots():
    """Every end of a minimum runtime and of a churn hold is an instant in both modes, not only
    the earliest one a plan names (which depends on the jobs it was sent). Before, a wake the
    fast path's plan named at t=4740 (a full plan named an earlier one, after which that time
    no longer mattered) gave it an instant at 6690 that full snapshots did not have, and an
    in-share preemption came 60 s earlier than with full snapshots."""
    assert_same_result(random_scenario(5015, jobs=400))
