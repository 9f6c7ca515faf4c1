"""An attempt preempted after its run order reached the agent but before the agent asked to
start it: the agent says when it registers that it starts only what the portal grants, so the
cycle that chose the victim ends the attempt at once and gives its GPUs out in the next cycle;
the agent's start is refused and it starts nothing, reports nothing (a real agent on a live
portal)."""

from __future__ import annotations

import pytest

from scheduler.agent.core import Agent
from scheduler.agent.gpus import fake_gpus
from scheduler.cycle.run import cycle_run
from scheduler.jobs.services import job_submit
from scheduler.models import Job, JobAttempt, Node
from scheduler.nodes.services import node_orders
from tests.conftest import place_a_borrower
from tests.live import JOIN_TOKEN


@pytest.mark.live
def test_a_victim_that_had_not_started_ends_at_once_and_its_agent_starts_nothing(
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

    attempt = JobAttempt.objects.get(pk=attempt.pk)
    assert attempt.outcome == JobAttempt.Outcome.PREEMPTED and attempt.started_at is None
    assert attempt.ended_at == attempt.stop_requested_at
    borrower = Job.objects.get(pk=borrower.pk)
    assert borrower.state == Job.State.RUNNABLE and borrower.preemption_count == 1
    events = list(borrower.events.order_by("pk").values_list("to_state", "reason"))
    assert [state for state, _ in events[-2:]] == [Job.State.PREEMPTING, Job.State.RUNNABLE]
    assert "it had not started: its GPUs were released at once" in events[-1][1]

    agent = agents[node]
    agent.apply({"run": orders.run, "stop": []})
    assert not agent.processes and not agent.claims and not agent.outbox
    cycle_run(force=True)
    (placed,) = JobAttempt.objects.filter(job=owner).values_list("allocations", flat=True)
    assert [allocation["node"] for allocation in placed] == [node]
