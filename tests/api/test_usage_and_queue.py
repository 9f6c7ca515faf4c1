"""Live usage (own, borrowed, lent) and the order of the queue snapshot."""

from __future__ import annotations

from scheduler.engine.order import BORROWING, WITHIN_LIMIT
from scheduler.jobs.selectors import queue_snapshot
from scheduler.jobs.services import job_submit
from scheduler.models import Job, Node
from shares.selectors import share_usage
from shares.services import share_update
from tests.api.helpers import place


def submit(world, persona, share, gpus, priority=0, gpu_type="h100"):
    job, _ = job_submit(
        user=world.users[persona],
        share_name=share,
        gpu_type=gpu_type,
        gpus=gpus,
        nodes=max(1, gpus // 8),
        command="x",
        priority=priority,
    )
    return job


def test_a_borrower_draws_on_the_lenders_idle_quota(world):
    """research runs 16 h100 with a limit of 8: it borrows 8, all lent by vision (idle)."""
    job = submit(world, "bob", "research", 16)
    place(job, world.nodes["h100-0"], list(range(8)))
    usage = share_usage()
    research, vision = usage.shares["research"]["h100"], usage.shares["vision"]["h100"]
    assert (research.used, research.own, research.borrowed, research.lent) == (16, 8, 8, 0)
    assert (vision.used, vision.own, vision.borrowed, vision.lent, vision.lendable) == (
        0,
        0,
        0,
        8,
        0,
    )
    assert usage.pool["h100"].free_pool == 0


def test_borrowing_draws_on_the_free_pool_first(world):
    """A third h100 node (8 GPUs no share covers) is the free pool: a borrower of 4 takes it
    from there, and vision lends nothing."""
    Node.objects.create(name="h100-2", gpu_type="h100", gpus=8)
    job = submit(world, "bob", "research", 8)
    Job.objects.filter(pk=job.pk).update(state=Job.State.RUNNING, gpus=12)
    usage = share_usage()
    assert usage.pool["h100"].free_pool == 8
    assert usage.pool["h100"].borrowed_from_pool == 4
    assert usage.shares["vision"]["h100"].lent == 0


def test_lenders_lend_in_proportion_and_reserve_lends_nothing(world, inference_share):
    """Two lenders with 8 and 4 lendable GPUs cover a borrow of 6 as 4 and 2; a RESERVE share
    and the part above a lend_limit lend nothing."""
    share_update(
        share=world.shares["inference"],
        actor=None,
        source="api",
        capacity_limits={"l4": 2, "h100": 4},
    )
    Node.objects.create(name="h100-2", gpu_type="h100", gpus=8)
    share_update(share=world.shares["vision"], actor=None, source="api", lend_limit=4)
    Node.objects.filter(name="h100-2").update(gpus=4)  # capacity 20 = 8 + 8 + 4: no free pool
    share_update(
        share=world.shares["inference"], actor=None, source="api", strategy="LEND"
    )  # inference lends 4 h100, vision at most 4
    job = submit(world, "bob", "research", 8)
    Job.objects.filter(pk=job.pk).update(state=Job.State.RUNNING, gpus=14)
    usage = share_usage()
    assert usage.shares["research"]["h100"].borrowed == 6
    assert (usage.shares["vision"]["h100"].lent, usage.shares["inference"]["h100"].lent) == (3, 3)
    share_update(share=world.shares["inference"], actor=None, source="api", strategy="RESERVE")
    usage = share_usage()
    assert (usage.shares["vision"]["h100"].lent, usage.shares["inference"]["h100"].lent) == (4, 0)


def test_queue_puts_jobs_within_their_limit_before_borrowers(world):
    """research already runs 8 h100 (its limit): its new job borrows, so vision's job — within
    vision's limit — goes first even with a lower priority."""
    running = submit(world, "bob", "research", 8)
    place(running, world.nodes["h100-0"], list(range(8)))
    borrower = submit(world, "bob", "research", 8, priority=100)
    owner = submit(world, "carol", "vision", 8, priority=1)
    later_owner = submit(world, "carol", "vision", 8, priority=50)
    front = queue_snapshot().front
    assert [(entry.job.pk, entry.pass_) for entry in front] == [
        (later_owner.pk, WITHIN_LIMIT),
        (borrower.pk, BORROWING),
        (owner.pk, BORROWING),
    ]


def test_queue_endpoint_shape(world, inference_share):
    submit(world, "bob", "research", 8)
    data = world.client("root").get("/api/v1/queue/").json()
    assert data["runnable"] == 1
    assert data["front"][0]["position"] == 1
    assert data["front"][0]["considered_as"] == WITHIN_LIMIT
    assert data["pool"]["h100"]["capacity"] == 16
    assert set(data["shares"]) == {"research", "vision", "inference"}
