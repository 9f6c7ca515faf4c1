"""The queue order lives once, in scheduler/engine/order.py: the API's queue snapshot and the
dashboards' queue page show the order in which the engine itself then places the jobs, on a
strict-FIFO share and with a job promised GPUs."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from dashboards.selectors import queue_front
from scheduler import engine
from scheduler.cycle.snapshot import cycle_snapshot
from scheduler.engine.order import BORROWING, PROMISED, WITHIN_LIMIT
from scheduler.jobs.services import job_submit
from shares.models import QuotaShare, ShareChange, Team
from shares.services import share_create, share_update
from tests.api.helpers import place, preempt
from tests.conftest import make_node

pytestmark = pytest.mark.django_db


@pytest.fixture
def queue(root, vision_share, research_share):
    """Four 8-GPU h100 nodes; the world's shares vision (LEND, 8) and research (LEND_AND_BORROW,
    8), research made strict FIFO, and a third share infer (LEND_AND_BORROW, 8). research runs 2
    GPUs. infer's job i0 was preempted for vision's v1 and is back in the queue, so v1 is
    promised the GPUs i0 gave up. Waiting, in submission order: i0 (4), r3 (research, 8: it
    would borrow), r4 (research, 2: it would fit research's limit, but strict FIFO keeps it
    behind r3), i1 (4), v1 (8)."""
    nodes = [make_node(f"h100-{n}") for n in range(4)]
    share_update(
        share=research_share, actor=root, source=ShareChange.Source.COMMAND, strict_fifo=True
    )
    share_create(
        name="infer",
        team=Team.objects.create(name="Inference", slug="inference"),
        capacity_limits={"h100": 8},
        strategy=QuotaShare.Strategy.LEND_AND_BORROW,
    )

    def submit(share: str, gpus: int, name: str):
        job, _ = job_submit(
            user=root, share_name=share, gpu_type="h100", gpus=gpus, command="x", name=name
        )
        return job

    r1 = submit("research", 2, "r1")
    place(r1, nodes[0], [0, 1])
    jobs = {"i0": submit("infer", 4, "i0")}
    victim = place(jobs["i0"], nodes[1], [0, 1, 2, 3])
    for share, gpus, name in (("research", 8, "r3"), ("research", 2, "r4"), ("infer", 4, "i1"),
                              ("vision", 8, "v1")):  # fmt: skip
        jobs[name] = submit(share, gpus, name)
    preempt(victim, jobs["v1"])
    return root, jobs


EXPECTED = [
    ("v1", PROMISED),
    ("i0", WITHIN_LIMIT),
    ("i1", WITHIN_LIMIT),
    ("r3", BORROWING),
    ("r4", BORROWING),
]


def engine_placement_order() -> list[str]:
    """The order in which the engine places the jobs of the cycle's own snapshot (every job
    fits, so it places each one as its turn comes)."""
    snapshot, _context = cycle_snapshot()
    plan = engine.plan(snapshot)
    assert not plan.waiting and not plan.preemptions
    return [placement.job_id for placement in plan.placements]


def test_the_engine_places_promised_then_within_limit_then_borrowers(queue):
    _admin, jobs = queue
    assert engine_placement_order() == [str(jobs[name].pk) for name, _pass in EXPECTED]


def test_the_api_queue_snapshot_shows_the_engines_order(queue):
    admin, jobs = queue
    client = APIClient()
    client.force_authenticate(admin)
    front = client.get("/api/v1/queue/").json()["front"]
    assert [(e["job"]["id"], e["considered_as"]) for e in front] == [
        (jobs[name].pk, pass_) for name, pass_ in EXPECTED
    ]
    assert [str(e["job"]["id"]) for e in front] == engine_placement_order()
    assert [e["position"] for e in front] == [1, 2, 3, 4, 5]


def test_the_dashboards_queue_page_shows_the_engines_order(queue):
    _admin, jobs = queue
    entries = queue_front()
    assert [(e.job_id, e.pass_) for e in entries] == [
        (jobs[name].pk, pass_) for name, pass_ in EXPECTED
    ]
    assert [str(e.job_id) for e in entries] == engine_placement_order()
    assert [e.within_limit for e in entries] == [True, True, True, False, False]
