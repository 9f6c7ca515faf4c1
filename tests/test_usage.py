"""Usage accounting: own, borrowed and lent GPUs per share, against hand-computed numbers."""

from __future__ import annotations

import pytest

from scheduler.models import Job, Node
from scheduler.usage import ShareLimit, current_usage, usage_by_share


def by_share(rows):
    return {(r.share, r.gpu_type): r for r in rows}


def test_borrowing_draws_on_the_free_pool_first_then_lenders_in_proportion():
    """Capacity 32, limits 8+8+8 → free pool 8. research borrows 12: 8 from the pool, 4 from the
    lenders: vision can lend its 8 idle, so it lends 4;
    the RESERVE share inference lends nothing."""
    rows = by_share(
        usage_by_share(
            limits=[
                ShareLimit("research", "h100", 8, "LEND_AND_BORROW"),
                ShareLimit("vision", "h100", 8, "LEND"),
                ShareLimit("inference", "h100", 8, "RESERVE"),
            ],
            used={("research", "h100"): 20, ("inference", "h100"): 2},
            capacity={"h100": 32},
            demand={("vision", "h100"): 4},
        )
    )
    research, vision, inference = (rows[(s, "h100")] for s in ("research", "vision", "inference"))
    assert (research.own, research.borrowed, research.lent) == (8, 12, 0)
    assert (vision.own, vision.borrowed, vision.lent, vision.idle) == (0, 0, 4, 4)
    assert (inference.own, inference.lent, inference.idle) == (2, 0, 6)
    assert vision.demand == 4


def test_lend_limit_caps_what_a_share_lends_and_shares_split_by_lendable():
    rows = by_share(
        usage_by_share(
            limits=[
                ShareLimit("a", "l4", 8, "LEND", lend_limit=2),
                ShareLimit("b", "l4", 8, "LEND"),
                ShareLimit("c", "l4", 4, "LEND_AND_BORROW"),
            ],
            used={("c", "l4"): 9},
            capacity={"l4": 20},
        )
    )
    # c borrows 5, the pool is empty: a can lend 2, b 8 → a lends 1, b lends 4.
    assert rows[("a", "l4")].lent == 1.0
    assert rows[("b", "l4")].lent == 4.0


def test_a_share_without_a_limit_for_a_type_borrows_everything_it_uses():
    rows = by_share(
        usage_by_share(
            limits=[ShareLimit("a", "h100", 8, "LEND")],
            used={("b", "h100"): 4},
            capacity={"h100": 8},
        )
    )
    assert rows[("b", "h100")].borrowed == 4
    assert rows[("a", "h100")].lent == 4.0


@pytest.mark.django_db
def test_current_usage_reads_placed_and_runnable_jobs(vision_share, research_share, alice):
    Node.objects.create(name="n0", gpu_type="h100", gpus=8)
    Node.objects.create(name="n1", gpu_type="h100", gpus=8)
    for state, gpus in ((Job.State.RUNNING, 8), (Job.State.PREEMPTING, 4), (Job.State.RUNNABLE, 2),
                        (Job.State.SUCCEEDED, 8)):  # fmt: skip
        Job.objects.create(
            share=research_share, submitted_by=alice, gpu_type="h100", gpus=gpus,
            command="true", state=state,
        )  # fmt: skip
    rows = by_share(current_usage())
    assert (rows[("research", "h100")].own, rows[("research", "h100")].borrowed) == (8, 4)
    assert rows[("research", "h100")].demand == 2
    assert rows[("vision", "h100")].lent == 4.0
