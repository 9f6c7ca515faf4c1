"""Node agents that misbehave, with real processes. An agent killed (its node lost on missed
heartbeats) and an agent restarted with its jobs gone are proved in tests/reliability/test_live.py
(test_node_lost_on_missed_heartbeats_requeues_elsewhere,
test_agent_killed_mid_job_is_lost_and_the_job_requeued), which check these invariants too."""

from __future__ import annotations

from datetime import timedelta

import pytest
import requests
from django.utils import timezone

from scheduler.models import GpuAssignment, Job, JobAttempt, JobEvent, Node
from tests.live import JOIN_TOKEN
from tests.reliability.common import (
    ApiClient,
    job_command,
    outcomes,
    wait_for,
    wait_jobs,
    wait_nodes,
)
from tests.reliability.invariants import check_invariants
from tests.reliability.test_cycle_faults import trace_lines

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

SIX_HOURS = 6 * 3600


def test_agents_with_clocks_hours_off_the_portal_uses_its_own_clock(world, live):
    """Two agents whose clocks are 6 h ahead and 6 h behind (and say so in a Date header)
    run their jobs normally: heartbeats, attempt times and events are the portal's time, no
    node is taken for lost, and the invariants hold."""
    before = timezone.now()
    system = live()
    system.start_web()
    system.start_worker()
    module = "tests.reliability.skewed_agent"
    system.start_agent("node-ahead", 2, module=module, AGENT_CLOCK_SKEW_SECONDS=str(SIX_HOURS))
    system.start_agent("node-behind", 2, module=module,
                       AGENT_CLOCK_SKEW_SECONDS=str(-SIX_HOURS))  # fmt: skip
    wait_nodes("node-ahead", "node-behind")
    client = ApiClient(system.url, world.alice)
    jobs = [client.submit("research", job_command(3, 0.1), gpus=2) for _ in range(4)]
    wait_jobs(jobs, Job.State.SUCCEEDED)
    after = timezone.now()

    slack = timedelta(seconds=1)  # the database's and this process's clocks round differently
    for node in Node.objects.all():
        assert node.state == Node.State.READY
        assert before - slack <= node.last_heartbeat <= after + slack, node.last_heartbeat
    nodes_used = set()
    for attempt in JobAttempt.objects.filter(job_id__in=jobs):
        assert attempt.outcome == JobAttempt.Outcome.SUCCEEDED
        assert before - slack <= attempt.scheduled_at <= attempt.started_at <= attempt.ended_at
        assert attempt.ended_at <= after + slack
        nodes_used.add(attempt.allocations[0]["node"])
    assert nodes_used == {"node-ahead", "node-behind"}
    for job_id in jobs:
        times = list(
            JobEvent.objects.filter(job_id=job_id).order_by("pk").values_list("at", flat=True)
        )
        assert times == sorted(times)
    check_invariants(accepted_job_ids=client.accepted, settled=True)


class ManualAgent:
    """The test itself speaks the agent protocol, so it can replay reports verbatim."""

    def __init__(self, url: str, name: str, gpus: int) -> None:
        self.url = f"{url}/api/v1/agent"
        self.http = requests.Session()
        # A clock far off, as a real agent's might be: the portal must not use it.
        self.http.headers["Date"] = "Tue, 01 Jan 2036 00:00:00 GMT"
        response = self.http.post(f"{self.url}/register/", json={
            "join_token": JOIN_TOKEN, "name": name, "gpu_type": "h100", "gpus": gpus,
        }, timeout=30)  # fmt: skip
        assert response.status_code == 201, response.text
        self.http.headers["Authorization"] = f"Node {response.json()['token']}"

    def poll(self, running: list[int]) -> dict:
        response = self.http.post(f"{self.url}/poll/", json={"running": running, "wait": 0},
                                  timeout=30)  # fmt: skip
        assert response.status_code == 200, response.text
        return response.json()

    def run_order(self, running: list[int]) -> dict:
        return wait_for(lambda: next(iter(self.poll(running)["run"]), None), timeout=60,
                        what="a run order")  # fmt: skip

    def report(self, body: dict) -> list[str]:
        response = self.http.post(f"{self.url}/report/", json=body, timeout=30)
        assert response.status_code == 200, response.text
        return response.json()["results"]


def started(attempt: int) -> dict:
    return {"events": [{"type": "started", "attempt": attempt, "at": "2036-01-01T00:00:00Z"}]}


def exited(attempt: int, end: str, exit_code: int | None) -> dict:
    return {"events": [{"type": "exited", "attempt": attempt, "end": end, "exit_code": exit_code,
                        "signalled": False, "log_tail": "", "detail": "",
                        "at": "1999-01-01T00:00:00Z"}]}  # fmt: skip


def test_replayed_reports_change_nothing(world, live, tmp_path):
    """An agent re-POSTs earlier report bodies verbatim: a 'started' and a 'lost' of an attempt
    that has since been replaced, and, after the job succeeded, every report again. Each replay
    is ignored: the running attempt keeps running, the finished job is not resurrected, no GPU
    is held twice or held again, and the invariants hold across further cycles."""
    trace = tmp_path / "cycles.trace"
    system = live(CYCLE_TEST_TRACE_FILE=str(trace))
    system.start_web()
    system.start_worker()
    agent = ManualAgent(system.url, "node-r", 2)
    client = ApiClient(system.url, world.alice)
    job_id = client.submit("research", "true", gpus=2)

    first = agent.run_order([])["attempt"]
    assert agent.report(started(first)) == ["ok"]
    assert agent.report(exited(first, "lost", None)) == ["ok"]  # the agent restarted
    second = agent.run_order([])["attempt"]
    assert second != first
    assert agent.report(started(second)) == ["ok"]

    assert agent.report(started(first)) == ["ignored"]
    assert agent.report(exited(first, "lost", None)) == ["ignored"]
    job = Job.objects.get(pk=job_id)
    assert job.state == Job.State.RUNNING
    assert set(
        GpuAssignment.objects.filter(released=False).values_list("attempt_id", flat=True)
    ) == {second}
    check_invariants(accepted_job_ids=client.accepted)

    assert agent.report(exited(second, "exit", 0)) == ["ok"]
    replays = [started(first), exited(first, "lost", None), started(second),
               exited(second, "exit", 0), exited(second, "exit", 1)]  # fmt: skip
    for body in replays:
        assert agent.report(body) == ["ignored"]
    cycles = len(trace_lines(trace, "cycle"))
    wait_for(lambda: len(trace_lines(trace, "cycle")) >= cycles + 3, timeout=60,
             what="three more cycles")  # fmt: skip
    assert agent.poll([])["run"] == []
    job = Job.objects.get(pk=job_id)
    assert job.state == Job.State.SUCCEEDED
    assert outcomes(job_id) == ["NODE_LOST", "SUCCEEDED"]
    assert not GpuAssignment.objects.filter(released=False).exists()
    check_invariants(accepted_job_ids=client.accepted, settled=True)


@pytest.mark.slow
def test_an_attempt_stopped_before_its_agent_could_start_it_never_starts(world, live):
    """A borrower's run order reaches its agent, which is slow to act on it (a loaded machine);
    meanwhile the owner submits and the cycle orders the borrower's stop. The borrower's
    process never starts: its attempt ends PREEMPTED with no process, the owner runs on the
    GPUs, and the borrower runs later, and every invariant holds. The poll's answer granted the
    start (the agent asks its polls for grants): the agent, acting on it too late, asks to
    start instead, is refused and reports that it never started."""
    system = live()
    system.start_web()
    system.start_worker()
    for name in ("node-a", "node-b"):
        system.start_agent(name, 8, module="tests.reliability.slow_start_agent",
                           AGENT_TEST_START_DELAY_SECONDS="4")  # fmt: skip
    wait_nodes("node-a", "node-b")
    alice, carol = ApiClient(system.url, world.alice), ApiClient(system.url, world.carol)
    own = alice.submit("research", job_command(30, 0.1), gpus=8)
    wait_jobs([own], Job.State.RUNNING)
    borrower = alice.submit("research", job_command(3, 0.1), gpus=8)
    wait_jobs([borrower], Job.State.SCHEDULED, Job.State.RUNNING)  # RUNNING: granted
    attempt = JobAttempt.objects.get(job_id=borrower)
    (node,) = (allocation["node"] for allocation in attempt.allocations)
    order_seen = system.tmp / "agents" / node / f"order-{attempt.pk}"
    wait_for(order_seen.exists, what="the order reached its agent")  # which sits on it
    owner = carol.submit("vision", job_command(3, 0.1), gpus=8)
    wait_jobs([owner, borrower], Job.State.SUCCEEDED)

    first = JobAttempt.objects.get(job_id=borrower, number=1)
    assert (first.outcome, first.preempted_for_id) == (JobAttempt.Outcome.PREEMPTED, owner)
    assert first.exit_code is None  # no process, so no exit
    assert not system.checkpoint_dir(borrower).joinpath("attempt-1.start").exists()
    assert outcomes(borrower) == ["PREEMPTED", "SUCCEEDED"]
    check_invariants()
