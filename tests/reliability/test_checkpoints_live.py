"""A job's checkpoint, reported by its agent, decides which borrower a reclaim stops (live
processes; the agents fake their GPUs, the one stand-in: no GPU machine runs these tests)."""

from __future__ import annotations

import sys

import pytest

from scheduler.models import Job, JobAttempt
from tests.live import job_command, wait_for
from tests.reliability.test_live import submit, wait_nodes, wait_state

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

# Saves a checkpoint twice a second with the client's helper, until it is stopped.
SAVER = (
    f"{sys.executable} -c 'import time\n"
    "from portal_client import checkpoint_saved\n"
    "while True:\n"
    "    checkpoint_saved()\n"
    "    time.sleep(0.5)'"
)


def test_a_reclaim_stops_the_borrower_that_loses_the_least_work(world, live):
    """Four jobs of share research fill both nodes (two on its own quota, two on vision's
    lent quota); the first to start saves checkpoints, the others never do. When vision's
    owner submits, the reclaim stops the job that saved a checkpoint a moment ago: it loses
    the least work, though it has run the longest."""
    system = live()
    system.start({"node-a": (8, "h100"), "node-b": (8, "h100")})
    wait_nodes("node-a", "node-b")
    saver = submit(world.alice, "research", SAVER, gpus=4)
    wait_state(saver, Job.State.RUNNING)
    others = [submit(world.alice, "research", job_command(600, 0.1), gpus=4) for _ in range(3)]
    for job in others:
        wait_state(job, Job.State.RUNNING)
    attempt = JobAttempt.objects.filter(job=saver, number=1)
    wait_for(lambda: attempt.get().last_checkpoint_at, what="the saver's checkpoint reported")
    first = attempt.get().last_checkpoint_at
    wait_for(lambda: attempt.get().last_checkpoint_at > first, what="a later checkpoint")
    owner = submit(world.carol, "vision", job_command(5, 0.1), gpus=4)
    wait_for(lambda: JobAttempt.objects.filter(preempted_for=owner).exists(),
             what="the reclaim")  # fmt: skip
    victims = list(JobAttempt.objects.filter(preempted_for=owner).values_list("job", flat=True))
    assert victims == [saver.pk]
    wait_state(owner, Job.State.SUCCEEDED, timeout=60)
    for job in others:
        assert Job.objects.get(pk=job.pk).preemption_count == 0
