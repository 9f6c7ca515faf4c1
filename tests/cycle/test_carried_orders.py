"""A node whose only change is new orders gets them in its wake-up (Redis pub/sub,
scheduler.cycle.wake): the poll it wakes answers with the orders it had read plus those,
without reading them again. So what the wake-up carries must be what reading the orders again
gives: checked here on the message as published, for a placement (a gang's too), a reclaim, a
cancel before the start and a gang's other node. The real database and Redis; the agents are
the node services."""

from __future__ import annotations

import json

import pytest

from portal.redis import redis_client
from scheduler.cycle.run import cycle_run
from scheduler.cycle.wake import _channel
from scheduler.jobs.services import job_cancel, job_submit
from scheduler.models import Job, JobAttempt, Node
from scheduler.nodes.attempts import END_LOST, attempt_exited
from scheduler.nodes.services import node_poll_orders, orders_with_news
from tests.conftest import make_node
from tests.conftest import start_latest_attempt as run

pytestmark = pytest.mark.django_db


@pytest.fixture
def nodes(world):
    return make_node("node-0"), make_node("node-1")


@pytest.fixture
def published(django_capture_on_commit_callbacks):
    """`published(step)`: run `step` (a cycle, a report), commit it, and return the messages
    its commit published, by node id: what the nodes' waiting polls receive."""

    def messages_of(step) -> dict[int, dict | str]:
        pubsub = redis_client().pubsub()
        pubsub.psubscribe(_channel("*"))
        pubsub.get_message(timeout=5)  # the subscription's confirmation
        try:
            with django_capture_on_commit_callbacks(execute=True):
                step()
            messages = {}
            while (message := pubsub.get_message(timeout=0.5)) is not None:
                node_id = int(message["channel"].rsplit(b":", 1)[-1])
                data = message["data"]
                messages[node_id] = "read again" if data == b"1" else json.loads(data)
            return messages
        finally:
            pubsub.close()

    return messages_of


def with_news(orders: dict, news: dict, running: set[int]) -> dict:
    """What the woken poll answers: the orders it read and the news its wake-up carried (JSON
    both: the stop orders of either may come in another order than a read's)."""
    merged = orders_with_news(orders, news, running)
    return {**merged, "stop": sorted(merged["stop"], key=lambda o: o["attempt"])}


def submit(user, share: str, gpus: int, nodes: int = 1) -> Job:
    job, _ = job_submit(user=user, share_name=share, gpu_type="h100", gpus=gpus, nodes=nodes,
                        command="true")  # fmt: skip
    return job


def node_of(job: Job) -> Node:
    attempt = JobAttempt.objects.filter(job=job).latest("number")
    return Node.objects.get(name=attempt.allocations[0]["node"])


def test_a_reclaim_sends_the_borrower_s_stop_order_in_its_node_s_wake_up(world, nodes, published):
    borrowers = [submit(world.alice, "research", gpus=8) for _ in range(2)]
    cycle_run(force=True)
    for job in borrowers:
        run(job)
    node_polls = {n.pk: node_poll_orders(node=n, running={a.pk for a in JobAttempt.objects.filter(
        gpus__node=n, ended_at__isnull=True).distinct()}) for n in nodes}  # fmt: skip
    submit(world.carol, "vision", gpus=8)

    messages = published(lambda: cycle_run(force=True))

    victim = JobAttempt.objects.get(stop_requested_at__isnull=False)
    node = Node.objects.get(name=victim.allocations[0]["node"])
    stop = {"attempt": victim.pk, "grace_seconds": 2, "started": True}
    assert messages == {node.pk: {"run": [], "stop": [stop]}}
    assert with_news(node_polls[node.pk], messages[node.pk], {victim.pk}) == node_poll_orders(
        node=node, running={victim.pk}
    )


def test_a_cancel_before_the_start_takes_the_run_order_back_in_the_wake_up(world, nodes, published):
    job = submit(world.alice, "research", gpus=2)
    cycle_run(force=True)
    node = node_of(job)
    before = node_poll_orders(node=node, running=set())  # the agent has the run order
    assert [o["job"] for o in before["run"]] == [job.pk]
    job_cancel(job=Job.objects.get(pk=job.pk), user=world.alice)

    messages = published(lambda: cycle_run(force=True))

    attempt = JobAttempt.objects.get(job=job)
    stop = {"attempt": attempt.pk, "grace_seconds": 2, "started": False}
    assert messages == {node.pk: {"run": [], "stop": [stop]}}
    after = with_news(before, messages[node.pk], set())
    assert after == node_poll_orders(node=node, running=set()) == {"run": [], "stop": [stop]}


def test_a_cancel_before_the_start_on_a_node_that_asks_to_start_frees_its_gpus_at_once(
    world, published
):
    """Where the node's agent starts only what the portal grants (`Node.asks_to_start`), a job
    cancelled before its start was granted ends CANCELLED in the cycle that takes the cancel,
    with no stop order: that same cycle gives its GPUs to the job waiting for them, and the
    node's waiting poll reads its orders again (the cancelled run order is gone)."""
    for name in ("node-0", "node-1"):
        make_node(name, asks_to_start=True)
    cancelled = submit(world.alice, "research", gpus=8)
    submit(world.carol, "vision", gpus=8)
    cycle_run(force=True)
    waiting = submit(world.alice, "research", gpus=8)
    cycle_run(force=True)
    assert Job.objects.get(pk=waiting.pk).state == Job.State.RUNNABLE
    node = node_of(cancelled)
    job_cancel(job=Job.objects.get(pk=cancelled.pk), user=world.alice)

    messages = published(lambda: cycle_run(force=True))

    attempt = JobAttempt.objects.get(job=cancelled)
    assert attempt.outcome == JobAttempt.Outcome.CANCELLED and attempt.started_at is None
    assert not attempt.gpus.filter(released=False).exists()
    cancelled = Job.objects.get(pk=cancelled.pk)
    assert cancelled.state == Job.State.CANCELLED
    assert cancelled.reason == "cancelled before it started; its GPUs were released at once"
    assert node_of(waiting) == node
    assert messages == {node.pk: "read again"}
    (run,) = node_poll_orders(node=node, running=set())["run"]
    assert run["job"] == waiting.pk
    assert node_poll_orders(node=node, running=set())["stop"] == []


def test_a_gang_member_s_end_sends_the_stop_order_to_its_other_nodes(world, nodes, published):
    job = submit(world.alice, "research", gpus=8, nodes=2)
    cycle_run(force=True)
    run(job)
    attempt = JobAttempt.objects.get(job=job)
    lost, other = (Node.objects.get(name=a["node"]) for a in attempt.allocations)
    before = node_poll_orders(node=other, running={attempt.pk})

    messages = published(lambda: attempt_exited(node=lost, attempt_id=attempt.pk, end=END_LOST))

    stop = {"attempt": attempt.pk, "grace_seconds": 2, "started": True}
    assert messages == {other.pk: {"run": [], "stop": [stop]}}
    assert with_news(before, messages[other.pk], {attempt.pk}) == node_poll_orders(
        node=other, running={attempt.pk}
    )


def test_a_placement_sends_its_run_order_to_a_node_that_runs_a_job(world, nodes, published):
    running = submit(world.alice, "research", gpus=4)
    cycle_run(force=True)
    run(running)
    mine = JobAttempt.objects.get(job=running).pk
    runs = {n.pk: {mine} if n == node_of(running) else set() for n in nodes}
    before = {n.pk: node_poll_orders(node=n, running=runs[n.pk]) for n in nodes}
    placed = submit(world.alice, "research", gpus=4)

    messages = published(lambda: cycle_run(force=True))

    node = node_of(placed)
    attempt = JobAttempt.objects.get(job=placed)
    assert set(messages) == {node.pk}
    assert [(o["attempt"], o["started"]) for o in messages[node.pk]["run"]] == [(attempt.pk, False)]
    assert messages[node.pk]["stop"] == []
    after = with_news(before[node.pk], messages[node.pk], runs[node.pk])
    assert after == node_poll_orders(node=node, running=runs[node.pk])


def test_a_gang_s_run_order_goes_to_each_of_its_nodes_with_their_gpus(world, nodes, published):
    gang = submit(world.alice, "research", gpus=16, nodes=2)  # 8 GPUs on each node
    before = {n.pk: node_poll_orders(node=n, running=set()) for n in nodes}

    messages = published(lambda: cycle_run(force=True))

    attempt = JobAttempt.objects.get(job=gang)
    assert set(messages) == {n.pk for n in nodes}
    for node in nodes:
        (order,) = messages[node.pk]["run"]
        assert order["attempt"] == attempt.pk and order["gpu_indices"] == list(range(8))
        assert order["command"] == "true" and order["job"] == gang.pk
        after = with_news(before[node.pk], messages[node.pk], set())
        assert after == node_poll_orders(node=node, running=set())
