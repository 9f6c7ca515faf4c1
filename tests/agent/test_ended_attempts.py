"""What a node agent or a connector remembers of the attempts that ended on it. It never starts
one again, even when an answer the portal computed before it took the end still orders it to
run; and it forgets each once the portal is known to have taken the end, so that a long-lived
agent or connector keeps the recent ones, not every attempt it ever ran."""

from __future__ import annotations

import threading

import pytest

from scheduler.agent.core import Agent
from scheduler.agent.gpus import fake_gpus
from scheduler.agent.outbox import EndedAttempts, Outbox
from scheduler.agent.protocol import EVENT_EXITED
from scheduler.models import Job, JobAttempt
from tests.agent.offline import offline_agent, run_order
from tests.live import JOIN_TOKEN, job_command, wait_for
from tests.reliability.common import ApiClient, wait_jobs, wait_nodes


def _exit(attempt: int) -> dict:
    return {"type": EVENT_EXITED, "attempt": attempt, "end": "exited", "exit_code": 0}


def test_an_end_a_poll_carried_is_forgotten_with_that_polls_answer():
    ended = EndedAttempts()
    outbox = Outbox(ended)
    ended.add(7)
    outbox.add(_exit(7))
    poll = ended.poll_sent()
    outbox.sent(outbox.take(), delivered=True, poll=poll)
    ended.forget(answered=poll, keep=set())
    assert 7 not in ended


def test_an_end_a_report_carried_is_kept_through_the_answer_of_a_poll_already_sent():
    """The poll in flight when the report was taken may have been answered before the portal
    applied the report: its answer can still order the attempt to run."""
    ended = EndedAttempts()
    outbox = Outbox(ended)
    ended.add(7)
    outbox.add(_exit(7))
    in_flight = ended.poll_sent()
    outbox.sent(outbox.take(), delivered=True)  # a report
    ended.forget(answered=in_flight, keep=set())
    assert 7 in ended
    ended.forget(answered=ended.poll_sent(), keep=set())
    assert 7 not in ended


def test_an_end_the_portal_did_not_take_or_an_attempt_still_ordered_is_kept():
    ended = EndedAttempts()
    outbox = Outbox(ended)
    for attempt in (7, 8):
        ended.add(attempt)
        outbox.add(_exit(attempt))
    poll = ended.poll_sent()
    outbox.sent([e for e in outbox.take() if e["attempt"] == 7], delivered=False, poll=poll)
    outbox.sent([e for e in outbox if e["attempt"] == 8], delivered=True, poll=poll)
    ended.forget(answered=poll, keep={8})  # 8 is still ordered (or still listed by Slurm)
    assert set(ended) == {7, 8}
    ended.forget(answered=ended.poll_sent(), keep=set())
    assert set(ended) == {7}  # its end is still to be taken


def test_an_answer_that_still_orders_an_ended_attempt_does_not_start_it_again(tmp_path):
    agent = offline_agent(tmp_path)
    agent.finished.add(7)
    agent.apply({"run": [run_order(7, 3, "true")], "stop": []}, answered=agent.finished.poll_sent())
    assert not agent.processes and not agent.claims and 7 in agent.finished


@pytest.mark.live
def test_an_agent_forgets_the_attempts_it_ran_once_the_portal_has_their_ends(world, live, tmp_path):
    """A real agent runs jobs to their end on a live portal; then it remembers none of them."""
    system = live()
    system.start_web()
    system.start_worker()
    agent = Agent(portal=system.url, join_token=JOIN_TOKEN, name="node-e",
                  gpu_type="h100", gpus=fake_gpus(2, "h100"), work_dir=tmp_path / "agent",
                  checkpoint_root=system.checkpoints, poll_wait=2)  # fmt: skip
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        wait_nodes("node-e")
        alice = ApiClient(system.url, world.alice)
        jobs = [alice.submit("research", job_command(1, 0.05), gpus=1) for _ in range(6)]
        wait_jobs(jobs, Job.State.SUCCEEDED)
        assert JobAttempt.objects.filter(job_id__in=jobs).count() == len(jobs)  # each ran once
        wait_for(lambda: len(agent.finished) == 0, timeout=30,
                 what="the agent to forget the attempts that ended")  # fmt: skip
    finally:
        agent.stopping.set()
        thread.join(30)
