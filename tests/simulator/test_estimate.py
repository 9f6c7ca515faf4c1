"""Estimated starts: the engine replayed forward from the cycle's snapshot, on hand-computed
clusters (times in seconds from now)."""

from __future__ import annotations

import pytest

from scheduler.engine import Snapshot
from scheduler.engine.snapshot import LEND, LEND_AND_BORROW, RESERVE, Allocation, RunnableJob
from scheduler.engine.tests.helpers import job, nodes, running, share
from scheduler.simulator.estimate import Estimate, estimate_starts

NOW = 1_000_000.0


def on(node: str, gpus: int) -> Allocation:
    """GPUs 0 .. gpus-1 of the node."""
    return Allocation(node, tuple(range(gpus)))


def lent_to_research(*runnable: RunnableJob) -> Snapshot:
    """Two nodes of 8 h100: research runs a job on its own quota and one on vision's (lent,
    grace 120 s); `runnable` wait."""
    return Snapshot(
        nodes(2),
        (share("vision", 8, LEND), share("research", 8, LEND_AND_BORROW, grace_seconds=120)),
        placed=(
            running("own", "research", "n0", range(8), started=NOW - 50),
            running("borrower", "research", "n1", range(8), started=NOW - 40, borrowed=8),
        ),
        runnable=runnable,
        now=NOW,
    )


def test_an_owner_job_starts_once_its_reclaimed_borrower_has_stopped():
    """vision's 8 h100 are lent to research's second job; vision submits: the reclaim stops
    that borrower (grace 120 s), so vision's job starts in 120 s on the borrower's node."""
    snapshot = lent_to_research(job("owner", "vision", 8, submitted=NOW - 1))
    estimates = estimate_starts(
        snapshot, expected={"owner": 600}, remaining={"own": 1000, "borrower": 5000}, horizon=1e6
    ).starts
    assert estimates == {"owner": Estimate(start=120.0, allocations=(on("n1", 8),))}


def test_a_gang_job_starts_when_whole_nodes_are_free():
    """Two 4-GPU jobs end in 300 and 600 s on one node each: a job for two whole nodes starts
    at 600, and a 4-GPU job submitted after it fits beside them at once."""
    snapshot = Snapshot(
        nodes(2),
        (share("team", 16, RESERVE),),
        placed=(
            running("a", "team", "n0", range(4), started=NOW - 10),
            running("b", "team", "n1", range(4), started=NOW - 10),
        ),
        runnable=(
            job("gang", "team", 16, nodes=2, submitted=NOW - 5),
            job("small", "team", 4, submitted=NOW - 2),
        ),
        now=NOW,
    )
    estimates = estimate_starts(
        snapshot, expected={"gang": 100, "small": 200}, remaining={"a": 300, "b": 600}, horizon=1e6
    ).starts
    assert estimates["small"] == Estimate(start=0.0, allocations=(Allocation("n0", (4, 5, 6, 7)),))
    assert estimates["gang"] == Estimate(start=600.0, allocations=(on("n0", 8), on("n1", 8)))


def test_a_strict_fifo_share_s_first_job_holds_back_the_next():
    """In a strict-FIFO share the 16-GPU job waits for both nodes (600 s) and the 4-GPU job
    behind it waits for it, though it would fit now: it starts with it."""
    snapshot = Snapshot(
        nodes(2),
        (share("team", 24, RESERVE, strict_fifo=True),),
        placed=(
            running("a", "team", "n0", range(4), started=NOW - 10),
            running("b", "team", "n1", range(4), started=NOW - 10),
        ),
        runnable=(
            job("big", "team", 16, nodes=2, submitted=NOW - 5),
            job("small", "team", 4, submitted=NOW - 2),
        ),
        now=NOW,
    )
    estimates = estimate_starts(
        snapshot, expected={"big": 100, "small": 200}, remaining={"a": 300, "b": 600}, horizon=1e6
    ).starts
    assert estimates["big"].start == 600.0
    assert estimates["small"].start == 700.0  # after big ends: the nodes are big's till then


def test_no_estimate_is_before_now_nor_past_the_horizon():
    """Jobs queued behind a long one: every estimate is at or after now; those that would
    start after the horizon have none."""
    snapshot = Snapshot(
        nodes(1),
        (share("team", 8, RESERVE),),
        placed=(running("long", "team", "n0", range(8), started=NOW - 3600),),
        runnable=tuple(job(f"j{i}", "team", 8, submitted=NOW - 100 + i) for i in range(5)),
        now=NOW,
    )
    estimates = estimate_starts(
        snapshot,
        expected={f"j{i}": 1000 for i in range(5)},
        remaining={"long": -30},  # overdue: assumed to end within a minute
        horizon=2500,
    ).starts
    assert [estimates[f"j{i}"].start for i in range(3)] == [60.0, 1060.0, 2060.0]
    assert "j3" not in estimates and "j4" not in estimates
    assert all(estimate.start >= 0 for estimate in estimates.values())


def test_far_ahead_ends_close_together_share_one_cycle_of_the_replay():
    """The replay is coarser the further ahead it is: with a resolution of a tenth, the GPUs
    freed at 1,000 s and at 1,050 s (within a tenth of 1,000 s) are planned on in one cycle, at
    1,050 s, so the waiting job is estimated 50 s later than the exact replay's 1,000 s. An end
    with nothing else within its tenth is exact: the next job starts at 2,050 s."""
    snapshot = Snapshot(
        nodes(1),
        (share("team", 8, RESERVE),),
        placed=(
            running("a", "team", "n0", range(4), started=NOW - 10),
            running("b", "team", "n0", range(4, 8), started=NOW - 10),
        ),
        runnable=(
            job("next", "team", 4, submitted=NOW - 5),
            job("last", "team", 8, submitted=NOW - 1),
        ),
        now=NOW,
    )
    times = {"expected": {"next": 1000, "last": 60}, "remaining": {"a": 1000, "b": 1050}}
    exact = estimate_starts(snapshot, **times, horizon=1e6, resolution=0).starts
    coarse = estimate_starts(snapshot, **times, horizon=1e6, resolution=0.1).starts
    assert exact["next"] == Estimate(1000.0, (on("n0", 4),))
    assert coarse["next"] == Estimate(1050.0, (on("n0", 4),))
    assert exact["last"].start == 2000.0 and coarse["last"].start == 2050.0


def test_an_estimate_needs_the_snapshot_s_time():
    with pytest.raises(ValueError, match="Snapshot.now"):
        estimate_starts(Snapshot(nodes(1), ()), expected={}, remaining={}, horizon=1)


def test_a_replay_out_of_time_stops_and_says_how_far_it_got():
    """With no time budget left the replay stops before its first instant: nothing is
    estimated, and it says it replayed nothing, so no job is shown a start."""
    snapshot = Snapshot(
        nodes(1),
        (share("team", 8, RESERVE),),
        runnable=(job("j", "team", 8, submitted=NOW - 1),),
        now=NOW,
    )
    result = estimate_starts(snapshot, expected={"j": 60}, remaining={}, horizon=3600, budget=0)
    assert (result.starts, result.replayed) == ({}, 0.0)
    full = estimate_starts(snapshot, expected={"j": 60}, remaining={}, horizon=3600)
    assert full.starts == {"j": Estimate(0.0, (on("n0", 8),))} and full.replayed == 3600


def test_a_job_read_both_placed_and_waiting_counts_once_as_waiting():
    """The cycle's snapshot reads the placed jobs, then the queue, not in one transaction: a
    job whose attempt ended in between is read both ways. It waits (the later read), and its
    GPUs are free: the estimate neither fails (it did, with a KeyError, at 2,000 agents) nor
    counts those GPUs as held."""
    snapshot = Snapshot(
        nodes(1),
        (share("team", 8, RESERVE),),
        placed=(running("again", "team", "n0", range(8), started=NOW - 10),),
        runnable=(job("again", "team", 8, submitted=NOW - 30),),
        now=NOW,
    )
    estimates = estimate_starts(
        snapshot, expected={"again": 100}, remaining={"again": 500}, horizon=1e6
    ).starts
    assert estimates == {"again": Estimate(start=0.0, allocations=(on("n0", 8),))}
