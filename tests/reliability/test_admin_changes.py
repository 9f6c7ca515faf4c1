"""An admin changes shares and nodes while jobs run, with real processes: running work is
never cut short by the change itself."""

from __future__ import annotations

import pytest

from scheduler.models import Job, JobAttempt, Node
from shares.selectors import share_usage
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


def wait_cycles(trace, count: int) -> None:
    start = len(trace_lines(trace, "cycle"))
    wait_for(lambda: len(trace_lines(trace, "cycle")) >= start + count, timeout=60,
             what=f"{count} more cycles")  # fmt: skip


def test_lowered_limit_makes_running_jobs_borrowers_reclaimed_by_the_owner(world, live, tmp_path):
    """research runs two 4-GPU jobs within its limit of 8; its limit drops to 4: both keep
    running (now 4 GPUs borrowed). When vision (LEND, 8) submits a 4-GPU job, one research job
    is preempted for it (attempt PREEMPTED, preempted_for), vision's job runs, and the
    preempted job comes back and finishes."""
    trace = tmp_path / "cycles.trace"
    system = live(CYCLE_TEST_TRACE_FILE=str(trace))
    system.start({"node-a": (8, "h100")})
    wait_nodes("node-a")
    research = ApiClient(system.url, world.alice)
    admin = ApiClient(system.url, world.root)
    runners = [research.submit("research", job_command(100, 0.1), gpus=4) for _ in range(2)]
    wait_jobs(runners, Job.State.RUNNING)

    response = admin.patch("shares/research/", {"capacity_limits": {"h100": 4, "l4": 2}})
    assert response.status_code == 200, response.text
    wait_cycles(trace, 3)
    assert Job.objects.filter(pk__in=runners, state=Job.State.RUNNING).count() == 2
    assert share_usage().shares["research"]["h100"].borrowed == 4
    check_invariants()

    vision = ApiClient(system.url, world.carol)
    owner = vision.submit("vision", job_command(5, 0.1), gpus=4)
    wait_jobs([owner], Job.State.SUCCEEDED)
    victim = JobAttempt.objects.get(job_id__in=runners, outcome=JobAttempt.Outcome.PREEMPTED)
    assert victim.preempted_for_id == owner
    wait_jobs(runners, Job.State.SUCCEEDED, timeout=120)
    assert outcomes(victim.job_id) == ["PREEMPTED", "SUCCEEDED"]
    (other,) = set(runners) - {victim.job_id}
    assert outcomes(other) == ["SUCCEEDED"]
    check_invariants(accepted_job_ids=research.accepted | vision.accepted, settled=True)


def test_disabled_share_refuses_new_jobs_its_running_and_queued_jobs_finish(world, live):
    """research is disabled while one job runs and one waits: a new submit gets a 400 saying
    the share is DISABLED; the running job and the queued one both finish."""
    system = live()
    system.start({"node-a": (4, "h100")})
    wait_nodes("node-a")
    research = ApiClient(system.url, world.alice)
    running = research.submit("research", job_command(40, 0.1), gpus=4)
    wait_jobs([running], Job.State.RUNNING)
    queued = research.submit("research", job_command(3, 0.1), gpus=4)

    admin = ApiClient(system.url, world.root)
    assert admin.post("shares/research/disable/").status_code == 200
    refused = research.post("jobs/", {"share": "research", "gpu_type": "h100", "gpus": 1,
                                      "command": "true"})  # fmt: skip
    assert refused.status_code == 400
    assert "DISABLED" in refused.json()["share"][0]
    assert Job.objects.get(pk=queued).state == Job.State.RUNNABLE

    wait_jobs([running, queued], Job.State.SUCCEEDED, timeout=120)
    assert outcomes(running) == ["SUCCEEDED"] and outcomes(queued) == ["SUCCEEDED"]
    check_invariants(accepted_job_ids=research.accepted, settled=True)


def test_drained_node_gets_no_new_jobs_and_its_job_finishes(world, live):
    """node-a is drained while a job runs on it: that job finishes there; the jobs submitted
    after the drain all run on node-b, one after the other, though node-a has room."""
    system = live()
    system.start({"node-a": (8, "h100")})
    wait_nodes("node-a")
    research = ApiClient(system.url, world.alice)
    first = research.submit("research", job_command(40, 0.1), gpus=4)
    wait_jobs([first], Job.State.RUNNING)
    system.start_agent("node-b", 4)
    wait_nodes("node-b")

    admin = ApiClient(system.url, world.root)
    assert admin.post("nodes/node-a/drain/").status_code == 200
    later = [research.submit("research", job_command(3, 0.1), gpus=4) for _ in range(2)]
    wait_jobs([first, *later], Job.State.SUCCEEDED, timeout=120)

    assert JobAttempt.objects.get(job_id=first).allocations[0]["node"] == "node-a"
    for job_id in later:
        (attempt,) = JobAttempt.objects.filter(job_id=job_id)
        assert attempt.allocations[0]["node"] == "node-b"
    assert Node.objects.get(name="node-a").state == Node.State.DRAINING
    check_invariants(accepted_job_ids=research.accepted, settled=True)
