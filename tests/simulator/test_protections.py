"""The protections of lenders in the simulator, at exact times (docs/semantics.md): the
minimum runtime before a reclaim, the churn breaker, and victims chosen by the work they
lose since their last checkpoint; and the scenario keys that set them."""

from __future__ import annotations

import pytest

from scheduler.simulator import parse_scenario
from scheduler.simulator.scenario import ScenarioError
from tests.simulator.helpers import events_of, h100_job, job, run, share, two_nodes


def test_a_reclaim_waits_for_the_borrower_s_minimum_runtime():
    """The borrowing share asks for 300 s: the owner submits at 100, but neither of the
    share's jobs (started at 0 and 10) may be a victim yet. At 300 the first has run its
    minimum and is preempted (grace 0: the owner starts at once); the owner's wait is within
    the minimum plus the grace period."""
    result = run(
        two_nodes(
            share("owner", "LEND", grace_seconds=0),
            share("borrower", "LEND_AND_BORROW", grace_seconds=0, min_runtime_seconds=300),
            jobs=[
                h100_job("b0", "borrower", 8, 0, 5000),
                h100_job("b1", "borrower", 8, 10, 1000),
                h100_job("o1", "owner", 8, 100, 500),
            ],
        )
    )
    assert events_of(result)[:4] == [
        (0, "b0", "start"),
        (10, "b1", "start"),
        (300, "b0", "preempt"),
        (300, "o1", "start"),
    ]
    assert job(result, "o1")["wait_seconds"] == 200 <= 300


def churn_scenario(preemptions: int) -> dict:
    """The owner's short jobs reclaim the borrower's b1 at 20, 60 and 100 (grace 0)."""
    owner_jobs = [h100_job(f"o{i}", "owner", 8, 20 + 40 * i, 10) for i in range(3)]
    return two_nodes(
        share("owner", "LEND", grace_seconds=0),
        share("borrower", "LEND_AND_BORROW", grace_seconds=0),
        jobs=[
            h100_job("b0", "borrower", 8, 0, 5000),
            h100_job("b1", "borrower", 8, 10, 2000, checkpoint_interval=5),
            *owner_jobs,
        ],
        churn={"preemptions": preemptions, "window_seconds": 1000},
    )


def starts_of(result: dict, job_id: str) -> list[float]:
    return [t for t, name, kind in events_of(result) if name == job_id and kind == "start"]


def test_a_job_preempted_three_times_within_the_window_is_held_off_borrowed_gpus():
    """After its third preemption (at 100) the borrower borrows no more until the window (1000
    s) has passed since the first (at 20), though the owner's GPUs are idle from 110: it starts
    again at 1020, on a cycle of its own. With the breaker off it starts at 110."""
    assert starts_of(run(churn_scenario(3)), "b1") == [10, 30, 70, 1020]
    assert starts_of(run(churn_scenario(0)), "b1") == [10, 30, 70, 110]


def test_a_reclaim_stops_the_borrower_that_loses_the_least_work():
    """Two borrowers of 4 GPUs: b1 started at 0 and checkpoints every 100 s, b2 started at 250
    and never does. At 310 the owner needs 4 GPUs: b1 loses 4 × 10 GPU-seconds (its
    checkpoint at 300), b2 4 × 60, so b1 is the victim though it started first."""
    result = run(
        two_nodes(
            share("owner", "LEND", grace_seconds=0),
            share("borrower", "LEND_AND_BORROW", grace_seconds=0),
            jobs=[
                h100_job("b0", "borrower", 8, 0, 5000),
                h100_job("b1", "borrower", 4, 0, 1000, checkpoint_interval=100),
                h100_job("b2", "borrower", 4, 250, 1000),
                h100_job("o1", "owner", 4, 310, 100),
            ],
        )
    )
    assert (310, "b1", "preempt") in events_of(result)
    assert job(result, "b2")["preemptions"] == 0


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"churn": {"preemptions": -1}}, "preemptions"),
        ({"churn": {"window_seconds": 0}}, "window_seconds"),
        ({"churn": {"often": 3}}, "often"),
        ({"churn": 3}, "churn"),
    ],
)
def test_bad_churn_settings_are_rejected_naming_the_key(extra, words):
    with pytest.raises(ScenarioError, match=words):
        parse_scenario(two_nodes(share("a", "LEND"), jobs=[h100_job("j", "a", 1, 0, 1)], **extra))


def test_a_bad_minimum_runtime_is_rejected_naming_the_share():
    data = two_nodes(share("a", "LEND", min_runtime_seconds=-5), jobs=[h100_job("j", "a", 1, 0, 1)])
    with pytest.raises(ScenarioError, match=r"shares\[0\].*min_runtime_seconds"):
        parse_scenario(data)
