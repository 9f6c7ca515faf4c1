"""Exact times of starts, preemptions and finishes on small hand-computed scenarios."""

from __future__ import annotations

import pytest

from scheduler.simulator import parse_scenario, simulate
from tests.simulator.helpers import events_of, h100_job, job, run, share, two_nodes


def reclaim_scenario(grace: float, checkpoint: float | None = None) -> dict:
    borrower_job = h100_job("b1", "borrower", 8, 10, 1000)
    if checkpoint is not None:
        borrower_job["checkpoint_interval"] = checkpoint
    return two_nodes(
        share("owner", "LEND", grace_seconds=grace),
        share("borrower", "LEND_AND_BORROW", grace_seconds=grace),
        jobs=[
            h100_job("b0", "borrower", 8, 0, 5000),
            borrower_job,
            h100_job("o1", "owner", 8, 100, 500),
        ],
    )


def test_borrower_is_reclaimed_after_its_grace_period_and_resumes_from_scratch():
    """A borrower starts at 10 on the owner's idle GPUs; the owner submits at 100, the borrower
    is preempted at 100 and holds its GPUs for its grace (30 s), so the owner starts at 130.
    Without checkpoints the borrower starts over when the owner finishes (630) and ends at
    1630. Its share's job within the limit (b0) is not touched."""
    result = run(reclaim_scenario(grace=30))
    assert events_of(result) == [
        (0, "b0", "start"),
        (10, "b1", "start"),
        (100, "b1", "preempt"),
        (130, "o1", "start"),
        (630, "o1", "finish"),
        (630, "b1", "start"),
        (1630, "b1", "finish"),
        (5000, "b0", "finish"),
    ]
    b1 = job(result, "b1")
    assert (b1["started"], b1["finished"], b1["preemptions"]) == (10, 1630, 1)
    assert b1["wait_seconds"] == 0 and b1["state"] == "SUCCEEDED"
    assert job(result, "o1")["wait_seconds"] == 30
    borrowed = {e["job"]: e["borrowed"] for e in result["events"] if e["type"] == "start"}
    assert borrowed == {"b0": 0, "b1": 8, "o1": 0}


def test_placed_jobs_tell_the_engine_how_many_gpus_they_borrowed():
    """The simulator passes each placed job's borrowed GPUs (from its placement) to the engine,
    running or stopping, so the victim order can put jobs on borrowed GPUs first."""
    from scheduler.engine import plan

    seen: dict[tuple[str, bool], int] = {}

    def engine(snapshot):
        for placed in snapshot.placed:
            seen[placed.id, placed.stopping] = placed.borrowed
        return plan(snapshot)

    data = reclaim_scenario(grace=60)
    data["jobs"].append(h100_job("late", "borrower", 1, 130, 10))  # a cycle while b1 stops
    simulate(parse_scenario(data), engine=engine)
    assert seen == {("b0", False): 0, ("b1", False): 8, ("b1", True): 8}


def test_preempted_job_resumes_from_its_last_checkpoint():
    """With checkpoints every 40 s, 90 s of work keeps 80 s: the borrower resumes at 630
    with 920 s left and finishes at 1550."""
    result = run(reclaim_scenario(grace=30, checkpoint=40))
    assert job(result, "b1")["finished"] == 630 + 920


def test_work_during_the_grace_period_is_not_counted():
    """The job cannot finish during its grace period: a job 20 s from its end when preempted
    still returns to the queue (here it has no checkpoint, so it starts over)."""
    data = reclaim_scenario(grace=30)
    data["jobs"][1]["duration"] = 110
    result = run(data)
    assert (100, "b1", "preempt") in events_of(result)
    assert (120, "b1", "finish") not in events_of(result)
    assert job(result, "b1")["finished"] == 630 + 110


def test_grace_zero_frees_the_victims_gpus_at_the_same_instant():
    """With grace_seconds 0 the owner starts at the very instant it reclaims."""
    result = run(reclaim_scenario(grace=0))
    assert (100, "b1", "preempt") in events_of(result)
    assert (100, "o1", "start") in events_of(result)
    assert job(result, "o1")["wait_seconds"] == 0


@pytest.mark.parametrize(
    ("max_preemptions", "state", "preemptions"),
    [(0, "FAILED", 1), (1, "SUCCEEDED", 1)],
)
def test_max_preemptions_fails_the_job_at_the_next_preemption(max_preemptions, state, preemptions):
    """max_preemptions 0 fails the job at its first preemption (when its GPUs are released);
    1 requeues it once."""
    data = reclaim_scenario(grace=30)
    data["jobs"][1]["max_preemptions"] = max_preemptions
    result = run(data)
    b1 = job(result, "b1")
    assert (b1["state"], b1["preemptions"]) == (state, preemptions)
    if state == "FAILED":
        assert (130, "b1", "fail") in events_of(result)
        assert b1["finished"] == 130
        assert "max_preemptions" in b1["reason"]


def test_requeued_job_keeps_its_submission_time():
    """After a preemption the job goes back in the queue with its first submission time, so
    it runs before a job of its share submitted later."""
    data = reclaim_scenario(grace=30)
    data["jobs"].append(h100_job("b2", "borrower", 8, 50, 100))
    result = run(data)
    starts = [e[1] for e in events_of(result) if e[2] == "start" and e[0] == 630]
    assert starts == ["b1"]


def test_reserve_share_never_lends():
    """A RESERVE share's idle GPUs stay idle: the second borrower job waits for its own
    share's first job, and its reason says why."""
    data = two_nodes(
        share("training", "RESERVE"),
        share("experiments", "LEND_AND_BORROW"),
        jobs=[
            h100_job("e1", "experiments", 8, 0, 100),
            h100_job("e2", "experiments", 8, 0, 100),
        ],
    )
    result = run(data)
    assert job(result, "e2")["started"] == 100
    assert result["shares"]["training"]["gpu_hours_lent"] == 0


def test_job_still_waiting_at_the_end_is_runnable_with_a_reason():
    """A job only the quotas hold back stays RUNNABLE, with the engine's reason."""
    data = two_nodes(
        share("training", "RESERVE"),
        share("lender", "LEND"),
        jobs=[h100_job("big", "training", 16, 0, 100, nodes=2)],
    )
    big = job(run(data), "big")
    assert big["state"] == "RUNNABLE"
    assert big["started"] is None and big["reason"]


def test_change_switches_strategy_at_its_time():
    """Until t=1000 the lender lends; from then on it is RESERVE, so the borrower's second
    job, which finished its first borrowing run, must wait for its own quota."""
    data = two_nodes(
        share("owner", "LEND", grace_seconds=0),
        share("borrower", "LEND_AND_BORROW", grace_seconds=0),
        jobs=[
            h100_job("b0", "borrower", 8, 0, 3000),
            h100_job("b1", "borrower", 8, 0, 500),
            h100_job("b2", "borrower", 8, 1000, 500),
        ],
        changes=[{"at": 1000, "share": "owner", "set": {"strategy": "RESERVE"}}],
    )
    result = run(data)
    assert job(result, "b1")["started"] == 0
    assert job(result, "b2")["started"] == 3000


def test_change_replaces_capacity_limits_and_counts_from_then_on():
    """Raising a limit at t=600 lets a waiting job of the share start at that instant, and
    borrowed hours follow the limit in force."""
    data = {
        "nodes": [{"name": "gpu", "gpu_type": "h100", "gpus": 8, "count": 2}],
        "shares": [share("solo", "LEND", limit=8, grace_seconds=0)],
        "jobs": [h100_job("s1", "solo", 8, 0, 1200), h100_job("s2", "solo", 8, 0, 600)],
        "changes": [{"at": 600, "share": "solo", "set": {"capacity_limits": {"h100": 16}}}],
    }
    result = run(data)
    assert job(result, "s2")["started"] == 600
    assert result["shares"]["solo"]["gpu_hours_borrowed"] == 0


def test_order_at_one_instant_is_release_change_submit_then_cycle():
    """A job finishing at 100 frees GPUs that a job submitted at 100 takes at once."""
    data = two_nodes(
        share("a", "RESERVE", limit=16),
        jobs=[
            h100_job("first", "a", 16, 0, 100, nodes=2),
            h100_job("next", "a", 16, 100, 100, nodes=2),
        ],
    )
    result = run(data)
    assert events_of(result) == [
        (0, "first", "start"),
        (100, "first", "finish"),
        (100, "next", "start"),
        (200, "next", "finish"),
    ]


def test_gpu_hours_lent_and_cluster_figures():
    """The borrower holds 8 of the lender's GPUs from 10 to 130 (grace included) and for
    1000 s after the reclaim; the lender lends exactly what the borrower borrows (there is no
    free pool)."""
    result = run(reclaim_scenario(grace=30))
    shares = result["shares"]
    assert shares["borrower"]["gpu_hours_borrowed"] == pytest.approx(8 * 1120 / 3600, abs=1e-5)
    assert shares["owner"]["gpu_hours_lent"] == pytest.approx(8 * 1120 / 3600, abs=1e-5)
    cluster = result["cluster"]
    assert cluster["makespan"] == 5000
    assert cluster["gpu_hours_capacity"] == pytest.approx(16 * 5000 / 3600, abs=1e-5)
    held = 8 * 5000 + 8 * 120 + 8 * 500 + 8 * 1000  # grace period included
    assert cluster["gpu_hours_used"] == pytest.approx(held / 3600, abs=1e-5)
    assert cluster["utilization"] == pytest.approx(held / (16 * 5000), abs=1e-5)
    assert shares["borrower"]["preemptions"] == 1
    assert shares["owner"]["mean_wait"] == 30 and shares["owner"]["p95_wait"] == 30


def test_free_pool_is_borrowed_before_lenders():
    """GPUs no share's limit covers are borrowed first: nothing is reported lent."""
    data = {
        "nodes": [{"name": "gpu", "gpu_type": "h100", "gpus": 8, "count": 3}],
        "shares": [share("owner", "LEND"), share("borrower", "LEND_AND_BORROW")],
        "jobs": [h100_job("b0", "borrower", 8, 0, 100), h100_job("b1", "borrower", 8, 0, 100)],
    }
    result = run(data)
    assert result["shares"]["borrower"]["gpu_hours_borrowed"] > 0
    assert result["shares"]["owner"]["gpu_hours_lent"] == 0


def test_reject_event_for_a_job_no_node_set_can_hold():
    """A job larger than any node set is rejected (FAILED with a reason), not an error."""
    data = two_nodes(
        share("a", "LEND_AND_BORROW", limit=16),
        jobs=[h100_job("huge", "a", 32, 5, 100, nodes=2), h100_job("ok", "a", 8, 5, 100)],
    )
    result = run(data)
    huge = job(result, "huge")
    assert huge["state"] == "FAILED" and huge["reason"]
    assert {"t": 5, "job": "huge", "type": "reject", "nodes": [], "borrowed": 0} in result["events"]
    assert job(result, "ok")["state"] == "SUCCEEDED"


def test_disabled_share_rejects_new_jobs():
    """A job submitted to a DISABLED share is rejected at submission."""
    data = two_nodes(share("a", "LEND", state="DISABLED"), jobs=[h100_job("j", "a", 8, 0, 10)])
    result = run(data)
    assert job(result, "j")["state"] == "FAILED"
    assert "DISABLED" in job(result, "j")["reason"]
    assert events_of(result) == [(0, "j", "reject")]


def test_result_has_the_keys_of_the_contract():
    """The result JSON has events, jobs, shares and cluster with the documented fields."""
    result = run(reclaim_scenario(grace=30))
    assert set(result) == {"events", "jobs", "shares", "cluster"}
    assert set(result["events"][0]) == {"t", "job", "type", "nodes", "borrowed"}
    assert set(result["jobs"][0]) == {
        "id",
        "share",
        "state",
        "submitted",
        "started",
        "finished",
        "wait_seconds",
        "preemptions",
        "reason",
    }
    assert set(result["shares"]["owner"]) == {
        "gpu_hours_used",
        "gpu_hours_borrowed",
        "gpu_hours_lent",
        "mean_wait",
        "p95_wait",
        "preemptions",
    }
    assert set(result["cluster"]) == {
        "gpu_hours_capacity",
        "gpu_hours_used",
        "utilization",
        "makespan",
    }


def test_node_names_follow_count():
    """`count: N` names nodes name-0..name-N-1 (count 1 still gives -0); without count the
    name is used as is."""
    data = {
        "nodes": [
            {"name": "solo", "gpu_type": "h100", "gpus": 8, "count": 1},
            {"name": "plain", "gpu_type": "h100", "gpus": 8},
        ],
        "shares": [share("a", "RESERVE", limit=16)],
        "jobs": [h100_job("j", "a", 16, 0, 10, nodes=2)],
    }
    start = run(data)["events"][0]
    assert sorted(start["nodes"]) == ["plain", "solo-0"]


# Engine calls one run of the scenario below may make; about 340 are needed. More means jobs
# preempt each other over and over: fail then, rather than hang.
MAX_ENGINE_CALLS = 2000


def bounded_engine(preempted: list[tuple[str, str]]):
    """The engine, failing past MAX_ENGINE_CALLS; each (victim, job it is preempted for) is
    appended to `preempted`."""
    from scheduler.engine import plan

    calls = 0

    def engine(snapshot):
        nonlocal calls
        calls += 1
        assert calls <= MAX_ENGINE_CALLS, "the engine keeps being called: a preemption loop?"
        outcome = plan(snapshot)
        preempted.extend((p.job_id, p.for_job_id) for p in outcome.preemptions)
        return outcome

    return engine


@pytest.mark.parametrize("in_share", [False, True])
def test_skipping_settled_gpu_types_changes_nothing(in_share):
    """Leaving out of a cycle the waiting jobs of a GPU type where nothing changed gives the
    same events as sending every waiting job to every cycle, with in-share preemption off
    and on. With it on, a job that preempted in its share starts before its victims, back in
    the queue, take their GPUs back: the run ends, and no job is preempted twice for the
    same job."""
    import random

    rng = random.Random(3)
    jobs = []
    for i in range(150):
        gpus = rng.choice([1, 2, 4, 8, 16])
        jobs.append(
            {
                "id": f"j{i}",
                "share": rng.choice(["a", "b", "c"]),
                "gpu_type": rng.choice(["h100", "a100"]),
                "gpus": gpus,
                "nodes": 2 if gpus == 16 else 1,
                "submit": rng.randrange(0, 20000, 7),
                "duration": rng.randrange(60, 5000),
                "priority": rng.choice([0, 0, 5]),
                "checkpoint_interval": 300,
            }
        )
    data = {
        "nodes": [
            {"name": "h", "gpu_type": "h100", "gpus": 8, "count": 4},
            {"name": "a", "gpu_type": "a100", "gpus": 8, "count": 2},
        ],
        "shares": [
            {
                "name": "a",
                "capacity_limits": {"h100": 12, "a100": 4},
                "strategy": "LEND_AND_BORROW",
                "in_share_preemption": in_share,
            },
            {
                "name": "b",
                "capacity_limits": {"h100": 12, "a100": 8},
                "strategy": "LEND",
                "grace_seconds": 0,
            },
            {
                "name": "c",
                "capacity_limits": {"h100": 4, "a100": 4},
                "strategy": "LEND_AND_BORROW",
                "borrow_limit": 100,
                "grace_seconds": 30,
                "in_share_preemption": in_share,
            },
        ],
        "jobs": jobs,
    }
    scenario = parse_scenario(data)
    preempted: list[tuple[str, str]] = []
    fast = simulate(scenario, engine=bounded_engine(preempted)).data
    full = simulate(scenario, engine=bounded_engine([]), full_snapshots=True).data
    key = lambda e: (e["t"], e["job"], e["type"])  # noqa: E731
    assert sorted(map(key, fast["events"])) == sorted(map(key, full["events"]))
    assert fast["shares"] == full["shares"]
    assert len(set(preempted)) == len(preempted)
    if in_share:
        assert any(e["type"] == "preempt" for e in fast["events"])


def test_a_job_that_is_not_preemptible_waits_for_its_own_quota_and_is_never_preempted():
    """In the simulator as live: a job submitted not preemptible never runs on lent GPUs (it
    waits, though the lender's GPUs are idle, until its share's own job ends), and once
    running it is never a reclaim's victim."""
    result = run(two_nodes(
        share("research", "LEND_AND_BORROW"), share("vision", "LEND"),
        jobs=[
            h100_job("own", "research", 8, 0, 100),
            h100_job("steady", "research", 8, 10, 1000, preemptible=False),
            h100_job("owner", "vision", 8, 200, 50),
        ],
    ))  # fmt: skip
    assert events_of(result) == [
        (0, "own", "start"),
        (100, "own", "finish"),
        (100, "steady", "start"),
        (200, "owner", "start"),
        (250, "owner", "finish"),
        (1100, "steady", "finish"),
    ]
    assert job(result, "steady")["preemptions"] == 0
