"""The chargeback's sums are the dashboards' over the same range, at every resolution the charts
read: the share page's chart points, the overview's stacked areas, the team page's GPU-hours,
and the share page's preemption markers.

The history is sampled by the portal's own sampler from jobs placed on GPUs, once a minute for
three hours that end an hour before now, then rolled up into minutes and hours as beat does:
- hour 0: research runs 8 h100 on its own quota;
- hour 1: research also borrows 4 h100, which vision (LEND, idle) lends;
- at hour 2 vision reclaims them: research's borrower, which saved a checkpoint 30 minutes
  into its hour, is preempted for vision's 8-GPU job, which runs for hour 2."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from dashboards.chargeback import chargeback, chargeback_request
from dashboards.models import Resolution
from dashboards.selectors import (
    TimeRange,
    gpu_hours,
    preemption_events,
    resolution_for,
    usage_history,
    usage_totals_history,
)
from dashboards.services import floor_time, history_rollup, history_sample
from scheduler.models import Job, JobAttempt
from shares.models import QuotaShare
from tests.api.helpers import place, preempt
from tests.conftest import make_node

HOUR = timedelta(hours=1)
MINUTE = timedelta(minutes=1)
FMT = "%Y-%m-%dT%H:%M"

# What happened, in GPU-hours, counted by hand from the timeline above.
EXPECTED = {
    ("research", "h100"): {
        "sampled_hours": 3, "quota_gpu_hours": 24, "used_gpu_hours": 28, "own_gpu_hours": 24,
        "borrowed_gpu_hours": 4, "lent_gpu_hours": 0, "reclaimed_from_gpu_hours": 2,
        "reclaimed_for_gpu_hours": 0, "lost_gpu_hours": 2, "preemptions": 1,
        "reclaims_from": 1, "reclaims_for": 0,
    },
    ("research", "l4"): {
        "sampled_hours": 3, "quota_gpu_hours": 6, "used_gpu_hours": 0, "own_gpu_hours": 0,
        "borrowed_gpu_hours": 0, "lent_gpu_hours": 0, "reclaimed_from_gpu_hours": 0,
        "reclaimed_for_gpu_hours": 0, "lost_gpu_hours": 0, "preemptions": 0,
        "reclaims_from": 0, "reclaims_for": 0,
    },
    ("vision", "h100"): {
        "sampled_hours": 3, "quota_gpu_hours": 24, "used_gpu_hours": 8, "own_gpu_hours": 8,
        "borrowed_gpu_hours": 0, "lent_gpu_hours": 4, "reclaimed_from_gpu_hours": 0,
        "reclaimed_for_gpu_hours": 2, "lost_gpu_hours": 0, "preemptions": 0,
        "reclaims_from": 0, "reclaims_for": 1,
    },
}  # fmt: skip


def job(share, user, gpus):
    return Job.objects.create(
        share=share, submitted_by=user, gpu_type="h100", gpus=gpus, command="train"
    )


@pytest.fixture
def history(settings, world):
    """Three hours of history, [h0, h0 + 3 h), ending an hour before the current hour began."""
    settings.HISTORY_SAMPLE_SECONDS = 60
    n0, n1 = make_node("n0"), make_node("n1")
    h0 = floor_time(timezone.now(), HOUR) - 4 * HOUR

    def sample(first: int, last: int) -> None:
        for k in range(first, last):
            assert history_sample(now=h0 + k * MINUTE)

    place(job(world.research, world.bob, 8), n0, list(range(8)))
    sample(0, 60)
    borrower = place(job(world.research, world.bob, 4), n1, [0, 1, 2, 3])
    sample(60, 120)
    owner = job(world.vision, world.carol, 8)
    preempt(borrower, for_job=owner)
    JobAttempt.objects.filter(pk=borrower.pk).update(
        started_at=h0 + HOUR, last_checkpoint_at=h0 + 1.5 * HOUR, ended_at=h0 + 2 * HOUR
    )
    place(owner, n1, list(range(8)))
    sample(120, 180)
    history_rollup(now=h0 + 3 * HOUR + 2 * MINUTE)
    return h0


def ranges(h0: datetime) -> dict[str, tuple[datetime, datetime]]:
    """A range the charts read as raw samples, one they read per minute, one per hour."""
    h3 = h0 + 3 * HOUR
    return {"raw": (h0, h3), "minute": (h3 - 24 * HOUR, h3), "hour": (h3 - 72 * HOUR, h3 + HOUR)}


def by_key(rows) -> dict[tuple[str, str], dict]:
    return {(r.share, r.gpu_type): r for r in rows}


@pytest.mark.django_db
@pytest.mark.parametrize("resolution", ["raw", "minute", "hour"])
def test_the_chargeback_counts_what_happened(history, resolution):
    """The GPU-hours counted by hand from the timeline, whichever resolution a range reads."""
    start, end = ranges(history)[resolution]
    rows = by_key(chargeback(chargeback_request(start=f"{start:{FMT}}", end=f"{end:{FMT}}")))
    assert set(rows) == set(EXPECTED)
    for key, expected in EXPECTED.items():
        row = rows[key]
        assert row.resolution == resolution
        assert {column: getattr(row, column) for column in expected} == pytest.approx(expected)


@pytest.mark.django_db
@pytest.mark.parametrize("resolution", ["raw", "minute", "hour"])
def test_the_chargeback_agrees_with_the_dashboards_over_the_same_range(history, resolution):
    """Share page (its chart's points and preemption markers), overview (stacked areas) and
    team page (GPU-hours used, borrowed, lent) over the same range give the same sums."""
    start, end = ranges(history)[resolution]
    rows = by_key(chargeback(chargeback_request(start=f"{start:{FMT}}", end=f"{end:{FMT}}")))
    chart_resolution = resolution_for(TimeRange("custom", start, end))
    assert Resolution(chart_resolution).label == resolution

    for share in ("research", "vision"):
        # The share page's chart: one series per GPU type, Σ value × the time it stands for.
        points = usage_history(start=start, end=end, resolution=chart_resolution, shares=[share])
        for gpu_type in {p.gpu_type for p in points}:
            mine = [p for p in points if p.gpu_type == gpu_type]
            row = rows[(share, gpu_type)]
            for column, series in (("own", "own"), ("borrowed", "borrowed"), ("lent", "lent"),
                                   ("used", "usage")):  # fmt: skip
                chart = sum(getattr(p, series) * p.seconds for p in mine) / 3600
                assert getattr(row, f"{column}_gpu_hours") == pytest.approx(chart, abs=1e-3)
        # The share page's markers: ✕ its jobs preempted, ▲ borrowers reclaimed for it.
        markers = preemption_events(start=start, end=end, share=QuotaShare.objects.get(name=share))
        victims = [m for m in markers if m.share == share]
        assert rows[(share, "h100")].preemptions == len(victims)
        assert rows[(share, "h100")].reclaims_for == len(markers) - len(victims)

    # The overview's stacked areas of GPUs in use, per share and GPU type.
    stacked = usage_totals_history(start=start, end=end, resolution=chart_resolution)
    for key, row in rows.items():
        area = sum(p.usage * p.seconds for p in stacked if (p.share, p.gpu_type) == key) / 3600
        assert row.used_gpu_hours == pytest.approx(area, abs=1e-3)

    # The team page's GPU-hours (all GPU types of a share together).
    team_page = gpu_hours(shares=["research", "vision"], start=start, end=end)
    for share, hours in team_page.items():
        mine = [r for (s, _t), r in rows.items() if s == share]
        assert sum(r.used_gpu_hours for r in mine) == pytest.approx(hours.used, abs=0.01)
        assert sum(r.borrowed_gpu_hours for r in mine) == pytest.approx(hours.borrowed, abs=0.01)
        assert sum(r.lent_gpu_hours for r in mine) == pytest.approx(hours.lent, abs=0.01)


@pytest.mark.django_db
def test_monthly_periods_add_up_to_the_range(history):
    """Cut per month, a range's rows add up to the same range uncut: every sample and every
    preemption counts in exactly one month."""
    start = datetime(history.year, history.month, 1, tzinfo=UTC) - timedelta(days=40)
    end = history + 4 * HOUR
    whole = chargeback_request(start=f"{start:{FMT}}", end=f"{end:{FMT}}")
    monthly = chargeback_request(start=f"{start:{FMT}}", end=f"{end:{FMT}}", per="month")
    assert len(monthly.periods) >= 2
    assert monthly.periods[0][0] == start and monthly.periods[-1][1] == end
    assert all(p[1] == q[0] for p, q in zip(monthly.periods, monthly.periods[1:], strict=False))
    total = by_key(chargeback(whole))
    split = chargeback(monthly)
    for key, row in total.items():
        parts = [r for r in split if (r.share, r.gpu_type) == key]
        for column in ("used_gpu_hours", "lent_gpu_hours", "lost_gpu_hours", "preemptions"):
            assert sum(getattr(r, column) for r in parts) == pytest.approx(getattr(row, column))
