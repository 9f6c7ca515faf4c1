"""A borrower preempted around its start, with real agents on a live portal.

An attempt preempted after its run order reached the agent but before the agent asked to start
it: the agent says when it registers that it starts only what the portal grants, so the cycle
that chose the victim ends the attempt at once and gives its GPUs out in the next cycle; the
agent's start is refused and it starts nothing, reports nothing. And one preempted after the
portal granted its start but before the answer reached the agent (it asks beside its polls):
the stop order comes first, and the agent never starts it."""

from __future__ import annotations

import queue

import pytest

from scheduler.agent.core import Agent
from scheduler.agent.gpus import fake_gpus
from scheduler.agent.protocol import END_NEVER_STARTED, EVENT_EXITED, POLL_PATH
from scheduler.cycle.run import cycle_run
from scheduler.jobs.services import job_submit
from scheduler.models import Job, JobAttempt, Node
from scheduler.nodes.services import node_orders
from tests.conftest import place_a_borrower
from tests.live import JOIN_TOKEN


def _registered_agents(system, tmp_path) -> dict[str, Agent]:
    """Agents of the world's two 8-GPU nodes, registered with the live portal."""
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
    return agents


def _poll(agent: Agent, *, grants: bool = True) -> dict:
    """One poll of the agent's, answered without waiting; `grants`: as the agent asks (see
    `scheduler.nodes.services.starts_granted`), or not, so that it asks to start."""
    body = {**agent._poll_body([]), "wait": 0, "grants": grants}
    response = agent.http.post(POLL_PATH, json=body, headers=agent._headers(), timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.live
def test_a_victim_that_had_not_started_ends_at_once_and_its_agent_starts_nothing(
    world, live, tmp_path
):
    system = live()
    system.start_web()
    agents = _registered_agents(system, tmp_path)
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

    # Its start is asked beside a poll (the test asks in the starter thread's place), which
    # lists the claim: the attempt ended, so the poll brings a stop order for it; the start is
    # refused with none.
    agent = agents[node]
    agent.to_ask = queue.Queue()
    agent.apply({"run": orders.run, "stop": []})
    stops = _poll(agent)
    assert [order["attempt"] for order in stops["stop"]] == [attempt.pk]
    agent.granted(agent.to_ask.get_nowait(), agent.ask_to_start([attempt.pk]))
    agent.apply(stops)
    assert not agent.processes and not agent.claims and not agent.outbox
    cycle_run(force=True)
    (placed,) = JobAttempt.objects.filter(job=owner).values_list("allocations", flat=True)
    assert [allocation["node"] for allocation in placed] == [node]


@pytest.mark.live
def test_a_stop_that_overtakes_the_answer_to_a_start_is_obeyed_and_nothing_starts(
    world, live, tmp_path
):
    """The agent's starter thread asks to start while its polls go on (the test asks in its
    place, when it chooses; its polls do not ask for grants, as if the attempt were a gang's,
    whose starts are asked for): a poll sent meanwhile lists the claim, so the portal sends its
    run order no more; the portal grants the start, the owner reclaims before the answer reaches
    the agent, and the stop order the next poll brings ends the claim: the grant that follows
    starts nothing, and the attempt ends PREEMPTED."""
    system = live()
    system.start_web()
    agents = _registered_agents(system, tmp_path)
    borrower, attempt = place_a_borrower(world)
    (node,) = (allocation["node"] for allocation in attempt.allocations)
    agent = agents[node]
    agent.to_ask = queue.Queue()  # the starter's; nothing asks but the test

    orders = _poll(agent, grants=False)
    assert [order["attempt"] for order in orders["run"]] == [attempt.pk]
    agent.apply(orders)
    asked = agent.to_ask.get_nowait()
    assert asked == [attempt.pk] and attempt.pk in agent.claims and not agent.processes
    assert _poll(agent, grants=False) == {"run": [], "stop": [], "results": []}

    answer = agent.ask_to_start(asked)
    assert answer["start"] == [attempt.pk]
    owner, _ = job_submit(user=world.carol, share_name="vision", gpu_type="h100", gpus=8,
                          command="sleep 1")  # fmt: skip
    cycle_run(force=True)
    assert JobAttempt.objects.get(pk=attempt.pk).preempted_for_id == owner.pk
    stops = _poll(agent, grants=False)
    assert [order["attempt"] for order in stops["stop"]] == [attempt.pk]
    agent.apply(stops)
    agent.granted(asked, answer)
    assert not agent.processes and not agent.claims and not agent.asking
    assert not list((agent.work_dir / "logs").iterdir())  # no process ever wrote a log
    events = [(e["type"], e["attempt"], e["end"]) for e in agent.outbox]
    assert events == [(EVENT_EXITED, attempt.pk, END_NEVER_STARTED)]

    agent.flush(everything=True)
    attempt = JobAttempt.objects.get(pk=attempt.pk)
    assert attempt.outcome == JobAttempt.Outcome.PREEMPTED and attempt.ended_at is not None
    assert Job.objects.get(pk=borrower.pk).state == Job.State.RUNNABLE
