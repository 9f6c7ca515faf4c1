"""Usage rows for history and metrics: own, borrowed, lent, idle and demand per share."""

from __future__ import annotations

import pytest

from scheduler.models import Job, Node
from shares.selectors import current_usage


@pytest.mark.django_db
def test_current_usage_reads_placed_and_runnable_jobs(vision_share, research_share, alice):
    """16 h100 in READY nodes, limits 8 + 8: no free pool. research holds 12 (8 own + 4
    borrowed, the PREEMPTING job still counts) and wants 2 more; vision lends the 4."""
    Node.objects.create(name="n0", gpu_type="h100", gpus=8)
    Node.objects.create(name="n1", gpu_type="h100", gpus=8)
    for state, gpus in ((Job.State.RUNNING, 8), (Job.State.PREEMPTING, 4), (Job.State.RUNNABLE, 2),
                        (Job.State.SUCCEEDED, 8)):  # fmt: skip
        Job.objects.create(
            share=research_share, submitted_by=alice, gpu_type="h100", gpus=gpus,
            command="true", state=state,
        )  # fmt: skip
    rows = {(r.share, r.gpu_type): r for r in current_usage()}
    research, vision = rows[("research", "h100")], rows[("vision", "h100")]
    assert (research.own, research.borrowed, research.demand, research.usage) == (8, 4, 2, 12)
    assert (vision.own, vision.lent, vision.idle, vision.demand) == (0, 4, 4, 0)
