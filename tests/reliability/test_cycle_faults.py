"""The scheduling cycle under faults, with real processes (web server, Celery workers with
beat, Redis, the database, node agents with fake GPUs)."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest

from scheduler.models import GpuAssignment, Job, JobAttempt
from tests.reliability.common import ApiClient, job_command, wait_for, wait_jobs, wait_nodes
from tests.reliability.invariants import check_invariants

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def trace_lines(trace: Path, kind: str) -> list[list[int]]:
    """Lines of the cycle's test trace (CYCLE_TEST_TRACE_FILE) of one kind, as integers."""
    if not trace.exists():
        return []
    return [
        [int(field) for field in line.split()[1:]]
        for line in trace.read_text().splitlines()
        if line.startswith(kind + " ")
    ]


def test_worker_killed_mid_cycle_rolls_back_and_the_next_cycle_places(world, live, tmp_path):
    """A worker SIGKILLed inside a cycle, after it applied its plan but before the commit,
    leaves nothing behind: the job is still RUNNABLE with no attempt and no GPU held. A new
    worker's cycle places it, it succeeds, and the invariants hold throughout."""
    trace = tmp_path / "cycles.trace"
    system = live(CYCLE_TEST_TRACE_FILE=str(trace))
    system.start_web()
    system.start_worker(CYCLE_TEST_PAUSE_BEFORE_COMMIT_SECONDS="120")
    system.start_agent("node-a")
    wait_nodes("node-a")
    client = ApiClient(system.url, world.alice)
    job_id = client.submit("research", job_command(5, 0.1), gpus=4)

    paused = wait_for(lambda: trace_lines(trace, "paused"), timeout=60, what="a paused cycle")
    pid, placed, _ = paused[0]
    assert pid == system.worker.pid and placed == 1
    system.kill_worker()

    job = Job.objects.get(pk=job_id)
    assert job.state == Job.State.RUNNABLE
    assert not JobAttempt.objects.filter(job=job).exists()
    assert not GpuAssignment.objects.filter(released=False).exists()
    check_invariants(accepted_job_ids=client.accepted)

    system.start_worker()  # no pause this time
    wait_jobs([job_id], Job.State.SUCCEEDED)
    assert list(JobAttempt.objects.filter(job_id=job_id).values_list("number", flat=True)) == [1]
    assert any(p != pid for p, *_ in trace_lines(trace, "cycle"))  # the new worker's cycles
    check_invariants(accepted_job_ids=client.accepted, settled=True)


@pytest.mark.slow
def test_two_workers_and_two_beats_never_run_cycles_at_once(world, live, tmp_path):
    """Two workers, each with its own beat every 0.5 s, for 30 s while both teams submit short
    jobs: the cycles' locked intervals never overlap (the cycle lock), both workers ran cycles,
    no GPU is ever held twice, and every job succeeds."""
    trace = tmp_path / "cycles.trace"
    system = live(
        CYCLE_TEST_TRACE_FILE=str(trace),
        CYCLE_INTERVAL_SECONDS="0.5",
        CYCLE_FULL_EVERY_SECONDS="1",  # plan in full often, not only on changes
    )
    system.start_web()
    system.start_worker("worker-1")
    system.start_worker("worker-2")
    system.start_agent("node-a", gpus=4)
    system.start_agent("node-b", gpus=4)
    wait_nodes("node-a", "node-b")
    lender = ApiClient(system.url, world.carol)
    borrower = ApiClient(system.url, world.alice)

    deadline = time.monotonic() + 30
    submitted = 0
    while time.monotonic() < deadline:
        client, share = (lender, "vision") if submitted % 3 == 2 else (borrower, "research")
        client.submit(share, job_command(8, 0.1), gpus=1 + submitted % 2)
        submitted += 1
        check_invariants()
        time.sleep(0.5)
    accepted = lender.accepted | borrower.accepted
    wait_jobs(accepted, Job.State.SUCCEEDED, timeout=120)

    cycles = sorted(trace_lines(trace, "cycle"), key=lambda line: line[1])
    for (pid_a, _, done_a), (pid_b, locked_b, _) in itertools.pairwise(cycles):
        assert locked_b >= done_a, f"cycles of {pid_a} and {pid_b} overlap"
    pids = {system.workers[name].pid for name in ("worker-1", "worker-2")}
    assert {pid for pid, *_ in cycles} == pids
    check_invariants(accepted_job_ids=accepted, settled=True)
