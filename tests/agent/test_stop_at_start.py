"""An attempt whose stop is ordered after its run order reached the agent but before the agent
asked to start it: the answer to the start refuses it and brings its stop order, and the agent
reports it never started at once, instead of learning of the stop from its next poll (a real
agent on a live portal)."""

from __future__ import annotations

import pytest

from scheduler.agent.core import Agent
from scheduler.agent.gpus import fake_gpus
from scheduler.agent.protocol import END_NEVER_STARTED, EVENT_EXITED
from scheduler.cycle.run import cycle_run
from scheduler.jobs.services import job_submit
from scheduler.models import Job, JobAttempt, Node
from scheduler.nodes.services import node_orders
from tests.conftest import place_a_borrower
from tests.live import JOIN_TOKEN


@pytest.mark.live
def test_a_refused_start_brings_the_stop_order_and_the_agent_reports_it_at_once(
    world, live, tmp_path
):
    system = live()
    system.start_web()
    agents = {
        name: Agent(
            portal=system.url,
            join_token=JOIN_TOKEN,
            name=name,
            gpu_type="h100",
            gpus=fake_gpus(8, "h100"),
            work_dir=tmp_path / name,
            checkpoint_root=system.checkpoints,
        )  # fmt: skip
        for name in ("node-a", "node-b")
    }
    for agent in agents.values():
        agent.register()
    borrower, attempt = place_a_borrower(world)
    (node,) = (allocation["node"] for allocation in attempt.allocations)
    # The borrower's run order, as the agent's poll got it; the owner reclaims before the agent
    # asks to start it.
    orders = node_orders(node=Node.objects.get(name=node))
    assert [order["attempt"] for order in orders.run] == [attempt.pk]
    owner, _ = job_submit(user=world.carol, share_name="vision", gpu_type="h100", gpus=8,
                          command="sleep 1")  # fmt: skip
    cycle_run(force=True)
    assert JobAttempt.objects.get(pk=attempt.pk).preempted_for_id == owner.pk

    agent = agents[node]
    agent.apply({"run": orders.run, "stop": []})
    assert not agent.processes and not agent.claims
    assert [(e["type"], e["attempt"], e["end"]) for e in agent.outbox] == [
        (EVENT_EXITED, attempt.pk, END_NEVER_STARTED)
    ]
    agent.flush()
    assert not agent.outbox
    attempt = JobAttempt.objects.get(pk=attempt.pk)
    assert attempt.outcome == JobAttempt.Outcome.PREEMPTED and attempt.started_at is None
    assert Job.objects.get(pk=borrower.pk).state == Job.State.RUNNABLE
