"""What a node agent or a connector sends once the portal answers again after an outage, on a
live portal: its events go in batches the portal takes (it refuses more than 1000 events, or a
body over its size limit, in a request), oldest first, one after the other, until all are taken;
and an event the portal refuses leaves the outbox, named in the log, so that it no longer holds
back the events queued beside and after it."""

from __future__ import annotations

import json
import logging

import pytest
from django.utils import timezone

from scheduler.agent.core import Agent
from scheduler.agent.gpus import fake_gpus
from scheduler.agent.outbox import MAX_BATCH_BYTES, MAX_BATCH_EVENTS, EndedAttempts, Outbox
from scheduler.agent.protocol import (
    CONNECTOR_REGISTER_PATH,
    CONNECTOR_REPORT_PATH,
    END_EXIT,
    EVENT_EXITED,
    EVENT_LOG,
    LOG_TAIL_CHARS,
)
from scheduler.agent.transport import PortalClient
from scheduler.cycle.run import cycle_run
from scheduler.jobs.services import job_submit
from scheduler.models import GpuAssignment, Job, JobAttempt, Node
from scheduler.nodes.views import MAX_EVENTS
from tests.live import JOIN_TOKEN


def _exit(attempt: int, **more) -> dict:
    return {"type": EVENT_EXITED, "attempt": attempt, "end": END_EXIT, "exit_code": 0, **more}


def _sent_until_empty(outbox: Outbox, send, *, most: int) -> int:
    """Send the outbox's batches one request at a time, as the reporter does when woken for
    what is left, until it is empty or `most` requests went; the number that went."""
    for requests in range(most):
        if not len(outbox):
            return requests
        send()
    return most


def test_a_request_carries_the_oldest_events_in_order_within_the_portals_limits():
    """Two requests at once carry the oldest batch and the next one; neither holds more events
    or more JSON than the portal takes."""
    outbox = Outbox(EndedAttempts())
    for attempt in range(1, 2501):
        outbox.add(_exit(attempt, log_tail="step done\n" * 100))
    first, second = outbox.take(), outbox.take()
    assert MAX_BATCH_EVENTS < MAX_EVENTS
    assert [e["attempt"] for e in first + second] == list(range(1, len(first + second) + 1))
    for batch in (first, second):
        assert 0 < len(batch) <= MAX_BATCH_EVENTS
        assert len(json.dumps({"events": batch})) <= MAX_BATCH_BYTES


def _connector_nodes(http: PortalClient, count: int, gpus: int) -> tuple[str, list[Node]]:
    """Register a connector of `count` nodes of `gpus` h100 each: its token and its nodes."""
    nodes = [{"name": f"sn{i:03d}", "gpu_type": "h100", "gpus": gpus, "state": "READY"}
             for i in range(count)]  # fmt: skip
    response = http.post(CONNECTOR_REGISTER_PATH, timeout=30, json={
        "join_token": JOIN_TOKEN, "name": "hpc", "kind": "slurm", "nodes": nodes})  # fmt: skip
    assert response.status_code == 201, response.text
    return response.json()["token"], list(Node.objects.filter(name__in=[n["name"] for n in nodes]))


def _running_on_every_gpu(world, nodes: list[Node], count: int) -> list[int]:
    """`count` one-GPU jobs of alice's running on the nodes' GPUs, as placed and started
    before the outage: their attempts' ids."""
    now = timezone.now()
    jobs = Job.objects.bulk_create(
        Job(share=world.shares["research"], submitted_by=world.alice, gpu_type="h100", gpus=1,
            command="python train.py", state=Job.State.RUNNING, reason="running",
            attempt_count=1, started_at=now)
        for _ in range(count)
    )  # fmt: skip
    gpus = [(node, index) for node in nodes for index in range(node.gpus)][:count]
    attempts = JobAttempt.objects.bulk_create(
        JobAttempt(job=job, number=1, started_at=now,
                   allocations=[{"node": node.name, "gpu_indices": [index]}])
        for job, (node, index) in zip(jobs, gpus, strict=True)
    )  # fmt: skip
    GpuAssignment.objects.bulk_create(
        GpuAssignment(attempt=attempt, node=node, gpu_index=index)
        for attempt, (node, index) in zip(attempts, gpus, strict=True)
    )
    return [attempt.pk for attempt in attempts]


@pytest.mark.live
def test_a_connectors_2500_exits_after_an_outage_all_reach_the_portal(world, live):
    """A Slurm cluster's 2,500 jobs ended while its connector could not reach the portal, each
    exit with its log tail (far more events, and bytes, than one request may carry): once the
    portal answers again, every job has succeeded and the outbox is empty."""
    system = live()
    system.start_web()
    http = PortalClient(system.url)
    token, nodes = _connector_nodes(http, count=40, gpus=64)
    attempts = _running_on_every_gpu(world, nodes, 2500)
    outbox = Outbox(EndedAttempts())
    for attempt in attempts:
        outbox.add(_exit(attempt, log_tail=f"attempt {attempt}: step done\n" * 40))
    headers = {"Authorization": f"Connector {token}"}
    _sent_until_empty(
        outbox, lambda: outbox.report(http, CONNECTOR_REPORT_PATH, lambda: headers), most=20
    )
    assert len(outbox) == 0
    ended = Job.objects.filter(attempts__in=attempts)
    assert ended.filter(state=Job.State.SUCCEEDED).count() == 2500
    assert JobAttempt.objects.filter(pk__in=attempts, ended_at__isnull=True).count() == 0


def _agent_with_jobs(system, tmp_path, world, count: int) -> tuple[Agent, list[int]]:
    """A registered agent of an 8-GPU node and `count` one-GPU jobs placed on it: their
    attempts' ids."""
    agent = Agent(portal=system.url, join_token=JOIN_TOKEN, name="node-a", gpu_type="h100",
                  gpus=fake_gpus(8, "h100"), work_dir=tmp_path / "agent",
                  checkpoint_root=system.checkpoints)  # fmt: skip
    agent.register()
    jobs = [
        job_submit(user=world.alice, share_name="research", gpu_type="h100", gpus=1,
                   command="python train.py")[0]
        for _ in range(count)
    ]  # fmt: skip
    cycle_run(force=True)
    attempts = list(JobAttempt.objects.filter(job__in=jobs).order_by("pk"))
    assert [a.allocations[0]["node"] for a in attempts] == ["node-a"] * count
    return agent, [attempt.pk for attempt in attempts]


@pytest.mark.live
def test_an_event_the_portal_refuses_leaves_the_outbox_named_in_the_log(
    world, live, tmp_path, caplog
):
    """An exit whose detail is longer than the portal takes sits between two good exits: the
    portal refuses it by name and the agent says so in an ERROR; the good ones are taken, and
    an exit queued after the refusal goes too. The refused exit's attempt stays listed as
    stopping in the agent's polls: the portal never took its end."""
    system = live()
    system.start_web()
    agent, (first, bad, after, later) = _agent_with_jobs(system, tmp_path, world, 4)
    agent._end(first, end=END_EXIT, exit_code=0)
    agent._end(bad, end=END_EXIT, exit_code=0, detail="could not start: " + "x" * 3000)
    agent._end(after, end=END_EXIT, exit_code=0)
    with caplog.at_level(logging.ERROR, logger="scheduler.agent"):
        agent.flush()
    agent._end(later, end=END_EXIT, exit_code=0)
    _sent_until_empty(agent.outbox, agent.flush, most=5)
    assert len(agent.outbox) == 0
    states = dict(Job.objects.filter(attempts__in=[first, bad, after, later])
                  .values_list("attempts", "state"))  # fmt: skip
    assert states == {first: Job.State.SUCCEEDED, bad: Job.State.SCHEDULED,
                      after: Job.State.SUCCEEDED, later: Job.State.SUCCEEDED}  # fmt: skip
    refusals = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(refusals) == 1
    assert f"exited event of attempt {bad}" in refusals[0]
    assert "events[1].detail" in refusals[0]
    assert agent._poll_body([])["stopping"] == [bad]


@pytest.mark.live
def test_a_portal_with_a_lower_body_limit_gets_smaller_batches(world, live, tmp_path):
    """A portal whose DATA_UPLOAD_MAX_MEMORY_SIZE is 64 KiB refuses the agent's batches of
    full log tails as too big: they are halved until it takes them, and every job's log tails
    and exit get through."""
    system = live()
    system.start_web(DATA_UPLOAD_MAX_MEMORY_SIZE=str(64 * 1024))
    agent, attempts = _agent_with_jobs(system, tmp_path, world, 8)
    for step in range(20):
        for attempt in attempts:
            agent.outbox.add({"type": EVENT_LOG, "attempt": attempt,
                              "log_tail": f"{step}\n".rjust(LOG_TAIL_CHARS, ".")})  # fmt: skip
    for attempt in attempts:
        agent._end(attempt, end=END_EXIT, exit_code=0, log_tail="done\n")
    _sent_until_empty(agent.outbox, agent.flush, most=100)
    assert len(agent.outbox) == 0
    assert agent.outbox.most_bytes <= 64 * 1024
    jobs = Job.objects.filter(attempts__in=attempts)
    assert set(jobs.values_list("state", flat=True)) == {Job.State.SUCCEEDED}
