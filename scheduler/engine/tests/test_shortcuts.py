"""Each shortcut of the victim search, checked against the reference search of `victims.py` on
random clusters: whenever a shortcut gives an answer, it is the reference's answer."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from scheduler.engine import Snapshot, plan, planner, shortcuts
from scheduler.engine.tests.test_properties import busy_clusters, clusters, next_cycle
from scheduler.engine.victims import TRY_BORROWERS, TRY_BOTH, TRY_OWN_SHARE, find_victims

CHECKS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _compare_every_search(original):
    """Wrap the plan's victim search: before each search, ask every shortcut and the reference,
    and check that each shortcut's answer, when it gives one, is the reference's."""

    def search(self, job, attempt, promised, base_deltas):
        reference = find_victims(
            job, attempt, self.ledger, self.pool, self.candidates, promised, base_deltas
        )
        fast = self.shortcuts
        within_limit = attempt != TRY_OWN_SHARE
        undecided = True
        if attempt != TRY_BORROWERS and not fast.own_victims_may_suffice(
            job, within_limit, base_deltas.get(job.share, 0)
        ):
            assert reference is None, f"{job.id}: own victims judged too few"
            undecided = False
        reachable = (
            promised or attempt == TRY_OWN_SHARE or fast.room().may_fit(job, attempt == TRY_BOTH)
        )
        if not reachable:
            assert reference is None, f"{job.id}: judged unreachable"
            undecided = False
        if attempt == TRY_OWN_SHARE and not fast.own_victims_may_fit(job, promised):
            assert reference is None, f"{job.id}: own victims judged without room"
            undecided = False
        if undecided and attempt == TRY_BOTH and not promised and job.nodes == 1:
            quick = shortcuts._NodeFirstSearch(fast, job).victims()
            if quick is not shortcuts._UNDECIDED:
                assert quick == reference, f"{job.id}: node-first search differs"
        walk = shortcuts._Walk(fast, job, within_limit, promised, base_deltas)
        walked = walk.pruned() if walk.greedy(fast._streams(job, attempt)) else None
        assert walked == reference, f"{job.id}: the walk differs"
        assert fast.search(job, attempt, promised, base_deltas) == reference
        return original(self, job, attempt, promised, base_deltas)

    return search


def _plans_over_cycles(snapshot: Snapshot, cycles: int) -> list:
    outcomes = []
    history: dict[str, tuple[float, ...]] = {}
    for cycle in range(cycles):
        outcome = plan(snapshot)
        outcomes.append(outcome)
        snapshot = next_cycle(snapshot, outcome, cycle, finish=False, history=history)
    return outcomes


def _check_shortcuts(snapshot: Snapshot, cycles: int) -> None:
    original = planner._TypePlan._search
    planner._TypePlan._search = _compare_every_search(original)
    try:
        _plans_over_cycles(snapshot, cycles)
    finally:
        planner._TypePlan._search = original


@CHECKS
@given(cluster=busy_clusters())
def test_shortcuts_answer_as_the_reference_on_busy_clusters(cluster):
    """On clusters full of small jobs of many shares, over a few cycles (victims stopping for
    their job, then back in the queue), every shortcut that answers a search answers as the
    reference search: no victim set, or exactly the reference's victims."""
    _check_shortcuts(cluster, cycles=3)


@CHECKS
@given(cluster=clusters())
def test_shortcuts_answer_as_the_reference_on_small_clusters(cluster):
    """The same on small clusters of every strategy, limit and in-share setting, over more
    cycles."""
    _check_shortcuts(cluster, cycles=6)
