"""One scenario per rule of DESIGN §2, with exact placements and exact victims."""

from __future__ import annotations

from scheduler.engine import Snapshot, plan, reasons
from scheduler.engine.snapshot import (
    DISABLED,
    DOWN,
    DRAINING,
    FAIR,
    IN_SHARE,
    LEND,
    LEND_AND_BORROW,
    RECLAIM,
    RESERVE,
    NodeView,
    RunnableJob,
)
from scheduler.engine.tests.helpers import (
    H100,
    advance,
    job,
    nodes,
    release_stopped,
    requeue_stopped,
    running,
    share,
    victims,
    where,
)

LAB = LEND_AND_BORROW


def test_reserve_never_lends():
    """A RESERVE share's idle GPUs stay idle: a borrower does not get them."""
    snapshot = Snapshot(
        nodes(2),
        (share("vision", 8, RESERVE), share("nlp", 8, LAB)),
        runnable=(job("own", "nlp", 8, submitted=1), job("extra", "nlp", 8, submitted=2)),
    )
    outcome = plan(snapshot)
    assert where(outcome) == {"own": [("n0", tuple(range(8)))]}
    assert outcome.waiting == {"extra": reasons.no_lendable(H100)}


def test_lend_lends_but_never_borrows():
    """A LEND share's idle GPUs go to a borrower; a LEND share itself never goes above its limit."""
    snapshot = Snapshot(
        nodes(2),
        (share("vision", 4, LEND), share("nlp", 12, LAB)),
        runnable=(
            job("nlp-16", "nlp", 16, nodes=2, submitted=1),
            job("vision-8", "vision", 8, submitted=2),
        ),
    )
    outcome = plan(snapshot)
    assert [p.job_id for p in outcome.placements] == ["nlp-16"]
    assert outcome.placements[0].borrowed == 4
    assert outcome.waiting == {"vision-8": reasons.larger_than_limit(8, H100, "vision", 4, LEND)}


def test_job_larger_than_its_shares_limit_and_borrow_limit_together_says_so():
    """A LEND_AND_BORROW share with a borrow limit may use its limit plus that much: a job
    larger than both together can never start while they stand. It stays RUNNABLE, saying so,
    not "borrow limit reached" (which it says of a job that fits them once others end)."""
    snapshot = Snapshot(
        nodes(3),
        (share("nlp", 8, LAB, borrow_limit=50),),  # at most 8 + 4
        runnable=(
            job("big", "nlp", 16, nodes=2),
            job("fits", "nlp", 12, nodes=2, submitted=1),
        ),
    )
    outcome = plan(snapshot)
    assert outcome.rejections == ()
    assert outcome.waiting == {"big": reasons.larger_than_borrow_limit(16, H100, "nlp", 8, 4)}
    assert outcome.waiting["big"] == (
        "needs 16 h100 but share nlp may use at most 12: its limit of 8 and a borrow limit of "
        "4 more"
    )
    assert [p.job_id for p in outcome.placements] == ["fits"]


def test_job_larger_than_the_limit_of_a_share_that_cannot_borrow_says_so():
    """A LEND or RESERVE share never borrows: a job larger than its limit can never start while
    the limit stands. It stays RUNNABLE (the limit may be raised) with a reason that says so,
    not "at its limit"."""
    for strategy in (LEND, RESERVE):
        snapshot = Snapshot(
            nodes(2),
            (share("nlp", 8, strategy),),
            runnable=(job("big", "nlp", 16, nodes=2), job("small", "nlp", 8, submitted=1)),
        )
        outcome = plan(snapshot)
        assert outcome.rejections == ()
        assert outcome.waiting == {"big": reasons.larger_than_limit(16, H100, "nlp", 8, strategy)}
        assert outcome.waiting["big"] == (
            f"needs 16 h100 but share nlp's limit is 8 and a {strategy} share cannot borrow"
        )
        assert [p.job_id for p in outcome.placements] == ["small"]


def test_lend_and_borrow_cap_is_rounded_down():
    """borrow_limit 50% of a limit of 5 lets the share borrow 2 GPUs, not 2.5 or 3."""
    snapshot = Snapshot(
        nodes(2),
        (share("nlp", 5, LAB, borrow_limit=50), share("vision", 11, LEND)),
        runnable=tuple(job(f"j{i}", "nlp", 1, submitted=i) for i in range(8)),
    )
    outcome = plan(snapshot)
    assert [p.job_id for p in outcome.placements] == [f"j{i}" for i in range(7)]
    assert [p.borrowed for p in outcome.placements] == [0] * 5 + [1, 1]
    assert outcome.waiting == {"j7": reasons.borrow_limit_reached(2, 2, H100)}


def test_lend_limit_keeps_the_rest_of_the_idle_quota_reserved():
    """With lend_limit 3, only 3 of a lender's 8 idle GPUs may be borrowed."""
    snapshot = Snapshot(
        nodes(2),
        (share("vision", 8, LEND, lend_limit={H100: 3}), share("nlp", 8, LAB)),
        runnable=tuple(job(f"j{i}", "nlp", 1, submitted=i) for i in range(12)),
    )
    outcome = plan(snapshot)
    assert len(outcome.placements) == 11
    assert outcome.waiting == {"j11": reasons.no_lendable(H100)}


def test_free_pool_is_capacity_no_share_covers():
    """8 GPUs no share's limit covers may be borrowed even when every share is RESERVE."""
    snapshot = Snapshot(
        nodes(3),
        (share("vision", 8, RESERVE), share("nlp", 8, LAB)),
        runnable=tuple(job(f"j{i}", "nlp", 8, submitted=i) for i in range(3)),
    )
    outcome = plan(snapshot)
    assert where(outcome) == {
        "j0": [("n0", tuple(range(8)))],
        "j1": [("n1", tuple(range(8)))],
    }
    assert [p.borrowed for p in outcome.placements] == [0, 8]
    assert outcome.waiting == {"j2": reasons.no_lendable(H100)}


def test_draining_and_down_nodes_get_nothing_and_are_no_free_pool():
    """Only READY nodes receive jobs, and DRAINING/DOWN capacity is not lent as a free pool;
    a job still running on a draining node keeps counting in its share's usage."""
    cluster = (
        NodeView("ready", H100, 8),
        NodeView("draining", H100, 8, DRAINING),
        NodeView("down", H100, 8, DOWN),
    )
    snapshot = Snapshot(
        cluster,
        (share("nlp", 8, LAB),),
        placed=(running("old", "nlp", "draining", range(4)),),
        runnable=(job("a", "nlp", 4, submitted=1), job("b", "nlp", 4, submitted=2)),
    )
    outcome = plan(snapshot)
    assert where(outcome) == {"a": [("ready", (0, 1, 2, 3))]}
    assert outcome.waiting == {"b": reasons.no_lendable(H100)}


def test_gpus_held_outside_the_portal_are_never_planned_on_nor_lent():
    """GPUs a cluster manager's own jobs hold (Slurm jobs the portal did not submit) are taken:
    a job goes where they are not, and they are no free pool a borrower could use."""
    cluster = (NodeView("slurm", H100, 8, outside_gpus=6), NodeView("agent", H100, 8))
    snapshot = Snapshot(
        cluster,
        (share("vision", 8, RESERVE), share("nlp", 2, LAB)),
        placed=(running("nlp-own", "nlp", "agent", range(2)),),
        runnable=(
            job("fits-beside", "nlp", 2, submitted=1),
            job("needs-outside", "nlp", 4, submitted=2),
        ),
    )
    outcome = plan(snapshot)
    # 16 GPUs, 6 outside: capacity 10, all of it under the two limits, so nothing to borrow.
    assert where(outcome) == {}
    assert outcome.waiting["fits-beside"] == reasons.no_lendable(H100)
    lender = Snapshot(
        cluster,
        (share("vision", 8, LEND), share("nlp", 2, LAB)),
        placed=(running("nlp-own", "nlp", "agent", range(2)),),
        runnable=(job("borrower", "nlp", 8, submitted=1), job("small", "nlp", 2, submitted=2)),
    )
    outcome = plan(lender)
    # The borrower of 8 fits only on "agent"'s 6 free GPUs plus "slurm"'s 2: never on a node
    # whose free GPUs are outside the portal's.
    assert "borrower" not in where(outcome)
    assert where(outcome) == {"small": [("slurm", (0, 1))]}


def test_a_job_that_is_not_preemptible_never_borrows():
    """A job submitted not preemptible runs only within its share's limit: with its share at
    its limit it waits, lendable GPUs idle or not, and says why; a preemptible job of the same
    size borrows them."""
    snapshot = Snapshot(
        nodes(2),
        (share("vision", 8, LEND), share("nlp", 8, LAB)),
        placed=(running("nlp-own", "nlp", "n0", range(8)),),
        runnable=(
            job("steady", "nlp", 8, submitted=1, preemptible=False),
            job("flexible", "nlp", 8, submitted=2),
        ),
    )
    outcome = plan(snapshot)
    assert where(outcome) == {"flexible": [("n1", tuple(range(8)))]}
    assert outcome.waiting["steady"] == reasons.not_preemptible("nlp", 8, 8, H100, 8)
    too_big = Snapshot(nodes(2), (share("nlp", 8, LAB),),
                       runnable=(job("huge", "nlp", 16, nodes=2, preemptible=False),))  # fmt: skip
    assert "more than share nlp's limit (8)" in plan(too_big).waiting["huge"]


def test_a_job_that_is_not_preemptible_is_never_a_victim():
    """Neither a reclaim nor in-share preemption takes a job that is not preemptible: after its
    share's limit was lowered it is above the limit, yet the owner's reclaim takes the
    preemptible borrower; a higher-priority job of its own share waits rather than stop it."""
    snapshot = Snapshot(
        nodes(2),
        (share("vision", 8, LEND), share("nlp", 4, LAB, in_share_preemption=True)),
        placed=(
            running("steady", "nlp", "n0", range(8), started=1, preemptible=False),
            running("flexible", "nlp", "n1", range(8), started=2),
        ),
        runnable=(job("owner", "vision", 8, submitted=3),),
    )
    outcome = plan(snapshot)
    assert victims(outcome) == {"flexible": "owner"}
    own = Snapshot(
        nodes(1),
        (share("nlp", 8, LAB, in_share_preemption=True),),
        placed=(running("steady", "nlp", "n0", range(8), priority=0, preemptible=False),),
        runnable=(job("urgent", "nlp", 8, priority=9, submitted=1),),
    )
    outcome = plan(own)
    assert outcome.preemptions == () and "urgent" in outcome.waiting


def test_reclaim_takes_the_borrower_that_loses_the_least_work():
    """Among borrowers of the same priority, a reclaim stops the one that loses the fewest
    GPU-seconds since its start or its last checkpoint: the job that started first but saved
    a checkpoint a minute ago goes before the job that started later and never saved one."""
    snapshot = Snapshot(
        nodes(3),
        (share("vision", 8, LEND), share("nlp", 8, LAB)),
        placed=(
            running("nlp-own", "nlp", "n0", range(8), started=0),
            running("saved", "nlp", "n1", range(8), started=100, checkpointed=940),
            running("unsaved", "nlp", "n2", range(8), started=400),
        ),
        runnable=(job("vision-8", "vision", 8, submitted=990),),
        now=1000,
    )
    assert victims(plan(snapshot)) == {"saved": "vision-8"}
    # Without that checkpoint the later start loses less.
    unsaved = Snapshot(
        snapshot.nodes,
        snapshot.shares,
        (snapshot.placed[0], running("saved", "nlp", "n1", range(8), started=100),
         snapshot.placed[2]),
        snapshot.runnable,
        now=1000,
    )  # fmt: skip
    assert victims(plan(unsaved)) == {"unsaved": "vision-8"}


def test_a_borrower_younger_than_its_shares_minimum_runtime_is_not_reclaimed_yet():
    """A borrower that has not yet run its share's minimum runtime is no victim: the owner's
    job waits, says when it will reclaim (when the first of them has run its minimum), keeps
    its quota from new borrowers meanwhile, and reclaims once the minimum has passed; a
    borrower old enough is taken at once instead."""
    shares = (share("vision", 8, LEND), share("nlp", 8, LAB, min_runtime_seconds=300))
    snapshot = Snapshot(
        nodes(2),
        shares,
        placed=(
            running("younger", "nlp", "n0", range(8), started=800),
            running("young", "nlp", "n1", range(8), started=740),
        ),
        runnable=(
            job("vision-8", "vision", 8, submitted=990),
            job("nlp-more", "nlp", 8, submitted=995),
        ),
        now=1000,
    )
    outcome = plan(snapshot)
    assert outcome.preemptions == () and outcome.placements == ()
    assert outcome.waiting["vision-8"] == "reclaiming 8 h100 from share nlp in 40 s"
    assert outcome.waiting["nlp-more"] == reasons.no_lendable(H100)
    assert outcome.wake_at == 1040
    later = Snapshot(snapshot.nodes, shares, snapshot.placed, snapshot.runnable, now=1040)
    assert victims(plan(later)) == {"young": "vision-8"}
    old = Snapshot(
        nodes(3),
        shares,
        placed=(*snapshot.placed, running("old", "nlp", "n2", range(8), started=500)),
        runnable=snapshot.runnable[:1],
        now=1000,
    )
    assert victims(plan(old)) == {"old": "vision-8"}


def test_a_job_preempted_too_often_is_held_off_borrowed_gpus():
    """A job preempted three times within the window may not borrow until the window has
    passed since the first of them: it waits, saying so, while lendable GPUs are idle; within
    its share's limit it runs; once the window has passed it borrows again."""
    shares = (share("vision", 8, LEND), share("nlp", 8, LAB))
    churned = job("churned", "nlp", 8, submitted=1, preempted_at=(100.0, 400.0, 900.0))
    snapshot = Snapshot(
        nodes(2),
        shares,
        placed=(running("nlp-own", "nlp", "n0", range(8), started=0),),
        runnable=(churned,),
        now=1000,
        churn_preemptions=3,
        churn_window_seconds=3600,
    )
    outcome = plan(snapshot)
    assert outcome.placements == ()
    assert outcome.waiting["churned"] == reasons.held_off(3, 3600, 2700)
    assert outcome.wake_at == 3700
    assert where(plan(Snapshot(snapshot.nodes, shares, runnable=(churned,), now=1000)))
    assert where(plan(Snapshot(snapshot.nodes, shares, snapshot.placed, (churned,), now=3700))) == {
        "churned": [("n1", tuple(range(8)))]
    }


def test_reclaim_takes_back_lent_gpus_from_the_latest_borrower():
    """A LEND share's idle GPUs go to a borrower and come back when its own job arrives."""
    snapshot = Snapshot(
        nodes(2),
        (share("vision", 8, LEND), share("nlp", 8, LAB)),
        placed=(
            running("nlp-own", "nlp", "n0", range(8), started=1),
            running("nlp-borrowed", "nlp", "n1", range(8), started=2),
        ),
        runnable=(job("vision-8", "vision", 8, submitted=3),),
    )
    outcome = plan(snapshot)
    assert outcome.placements == ()
    assert outcome.preemptions[0].kind == RECLAIM
    assert victims(outcome) == {"nlp-borrowed": "vision-8"}
    assert outcome.waiting == {"vision-8": reasons.reclaiming(8, H100, ["nlp"], 1)}


def test_victim_ties_take_jobs_on_borrowed_gpus_before_own_jobs():
    """Two jobs of a borrower with equal priority, start and submission: the reclaim takes the
    one running on borrowed GPUs, not the one on its share's own quota, whichever node or id
    each has."""
    for borrowed_one in ("nlp-x", "nlp-y"):
        snapshot = Snapshot(
            nodes(2),
            (share("vision", 8, LEND), share("nlp", 8, LAB)),
            placed=tuple(
                running(
                    job_id,
                    "nlp",
                    f"n{i}",
                    range(8),
                    started=5,
                    submitted=1,
                    borrowed=8 if job_id == borrowed_one else 0,
                )
                for i, job_id in enumerate(("nlp-x", "nlp-y"))
            ),
            runnable=(job("vision-8", "vision", 8),),
        )
        assert victims(plan(snapshot)) == {borrowed_one: "vision-8"}


def test_reclaim_even_when_other_gpus_are_physically_free():
    """A job within its limit takes its own quota back even though a RESERVE share's GPUs sit
    free: those are not its to take."""
    snapshot = Snapshot(
        nodes(3),
        (share("vision", 8, LEND), share("audio", 8, RESERVE), share("nlp", 8, LAB)),
        placed=(
            running("nlp-own", "nlp", "n0", range(8), started=1),
            running("nlp-borrowed", "nlp", "n1", range(8), started=2),
        ),
        runnable=(job("vision-8", "vision", 8),),
    )
    outcome = plan(snapshot)
    assert outcome.placements == ()
    assert victims(outcome) == {"nlp-borrowed": "vision-8"}


def test_reclaim_only_from_shares_above_their_limit():
    """Only the borrowing share loses a job; a share at its limit is never a victim."""
    snapshot = Snapshot(
        nodes(3),
        (share("vision", 8, LEND), share("nlp", 4, LAB), share("audio", 12, LAB)),
        placed=(
            running("audio-a", "audio", "n0", range(8), started=9),
            running("audio-b", "audio", "n1", range(4), started=9),
            running("nlp-a", "nlp", "n1", range(4, 8), started=1),
            running("nlp-b", "nlp", "n2", range(4), started=2),
        ),
        runnable=(job("vision-8", "vision", 8),),
    )
    outcome = plan(snapshot)
    assert victims(outcome) == {"nlp-b": "vision-8"}


def test_share_that_would_exceed_its_limit_cannot_reclaim():
    """A LEND share using 4 of 8 cannot reclaim for an 8-GPU job: it would exceed its limit."""
    snapshot = Snapshot(
        nodes(2),
        (share("vision", 8, LEND), share("nlp", 8, LAB)),
        placed=(
            running("vision-4", "vision", "n0", range(4)),
            running("nlp-4", "nlp", "n0", range(4, 8)),
            running("nlp-8", "nlp", "n1", range(8)),
        ),
        runnable=(job("vision-8", "vision", 8),),
    )
    outcome = plan(snapshot)
    assert outcome.preemptions == ()
    assert outcome.waiting == {"vision-8": reasons.at_limit("vision", 4, 8, H100)}


def _in_share_snapshot(enabled: bool, priority: int) -> Snapshot:
    return Snapshot(
        nodes(1),
        (share("nlp", 8, LAB, in_share_preemption=enabled),),
        placed=(
            running("low", "nlp", "n0", range(4), priority=1, started=5),
            running("same", "nlp", "n0", range(4, 8), priority=5, started=6),
        ),
        runnable=(job("high", "nlp", 4, priority=priority),),
    )


def test_in_share_preemption_takes_only_strictly_lower_priority():
    """A priority-5 job preempts the share's priority-1 job, not its priority-5 one."""
    outcome = plan(_in_share_snapshot(True, 5))
    assert victims(outcome) == {"low": "high"}
    assert outcome.preemptions[0].kind == IN_SHARE
    assert outcome.waiting == {"high": reasons.preempting_in_share(4, H100, "nlp", 1)}
    assert plan(_in_share_snapshot(True, 1)).preemptions == ()


def test_in_share_preemption_only_when_enabled():
    """Without in_share_preemption the share's own jobs are never preempted for it."""
    outcome = plan(_in_share_snapshot(False, 5))
    assert outcome.preemptions == ()
    assert "high" in outcome.waiting


def _victim_back_in_queue_snapshot() -> Snapshot:
    # nlp may hold 2 GPUs at most (limit 1, borrow cap 1): "big" needs "small"'s GPU.
    return Snapshot(
        nodes(1, gpus=4),
        (share("nlp", 1, LAB, borrow_limit=100, in_share_preemption=True),),
        placed=(running("small", "nlp", "n0", range(1), priority=0),),
        runnable=(job("big", "nlp", 2, priority=1, submitted=1),),
    )


def test_job_whose_victims_stopped_starts_before_they_return():
    """A job that preempted in its share (as a borrower) starts once its victim has stopped,
    although the victim, back in the queue within its share's limit, would otherwise go
    first: the victim's GPUs are promised to it, and the victim waits. Without that, the two
    would preempt and restart each other forever."""
    first = _victim_back_in_queue_snapshot()
    outcome = plan(first)
    assert victims(outcome) == {"small": "big"}
    second = requeue_stopped(advance(first, outcome, now=10))
    assert second.runnable[-1].preempted_for == "big"
    outcome = plan(second)
    assert where(outcome) == {"big": [("n0", (0, 1))]}
    assert outcome.preemptions == ()
    assert outcome.waiting == {"small": reasons.borrow_limit_reached(1, 1, H100)}
    # Once big runs, small's claim is spent: nothing more is preempted.
    third = requeue_stopped(advance(second, outcome, now=20), started={"big"})
    outcome = plan(third)
    assert outcome.preemptions == () and outcome.placements == ()


def test_victims_claim_counts_only_while_its_job_is_runnable():
    """A requeued victim naming a job that is not runnable (it started, or is gone) keeps its
    ordinary place in the queue."""
    snapshot = Snapshot(
        nodes(1, gpus=4),
        (share("nlp", 1, LAB, borrow_limit=100, in_share_preemption=True),),
        runnable=(
            job("small", "nlp", 1, preempted_for="gone"),
            job("big", "nlp", 2, priority=1, submitted=1),
        ),
    )
    assert set(where(plan(snapshot))) == {"small"}


def _tries_snapshot(gpus: int) -> Snapshot:
    return Snapshot(
        nodes(2),
        (share("vision", 8, LEND, in_share_preemption=True), share("nlp", 8, LAB)),
        placed=(
            running("vision-low", "vision", "n0", range(4), priority=0, started=1),
            running("nlp-n0", "nlp", "n0", range(4, 8), started=3),
            running("nlp-n1", "nlp", "n1", range(8), started=2),
        ),
        runnable=(job("vision-high", "vision", gpus, priority=10),),
    )


def test_try_one_takes_borrowers_before_own_jobs():
    """Try 1 first: the lender takes back what it lent before it stops its own job."""
    outcome = plan(_tries_snapshot(4))
    assert victims(outcome) == {"nlp-n0": "vision-high"}


def test_try_three_takes_both_when_neither_alone_fits():
    """An 8-GPU job over the share's limit: try 1 is not allowed, try 2 (own job) leaves no
    whole node, so try 3 takes the own job and the borrower on the same node."""
    outcome = plan(_tries_snapshot(8))
    assert victims(outcome) == {"vision-low": "vision-high", "nlp-n0": "vision-high"}
    kinds = {p.job_id: p.kind for p in outcome.preemptions}
    assert kinds == {"vision-low": IN_SHARE, "nlp-n0": RECLAIM}


def test_try_two_own_share_only():
    """A borrowing job may only preempt its own lower-priority jobs (try 2)."""
    snapshot = Snapshot(
        nodes(1),
        (share("nlp", 4, LAB, in_share_preemption=True),),
        placed=(running("low", "nlp", "n0", range(8), priority=0),),
        runnable=(job("high", "nlp", 8, priority=3),),
    )
    assert victims(plan(snapshot)) == {"low": "high"}


def test_victim_set_is_greedy_then_pruned_to_minimal():
    """The latest-started borrower job is added first but not needed: the prune drops it."""
    snapshot = Snapshot(
        nodes(2),
        (share("vision", 8, LEND), share("nlp", 8, LAB)),
        placed=(
            running("nlp-x", "nlp", "n0", (0,), started=40),
            running("nlp-e", "nlp", "n0", range(1, 8), started=0),
            running("nlp-a", "nlp", "n1", range(4), started=10),
            running("nlp-c", "nlp", "n1", (4, 5), started=30),
            running("nlp-d", "nlp", "n1", (6, 7), started=20),
        ),
        runnable=(job("vision-4", "vision", 4),),
    )
    outcome = plan(snapshot)
    assert victims(outcome) == {"nlp-c": "vision-4", "nlp-d": "vision-4"}


def test_priority_then_submission_order():
    """Higher priority first; among equal priority, earlier submission first."""
    snapshot = Snapshot(
        nodes(1),
        (share("nlp", 8, LAB),),
        runnable=(
            job("early-low", "nlp", 8, priority=0, submitted=1),
            job("late-high", "nlp", 8, priority=5, submitted=3),
            job("early-high", "nlp", 8, priority=5, submitted=2),
        ),
    )
    assert list(where(plan(snapshot))) == ["early-high"]


def test_within_limit_jobs_go_before_borrowers():
    """A job within its share's limit goes before a higher-priority borrowing job."""
    snapshot = Snapshot(
        nodes(2),
        (share("vision", 8, LAB), share("nlp", 8, LAB)),
        placed=(running("nlp-own", "nlp", "n0", range(8)),),
        runnable=(
            job("nlp-borrow", "nlp", 8, priority=100, submitted=0),
            job("vision-own", "vision", 8, priority=0, submitted=1),
        ),
    )
    outcome = plan(snapshot)
    assert where(outcome) == {"vision-own": [("n1", tuple(range(8)))]}
    assert "nlp-borrow" in outcome.waiting


def _borrowers_snapshot(borrow_order: str, nlp_weight: float) -> Snapshot:
    return Snapshot(
        nodes(2),
        (
            share("lender", 14, LEND, lend_limit={H100: 8}),
            share("nlp", 1, LAB, weight=nlp_weight),
            share("audio", 1, LAB),
        ),
        placed=(
            running("nlp-5", "nlp", "n0", range(5)),
            running("audio-3", "audio", "n0", range(5, 8)),
        ),
        runnable=(job("nlp-2", "nlp", 2, submitted=1), job("audio-2", "audio", 2, submitted=2)),
        borrow_order=borrow_order,
    )


def test_fifo_borrow_order_takes_the_earliest_borrower():
    """FIFO: the earlier-submitted borrower gets the last lendable GPUs."""
    outcome = plan(_borrowers_snapshot("fifo", 1.0))
    assert list(where(outcome)) == ["nlp-2"]
    assert outcome.waiting == {"audio-2": reasons.no_lendable(H100)}


def test_fair_borrow_order_takes_the_lowest_borrowed_per_weight():
    """Fair: nlp borrowed 4, audio 2; with equal weights audio goes first, with nlp's weight 4
    (4/4 = 1 < 2) nlp goes first."""
    assert list(where(plan(_borrowers_snapshot(FAIR, 1.0)))) == ["audio-2"]
    assert list(where(plan(_borrowers_snapshot(FAIR, 4.0)))) == ["nlp-2"]


def _fifo_snapshot(strict: bool) -> Snapshot:
    return Snapshot(
        nodes(1),
        (share("nlp", 8, LAB, strict_fifo=strict),),
        placed=(running("nlp-4", "nlp", "n0", range(4)),),
        runnable=(job("big", "nlp", 8, submitted=1), job("small", "nlp", 4, submitted=2)),
    )


def test_best_effort_fifo_lets_a_smaller_job_pass():
    """The 8-GPU job cannot be placed; the 4-GPU job behind it starts anyway."""
    outcome = plan(_fifo_snapshot(False))
    assert where(outcome) == {"small": [("n0", (4, 5, 6, 7))]}


def test_strict_fifo_blocks_later_jobs_of_the_share():
    """With strict_fifo the 4-GPU job waits behind the 8-GPU job."""
    outcome = plan(_fifo_snapshot(True))
    assert outcome.placements == ()
    assert outcome.waiting["small"] == reasons.strict_fifo("big")


def test_gang_goes_on_distinct_nodes_all_or_none():
    """16 GPUs on 2 nodes take two whole free nodes; 24 on 3 nodes waits with nothing taken."""
    snapshot = Snapshot(
        nodes(3),
        (share("nlp", 48, LAB),),
        placed=(running("small", "nlp", "n0", range(4)),),
        runnable=(
            job("gang-2", "nlp", 16, nodes=2, submitted=1),
            job("gang-3", "nlp", 24, nodes=3, submitted=2),
        ),
    )
    outcome = plan(snapshot)
    assert where(outcome) == {"gang-2": [("n1", tuple(range(8))), ("n2", tuple(range(8)))]}
    assert outcome.waiting == {"gang-3": reasons.no_node(8, 3, H100)}


def test_tightest_fit_keeps_whole_nodes_free():
    """Jobs go to the node with the fewest free GPUs that still fits, on the lowest free
    indices, so the empty node stays whole."""
    snapshot = Snapshot(
        nodes(3),
        (share("nlp", 24, LAB),),
        placed=(
            running("a", "nlp", "n0", (0, 1, 3, 4, 5, 7)),
            running("b", "nlp", "n1", range(4)),
        ),
        runnable=(job("two", "nlp", 2, submitted=1), job("four", "nlp", 4, submitted=2)),
    )
    assert where(plan(snapshot)) == {
        "two": [("n0", (2, 6))],
        "four": [("n1", (4, 5, 6, 7))],
    }


def test_disabled_share_queued_jobs_still_run_and_its_quota_still_lends():
    """Disabling a share refuses new jobs at submission; jobs already queued still run, and a
    LEND share's idle quota is still lent."""
    snapshot = Snapshot(
        nodes(2),
        (share("vision", 8, LEND, state=DISABLED), share("nlp", 4, LAB)),
        runnable=(job("queued", "vision", 4, submitted=1), job("borrow", "nlp", 8, submitted=2)),
    )
    outcome = plan(snapshot)
    assert outcome.rejections == ()
    assert set(where(outcome)) == {"queued", "borrow"}


def test_lowered_limit_makes_jobs_borrowers_and_preemptible():
    """nlp's limit was lowered to 4 while it runs 8: nothing is preempted by itself, but the
    lender's next job reclaims from nlp's latest job."""
    shares = (share("vision", 12, LEND), share("nlp", 4, LEND))
    placed = (
        running("vision-8", "vision", "n1", range(8)),
        running("nlp-a", "nlp", "n0", range(4), started=1),
        running("nlp-b", "nlp", "n0", range(4, 8), started=2),
    )
    assert plan(Snapshot(nodes(2), shares, placed)).preemptions == ()
    outcome = plan(Snapshot(nodes(2), shares, placed, (job("vision-4", "vision", 4),)))
    assert victims(outcome) == {"nlp-b": "vision-4"}


def test_no_repeated_reclaim_while_victims_stop_then_placed():
    """While the victim stops, the reclaiming job waits and preempts nothing more; once the
    GPUs are free it starts on them."""
    first = Snapshot(
        nodes(2),
        (share("vision", 8, LEND), share("nlp", 8, LAB)),
        placed=(
            running("nlp-own", "nlp", "n0", range(8), started=1),
            running("nlp-borrowed", "nlp", "n1", range(8), started=2),
        ),
        runnable=(job("vision-8", "vision", 8),),
    )
    second = advance(first, plan(first), now=10)
    outcome = plan(second)
    assert outcome.preemptions == ()
    assert outcome.waiting == {"vision-8": reasons.reclaiming(8, H100, ["nlp"], 1)}
    third = release_stopped(second)
    assert where(plan(third)) == {"vision-8": [("n1", tuple(range(8)))]}


def test_stopping_victims_count_in_usage_during_the_grace_period():
    """A victim's GPUs count for its share until it has stopped: a RESERVE share preempting in
    its own share for a high-priority job does not place a second job on its free GPUs, which
    would put it above its limit while the victim stops."""
    snapshot = Snapshot(
        nodes(1, gpus=16),
        (share("a", 8, RESERVE, in_share_preemption=True),),
        placed=(running("low", "a", "n0", range(8)),),
        runnable=(
            job("hi", "a", 2, priority=500, submitted=10),
            job("lo2", "a", 2, priority=0, submitted=5),
        ),
    )
    outcome = plan(snapshot)
    assert victims(outcome) == {"low": "hi"}
    assert outcome.placements == ()
    assert outcome.waiting["lo2"] == reasons.at_limit("a", 8, 8, H100)
    # Next cycle, low still stopping for hi: still nothing for lo2.
    outcome = plan(advance(snapshot, outcome, now=20))
    assert outcome.placements == () and outcome.preemptions == ()
    assert outcome.waiting["lo2"] == reasons.at_limit("a", 8, 8, H100)


def test_stopping_victims_quota_is_not_reclaimed_by_a_lower_priority_job():
    """The quota a stopping in-share victim still holds is not free for a lower-priority job of
    the same share to reclaim from a borrower in the same cycle."""
    snapshot = Snapshot(
        nodes(2),
        (share("a", 8, LEND, in_share_preemption=True), share("b", 4, LAB)),
        placed=(
            running("low", "a", "n0", range(8)),
            running("b-own", "b", "n1", range(4), started=1),
            running("b-borrowed", "b", "n1", range(4, 8), started=2),
        ),
        runnable=(
            job("hi", "a", 2, priority=500, submitted=10),
            job("lo2", "a", 2, priority=0, submitted=5),
        ),
    )
    outcome = plan(snapshot)
    assert victims(outcome) == {"low": "hi"}
    assert outcome.waiting["lo2"] == reasons.at_limit("a", 8, 8, H100)


def test_promised_gpus_are_not_taken_by_others():
    """A reclaiming job reserves the free GPUs it will use next to its victim's: a later job
    that would fit on them waits."""
    snapshot = Snapshot(
        nodes(2),
        (share("vision", 8, LEND), share("nlp", 4, LAB), share("audio", 8, LAB)),
        placed=(
            running("nlp-a", "nlp", "n0", range(4), started=0),
            running("audio-a", "audio", "n0", range(4, 8)),
            running("nlp-b", "nlp", "n1", range(4), started=10),
        ),
        runnable=(
            job("vision-8", "vision", 8, priority=5),
            job("audio-4", "audio", 4, priority=0),
        ),
    )
    outcome = plan(snapshot)
    assert victims(outcome) == {"nlp-b": "vision-8"}
    assert outcome.placements == ()
    assert outcome.waiting["audio-4"] == reasons.no_node(4, 1, H100)


def test_placement_reports_gpus_above_the_limit():
    """borrowed is the part of the job above its share's limit when it starts."""
    snapshot = Snapshot(
        nodes(1),
        (share("nlp", 4, LAB),),
        placed=(running("two", "nlp", "n0", range(2)),),
        runnable=(job("four", "nlp", 4),),
    )
    assert [p.borrowed for p in plan(snapshot).placements] == [2]


def test_rejections_for_jobs_that_could_never_run():
    """Unknown share, a GPU type the share has no limit for, uneven gangs, too big per node and
    more nodes than exist are FAILED with a reason; a quota-bound job only waits."""
    snapshot = Snapshot(
        nodes(2),
        (share("nlp", 4, LAB, borrow_limit=0),),
        runnable=(
            job("ghost", "nobody", 1),
            RunnableJob("a100", "nlp", "a100", 1),
            job("uneven", "nlp", 9, nodes=2),
            job("huge", "nlp", 16),
            job("wide", "nlp", 24, nodes=3),
            job("quota", "nlp", 8),
        ),
    )
    outcome = plan(snapshot)
    assert {r.job_id: r.reason for r in outcome.rejections} == {
        "ghost": reasons.unknown_share("nobody"),
        "a100": reasons.no_limit_for_type("nlp", "a100"),
        "uneven": reasons.not_divisible(9, 2),
        "huge": reasons.node_too_small(16, H100, 8),
        "wide": reasons.too_few_nodes(3, 8, H100, 2),
    }
    assert outcome.waiting == {"quota": reasons.larger_than_borrow_limit(8, H100, "nlp", 4, 0)}
    assert outcome.waiting["quota"] == (
        "needs 8 h100 but share nlp may use at most its limit of 4 (its borrow limit is 0)"
    )


def test_same_snapshot_gives_the_same_plan():
    """Planning is deterministic."""
    snapshot = _tries_snapshot(8)
    assert plan(snapshot) == plan(snapshot)
