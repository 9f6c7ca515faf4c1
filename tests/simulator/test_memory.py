"""A replay's working memory is freed when it returns, as a plan's is: the simulator, like the
engine, runs with Python's cycle collector off (scheduler/engine/collector.py), so anything it
left in a reference cycle would stay allocated, in a worker that refreshes the estimates every
few seconds, until some later collection."""

from __future__ import annotations

import gc

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.engine.tests.helpers import job
from scheduler.engine.tests.test_memory import collect_all, no_other_thread_runs
from scheduler.simulator import parse_scenario, simulate
from scheduler.simulator.estimate import estimate_starts
from tests.simulator.test_estimate import NOW, lent_to_research
from tests.simulator.test_fast_path import random_scenario


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_a_simulation_leaves_nothing_for_the_cycle_collector(seed):
    """Borrowing, reclaims, in-share preemption, rejections and share changes: the result
    holds what it needs, and nothing else of the replay is left in a cycle."""
    scenario = parse_scenario(random_scenario(seed, jobs=60))
    with no_other_thread_runs():
        collect_all()
        result = simulate(scenario, record_series=True)
        assert gc.collect() == 0
    assert result.data["jobs"]


def test_an_estimate_leaves_nothing_for_the_cycle_collector():
    """A replay from a live snapshot: a reclaim, a stopping borrower, jobs queued behind."""
    snapshot = lent_to_research(
        *(job(f"w{i}", ("vision", "research")[i % 2], 1 + i % 8, submitted=NOW - 10 + i)
          for i in range(40))
    )  # fmt: skip
    expected = {f"w{i}": 100.0 + 37 * i for i in range(40)}
    with no_other_thread_runs():
        collect_all()
        estimates = estimate_starts(
            snapshot, expected=expected, remaining={"own": 1000, "borrower": 5000}, horizon=1e6
        )
        assert gc.collect() == 0
    assert len(estimates.starts) == 40
