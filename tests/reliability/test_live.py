"""End to end, with real processes: web server, Celery worker (with beat), Redis, and node
agents running real commands. The agents fake their GPUs (--fake-gpus), the one stand-in: no
GPU machine runs these tests. Every wait is a poll with a bounded timeout."""

from __future__ import annotations

import pytest

from scheduler.jobs.services import job_cancel, job_submit
from scheduler.models import Job, JobAttempt, Node
from tests.live import job_command, wait_for
from tests.reliability.invariants import check_invariants

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def state(job: Job) -> str:
    return Job.objects.get(pk=job.pk).state


def wait_state(job: Job, *states: str, timeout: float = 40) -> Job:
    wait_for(lambda: state(job) in states, timeout=timeout, what=f"job {job.pk} {states}")
    return Job.objects.get(pk=job.pk)


def wait_nodes(*names: str, timeout: float = 30) -> None:
    wait_for(
        lambda: Node.objects.filter(name__in=names, state=Node.State.READY).count() == len(names),
        timeout=timeout,
        what=f"nodes {names} registered",
    )


def submit(user, share: str, command: str, gpus: int = 8, **fields) -> Job:
    job, _ = job_submit(
        user=user, share_name=share, gpu_type="h100", gpus=gpus, command=command, **fields
    )
    return job


def outcomes(job: Job) -> list[str]:
    return list(
        JobAttempt.objects.filter(job=job).order_by("number").values_list("outcome", flat=True)
    )


def test_reclaim_borrower_checkpoints_owner_runs_borrower_resumes(world, live):
    """A borrower fills the idle GPUs; the owner submits; the borrower gets SIGTERM, writes its
    checkpoint and exits; the owner's job runs; then the borrower resumes from its checkpoint
    and finishes. Every job SUCCEEDED, every attempt recorded with its outcome."""
    system = live()
    system.start({"node-a": (8, "h100"), "node-b": (8, "h100")})
    wait_nodes("node-a", "node-b")
    borrowers = [submit(world.alice, "research", job_command(40, 0.1)) for _ in range(2)]
    for job in borrowers:
        wait_state(job, Job.State.RUNNING)
    wait_for(lambda: all(system.checkpoint_dir(j.pk).joinpath("checkpoint").exists()
                         for j in borrowers), what="borrowers checkpointing")  # fmt: skip
    owner = submit(world.carol, "vision", job_command(10, 0.1))
    owner = wait_state(owner, Job.State.SUCCEEDED)
    victim = JobAttempt.objects.get(preempted_for=owner).job
    victim_dir = system.checkpoint_dir(victim.pk)
    assert victim_dir.joinpath("sigterm-1").exists()
    for job in borrowers:
        wait_state(job, Job.State.SUCCEEDED)
    assert int(victim_dir.joinpath("attempt-2.start").read_text()) > 0  # resumed, not restarted
    assert outcomes(victim) == ["PREEMPTED", "SUCCEEDED"]
    attempt = JobAttempt.objects.get(job=victim, number=1)
    assert attempt.preempted_for_id == owner.pk
    assert "SIGTERM" in attempt.log_tail
    victim = Job.objects.get(pk=victim.pk)
    assert victim.preemption_count == 1 and victim.failure_count == 0
    assert outcomes(owner) == ["SUCCEEDED"]


def test_agent_killed_mid_job_is_lost_and_the_job_requeued(world, live):
    """An agent killed mid-job and started again reports the job lost (NODE_LOST); the job
    runs again from its checkpoint and succeeds."""
    system = live()
    system.start({"node-a": (8, "h100")})
    wait_nodes("node-a")
    job = submit(world.alice, "research", job_command(30, 0.1))
    wait_state(job, Job.State.RUNNING)
    wait_for(lambda: system.checkpoint_dir(job.pk).joinpath("checkpoint").exists(),
             what="a checkpoint")  # fmt: skip
    system.kill_agent("node-a")
    system.start_agent("node-a")
    job = wait_state(job, Job.State.SUCCEEDED, timeout=60)
    assert outcomes(job) == ["NODE_LOST", "SUCCEEDED"]
    assert int(system.checkpoint_dir(job.pk).joinpath("attempt-2.start").read_text()) > 0
    check_invariants(settled=True)


def test_agent_shut_down_requeues_its_jobs_instead_of_failing_them(world, live):
    """An agent stopped for maintenance (SIGTERM) stops its job with its grace period and reports
    it lost, not failed: the job is requeued and resumes from its checkpoint when a node is back."""
    from tests.live import stop

    system = live()
    system.start({"node-a": (8, "h100")})
    wait_nodes("node-a")
    job = submit(world.alice, "research", job_command(30, 0.1))
    wait_state(job, Job.State.RUNNING)
    wait_for(lambda: system.checkpoint_dir(job.pk).joinpath("checkpoint").exists(),
             what="a checkpoint")  # fmt: skip
    stop(system.agents.pop("node-a"))
    first = JobAttempt.objects.filter(job=job, number=1)
    wait_for(lambda: first.exclude(outcome="").exists(), timeout=60, what="attempt 1 to end")
    assert outcomes(job)[0] == "NODE_LOST", Job.objects.get(pk=job.pk).reason
    system.start_agent("node-a")
    job = wait_state(job, Job.State.SUCCEEDED, timeout=90)
    assert outcomes(job)[-1] == "SUCCEEDED" and "FAILED" not in outcomes(job)
    check_invariants(settled=True)


def test_node_lost_on_missed_heartbeats_requeues_elsewhere(world, live):
    """A node whose agent stops sending heartbeats is marked DOWN, its attempt ends NODE_LOST
    with its GPUs released, and the job runs on another node."""
    system = live(NODE_HEARTBEAT_TIMEOUT_SECONDS="4")
    system.start({"node-a": (8, "h100"), "node-b": (8, "h100")})
    wait_nodes("node-a", "node-b")
    job = submit(world.alice, "research", job_command(30, 0.1))
    wait_state(job, Job.State.RUNNING)
    first = JobAttempt.objects.get(job=job, number=1).allocations[0]["node"]
    system.kill_agent(first)
    job = wait_state(job, Job.State.SUCCEEDED, timeout=60)
    assert outcomes(job) == ["NODE_LOST", "SUCCEEDED"]
    assert Node.objects.get(name=first).state == Node.State.DOWN
    assert JobAttempt.objects.get(job=job, number=2).allocations[0]["node"] != first
    check_invariants(settled=True)


def test_portal_down_agent_keeps_running_and_catches_up(world, live):
    """With the web server down, the agent keeps its job running; when the portal is back it
    reports what happened and the job ends SUCCEEDED."""
    system = live()
    system.start({"node-a": (8, "h100")})
    wait_nodes("node-a")
    job = submit(world.alice, "research", job_command(15, 0.1))
    wait_state(job, Job.State.RUNNING)
    system.stop_web()
    wait_for(lambda: system.checkpoint_dir(job.pk).joinpath("done").exists(), timeout=30,
             what="the job finishing while the portal is down")  # fmt: skip
    assert state(job) == Job.State.RUNNING  # nobody could tell the portal yet
    system.start_web()
    job = wait_state(job, Job.State.SUCCEEDED)
    assert outcomes(job) == ["SUCCEEDED"]
    assert "finished 15 steps" in JobAttempt.objects.get(job=job).log_tail


def test_sigterm_ignored_timeout_and_retries(world, live):
    """A job that ignores SIGTERM is killed after the grace period; a job past its
    timeout_seconds ends TIMEOUT; a failing command is retried, then FAILED."""
    system = live()
    system.start({"node-a": (8, "h100")})
    wait_nodes("node-a")
    stubborn = submit(world.alice, "research", job_command(600, 0.1, "--ignore-sigterm"),
                      gpus=2)  # fmt: skip
    slow = submit(world.alice, "research", job_command(600, 0.1), gpus=2, timeout_seconds=2)
    failing = submit(world.alice, "research", job_command(1, 0.1, "--exit-code 3"), gpus=2,
                     retry_attempts=1)  # fmt: skip
    wait_state(stubborn, Job.State.RUNNING)
    # Until the job has set its handler, a SIGTERM ends it like any other job.
    wait_for(lambda: system.checkpoint_dir(stubborn.pk).joinpath("attempt-1.start").exists(),
             what="the stubborn job ignoring SIGTERM")  # fmt: skip
    job_cancel(job=stubborn, user=world.alice)
    stubborn = wait_state(stubborn, Job.State.CANCELLED)
    attempt = JobAttempt.objects.get(job=stubborn)
    assert attempt.outcome == JobAttempt.Outcome.CANCELLED
    assert attempt.exit_code == -9  # SIGKILL after the grace
    assert system.checkpoint_dir(stubborn.pk).joinpath("sigterm-1").exists()
    slow = wait_state(slow, Job.State.FAILED)
    assert outcomes(slow) == ["TIMEOUT"]
    failing = wait_state(failing, Job.State.FAILED)
    assert outcomes(failing) == ["FAILED", "FAILED"]
    assert [a.exit_code for a in JobAttempt.objects.filter(job=failing)] == [3, 3]
