"""The split of "lent" among lenders and what follows a preempted attempt live once, in
scheduler/engine/accounting.py and scheduler/engine/outcomes.py: the live usage report (API,
dashboards, metrics) and the simulator agree on the same cluster, and so do a node's report
of a preemption and the simulator's."""

from __future__ import annotations

import pytest
from django.utils import timezone

from scheduler.engine import accounting, outcomes
from scheduler.jobs.services import job_submit
from scheduler.models import Job, JobAttempt
from scheduler.nodes.attempts import attempt_exited
from scheduler.simulator import simulate
from scheduler.simulator.scenario import parse_scenario
from shares.models import QuotaShare, Team
from shares.selectors import share_usage
from shares.services import share_create
from tests.api.helpers import place
from tests.conftest import make_node

pytestmark = pytest.mark.django_db

SHARES = [
    {"name": "vision", "capacity_limits": {"h100": 8}, "strategy": "LEND", "grace_seconds": 0},
    {"name": "infer", "capacity_limits": {"h100": 8}, "strategy": "LEND_AND_BORROW",
     "grace_seconds": 0},
    {"name": "research", "capacity_limits": {"h100": 8}, "strategy": "LEND_AND_BORROW",
     "grace_seconds": 0},
]  # fmt: skip
# infer runs 4 of its 8; research runs 8 + 5, borrowing 5 from vision (8 idle) and infer (4
# idle), in proportion: 3.33 and 1.67 GPUs; in whole GPUs 3 and 2.
JOBS = [("infer", 4), ("research", 8), ("research", 5)]


def test_the_live_report_splits_lent_gpus_as_the_simulator_does(root, vision_share, research_share):
    """The world's vision and research, and a third share infer, on three 8-GPU nodes."""
    nodes = [make_node(f"gpu-{n}") for n in range(3)]
    share_create(
        name="infer",
        team=Team.objects.create(name="Inference", slug="inference"),
        capacity_limits={"h100": 8},
        strategy=QuotaShare.Strategy.LEND_AND_BORROW,
    )
    for node, (share, gpus) in zip(nodes, JOBS, strict=True):
        job, _ = job_submit(user=root, share_name=share, gpu_type="h100", gpus=gpus, command="x")
        place(job, node, list(range(gpus)))
    live = share_usage().shares

    result = simulate(
        parse_scenario(
            {
                "nodes": [{"name": "gpu", "gpu_type": "h100", "gpus": 8, "count": 3}],
                "shares": SHARES,
                "jobs": [
                    {
                        "id": f"j{n}",
                        "share": share,
                        "gpu_type": "h100",
                        "gpus": gpus,
                        "submit": 0,
                        "duration": 3600,
                        "priority": 0,
                    }
                    for n, (share, gpus) in enumerate(JOBS)
                ],  # fmt: skip
            }
        )
    ).data
    simulated = {name: share["gpu_hours_lent"] for name, share in result["shares"].items()}
    assert simulated["vision"] == pytest.approx(10 / 3, abs=0.01)
    assert simulated["infer"] == pytest.approx(5 / 3, abs=0.01)
    assert accounting.in_whole_gpus(simulated) == {
        name: live[name]["h100"].lent for name in simulated
    }
    assert {name: live[name]["h100"].lent for name in live} == {
        "vision": 3, "infer": 2, "research": 0,
    }  # fmt: skip


def test_a_job_past_max_preemptions_fails_alike_live_and_simulated(root, research_share):
    """max_preemptions 0: the first preemption fails the job, with the same reason."""
    admin = root
    node = make_node("gpu-0")
    victim, _ = job_submit(
        user=admin, share_name="research", gpu_type="h100", gpus=8, command="x", max_preemptions=0
    )
    claimant, _ = job_submit(
        user=admin, share_name="research", gpu_type="h100", gpus=8, command="x"
    )
    attempt = place(victim, node, list(range(8)))
    JobAttempt.objects.filter(pk=attempt.pk).update(
        stop_requested_at=timezone.now(), preempted_for=claimant
    )
    Job.objects.filter(pk=victim.pk).update(state=Job.State.PREEMPTING)
    attempt_exited(node=node, attempt_id=attempt.pk, end="exit", exit_code=143, signalled=True)
    victim.refresh_from_db()
    expected = outcomes.after_preemption(preemptions=0, max_preemptions=0)
    assert (victim.state, victim.reason) == (expected.state, expected.reason)

    result = simulate(
        parse_scenario(
            {
                "nodes": [{"name": "gpu", "gpu_type": "h100", "gpus": 8}],
                "shares": [
                    {
                        "name": "research",
                        "capacity_limits": {"h100": 8},
                        "strategy": "LEND_AND_BORROW",
                        "in_share_preemption": True,
                        "grace_seconds": 0,
                    },
                ],
                "jobs": [
                    {
                        "id": "victim",
                        "share": "research",
                        "gpu_type": "h100",
                        "gpus": 8,
                        "submit": 0,
                        "duration": 100,
                        "priority": 0,
                        "max_preemptions": 0,
                    },
                    {
                        "id": "claimant",
                        "share": "research",
                        "gpu_type": "h100",
                        "gpus": 8,
                        "submit": 10,
                        "duration": 100,
                        "priority": 5,
                    },
                ],
            }  # fmt: skip
        )
    ).data
    simulated = {job["id"]: job for job in result["jobs"]}["victim"]
    assert (simulated["state"], simulated["reason"]) == (expected.state, expected.reason)
