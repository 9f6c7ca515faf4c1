"""The chargeback tests use the one world of tests/conftest.py (carol leads vision, the lender;
alice leads ml-research, the borrower, whose member is bob; oscar is on no team; root is the
admin), and November 2025 as the month billed: a month long enough past that the dashboards
read it per hour, whatever day the tests run."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dashboards.models import Resolution, UsageSample
from scheduler.models import Job, JobAttempt

NOVEMBER = datetime(2025, 11, 1, tzinfo=UTC)
DECEMBER = datetime(2025, 12, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)


def hour_rows(share: str, first: datetime, hours: int, *, gpu_type="h100", limit=8, own=0.0,
              borrowed=0.0, lent=0.0) -> list[UsageSample]:  # fmt: skip
    """Rolled-up hours of history, as history_rollup writes them."""
    return [
        UsageSample(
            resolution=Resolution.HOUR,
            at=first + i * HOUR,
            share=share,
            gpu_type=gpu_type,
            limit=limit,
            own=own,
            borrowed=borrowed,
            lent=lent,
            idle=max(0.0, limit - own - lent),
            demand=0.0,
            usage_max=own + borrowed,
            borrowed_max=borrowed,
            demand_max=0.0,
            samples=240,
            seconds=3600,
        )  # fmt: skip
        for i in range(hours)
    ]


def preempted_attempt(victim_share, for_share, user, *, gpus, started, checkpoint, ended):
    """A job of `victim_share` whose attempt was preempted for a job of `for_share`."""
    victim = Job.objects.create(
        share=victim_share, submitted_by=user, gpu_type="h100", gpus=gpus, command="train"
    )
    owner = Job.objects.create(
        share=for_share, submitted_by=user, gpu_type="h100", gpus=gpus, command="train"
    )
    return JobAttempt.objects.create(
        job=victim, number=1, started_at=started, last_checkpoint_at=checkpoint,
        stop_requested_at=ended - timedelta(seconds=2), ended_at=ended,
        outcome=JobAttempt.Outcome.PREEMPTED, preempted_for=owner,
    )  # fmt: skip


@pytest.fixture
def november(world):
    """November 2025: research used its 8 h100 for 10 hours and borrowed 4 more for 5 of
    them, lent by vision; then vision reclaimed them: the borrower lost 4 GPUs × 30 min since
    its last checkpoint. A share since deleted, `gone`, used 2 h100 for 3 hours."""
    start = NOVEMBER + timedelta(days=3)
    UsageSample.objects.bulk_create(
        hour_rows("research", start, 10, own=8)
        + hour_rows("research", start + 10 * HOUR, 5, own=8, borrowed=4)
        + hour_rows("research", start, 15, gpu_type="l4", limit=2)
        + hour_rows("vision", start + 10 * HOUR, 5, lent=4)
        + hour_rows("gone", start, 3, limit=2, own=2)
    )
    ended = start + 15 * HOUR
    preempted_attempt(
        world.research, world.vision, world.root, gpus=4, started=start + 10 * HOUR,
        checkpoint=ended - timedelta(minutes=30), ended=ended,
    )  # fmt: skip
    return world
