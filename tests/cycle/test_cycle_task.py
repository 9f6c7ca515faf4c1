"""The Celery cycle task: one cycle, counted for /metrics, and a history sample."""

from __future__ import annotations

import pytest
from django.conf import settings

from dashboards.models import CycleStats, UsageSample
from scheduler.cycle.tasks import cycle
from scheduler.jobs.services import job_submit
from scheduler.models import JobAttempt
from tests.conftest import make_node, place_a_borrower


@pytest.mark.django_db
def test_the_cycle_task_counts_its_run_and_samples_history(vision_share):
    cycle()
    stats = CycleStats.objects.get(pk=1)
    assert (stats.runs_ok, stats.runs_failed) == (1, 0)
    assert stats.last_success_at is not None
    assert UsageSample.objects.filter(share="vision", gpu_type="h100").exists()


@pytest.fixture
def broker_queue():
    """The messages waiting in the real broker's default queue (Redis), emptied first."""
    from kombu import Connection

    with Connection(settings.CELERY_BROKER_URL) as connection:
        try:
            queue = connection.SimpleQueue("celery")
            queue.clear()
        except OSError:
            pytest.skip("no Redis at REDIS_URL")

        def waiting() -> list[str]:
            names = []
            while True:
                try:
                    message = queue.get(block=False)
                except queue.Empty:
                    return names
                names.append(message.headers["task"])
                message.ack()

        yield waiting
        queue.clear()
        queue.close()


@pytest.mark.django_db
def test_a_cycle_that_ends_a_victim_before_it_started_queues_the_next_cycle(world, broker_queue):
    """The cycle that preempts an attempt no agent was granted yet releases its GPUs itself
    (`Node.asks_to_start`): no agent will report an end to ask for the cycle that gives them to
    the owner, so the cycle's task queues that cycle at once."""
    for name in ("node-a", "node-b"):
        make_node(name, asks_to_start=True)
    _, attempt = place_a_borrower(world)
    job_submit(user=world.carol, share_name="vision", gpu_type="h100", gpus=8, command="true")
    broker_queue()
    cycle()
    assert JobAttempt.objects.get(pk=attempt.pk).ended_at is not None
    assert "scheduler.tasks.cycle" in broker_queue()
    cycle()  # a cycle that frees nothing queues none
    assert "scheduler.tasks.cycle" not in broker_queue()
