"""The Celery cycle task: one cycle, counted for /metrics, and a history sample."""

from __future__ import annotations

import pytest

from dashboards.models import CycleStats, UsageSample
from scheduler.cycle.tasks import cycle


@pytest.mark.django_db
def test_the_cycle_task_counts_its_run_and_samples_history(vision_share):
    cycle()
    stats = CycleStats.objects.get(pk=1)
    assert (stats.runs_ok, stats.runs_failed) == (1, 0)
    assert stats.last_success_at is not None
    assert UsageSample.objects.filter(share="vision", gpu_type="h100").exists()
