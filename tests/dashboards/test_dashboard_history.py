"""Utilization history: sampling, roll-ups and pruning against hand-computed numbers, and how
the charts draw it (steps, from the first sample)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from dashboards import figures, selectors
from dashboards.models import ClusterSample, Resolution, UsageSample
from dashboards.services import history_prune, history_rollup, history_sample
from scheduler.models import Job, Node
from shares.services import share_update

T0 = datetime(2026, 3, 2, 10, 0, 0, tzinfo=UTC)


def seconds(n: float) -> datetime:
    return T0 + timedelta(seconds=n)


def make_job(share, user, gpus: int, state: str) -> Job:
    return Job.objects.create(
        share=share, submitted_by=user, gpu_type="h100", gpus=gpus, command="train", state=state
    )


def usage(resolution, share, at) -> UsageSample:
    return UsageSample.objects.get(resolution=resolution, share=share, gpu_type="h100", at=at)


@pytest.fixture
def cluster(db):
    Node.objects.create(name="h0", gpu_type="h100", gpus=8)
    Node.objects.create(name="h1", gpu_type="h100", gpus=8)
    Node.objects.create(name="a0", gpu_type="a100", gpus=4, state=Node.State.DOWN)


@pytest.mark.django_db
def test_a_sample_is_taken_at_most_once_per_interval(settings, cluster, vision_share):
    """Beat and the cycle may both call history_sample: calls closer than the interval skip."""
    settings.HISTORY_SAMPLE_SECONDS = 15
    assert history_sample(seconds(0)) is True
    assert history_sample(seconds(5)) is False
    assert history_sample(seconds(14)) is False
    assert history_sample(seconds(14.5)) is True  # beat's tick may come a little early (5 %)
    assert history_sample(seconds(10)) is False  # a clock that runs backwards takes nothing
    assert UsageSample.objects.filter(resolution=Resolution.RAW).count() == 2


@pytest.mark.django_db
def test_samples_record_usage_and_roll_up_into_minute_averages_and_peaks(
    settings, cluster, vision_share, research_share, alice, carol
):
    """research runs 8 + 4 h100 (borrowing 4 that vision lends) for 30 s, then the 4 finish;
    in the next minute vision runs 8 of its own. Minute 10:00 averages 4 samples."""
    # These numbers are for research without its 2 l4.
    share_update(share=research_share, actor=None, source="command", capacity_limits={"h100": 8})
    settings.HISTORY_SAMPLE_SECONDS = 15
    make_job(research_share, alice, 8, Job.State.RUNNING)
    small = make_job(research_share, alice, 4, Job.State.RUNNING)
    make_job(research_share, alice, 2, Job.State.RUNNABLE)
    history_sample(seconds(0))
    history_sample(seconds(15))
    Job.objects.filter(pk=small.pk).update(state=Job.State.SUCCEEDED)
    history_sample(seconds(30))
    history_sample(seconds(45))
    make_job(vision_share, carol, 8, Job.State.RUNNING)
    history_sample(seconds(60))
    history_sample(seconds(75))

    raw = usage(Resolution.RAW, "research", seconds(0))
    assert (raw.limit, raw.own, raw.borrowed, raw.demand) == (8, 8, 4, 2)
    assert (usage(Resolution.RAW, "vision", seconds(0)).lent,) == (4,)

    written = history_rollup(seconds(2 * 60 + 15))
    assert written["usage_minute"] == 4  # 2 shares × minutes 10:00 and 10:01
    assert written["cluster_minute"] == 4  # h100 and a100 × 2 minutes
    research = usage(Resolution.MINUTE, "research", T0)
    assert research.samples == 4
    assert (research.own, research.borrowed, research.borrowed_max) == (8, 2, 4)
    assert (research.usage_max, research.demand, research.demand_max) == (12, 2, 2)
    vision = usage(Resolution.MINUTE, "vision", T0)
    assert (vision.own, vision.lent, vision.idle) == (0, 2, 6)
    vision_next = usage(Resolution.MINUTE, "vision", seconds(60))
    assert (vision_next.own, vision_next.lent, vision_next.idle, vision_next.samples) == (
        8,
        0,
        0,
        2,
    )

    h100 = ClusterSample.objects.get(resolution=Resolution.MINUTE, gpu_type="h100", at=T0)
    assert (h100.capacity, h100.in_use, h100.in_use_max, h100.down) == (16, 10, 12, 0)
    a100 = ClusterSample.objects.get(resolution=Resolution.MINUTE, gpu_type="a100", at=T0)
    assert (a100.capacity, a100.down) == (0, 4)

    # Rolling up again writes nothing twice; the hour is not complete yet.
    assert sum(history_rollup(seconds(2 * 60 + 20)).values()) == 0


@pytest.mark.django_db
def test_a_sample_stands_for_the_time_since_the_last_one_and_an_outage_for_nothing(
    settings, cluster, vision_share, research_share, alice
):
    """Samples at 0, 20 and 40 s, then the sampler is down until 10:05. A minute averages its
    samples weighted by that time; GPU-hours then come out right even with irregular samples."""
    # These numbers are for research without its 2 l4.
    share_update(share=research_share, actor=None, source="command", capacity_limits={"h100": 8})
    settings.HISTORY_SAMPLE_SECONDS = 15
    running = make_job(research_share, alice, 8, Job.State.RUNNING)
    history_sample(seconds(0))  # the first sample stands for one interval: 15 s
    history_sample(seconds(20))  # 20 s
    Job.objects.filter(pk=running.pk).update(state=Job.State.SUCCEEDED)
    history_sample(seconds(40))  # 20 s, research uses nothing
    history_sample(seconds(300))  # after an outage: at most 2 intervals, 30 s
    raw = UsageSample.objects.filter(share="research", resolution=Resolution.RAW)
    assert list(raw.values_list("seconds", flat=True)) == [15, 20, 20, 30]
    history_rollup(seconds(400))
    minute = usage(Resolution.MINUTE, "research", T0)
    assert minute.own == pytest.approx((8 * 15 + 8 * 20 + 0 * 20) / 55, abs=1e-4)
    assert (minute.seconds, minute.samples, minute.usage_max) == (55, 3, 8)


@pytest.mark.django_db
def test_a_minute_still_being_sampled_is_not_rolled_up(settings, cluster, vision_share):
    settings.HISTORY_SAMPLE_SECONDS = 15
    history_sample(seconds(0))
    history_sample(seconds(45))
    # At 10:01:10 a sample of 10:00:59 might still be committing: wait one interval.
    assert history_rollup(seconds(70))["usage_minute"] == 0
    assert history_rollup(seconds(75))["usage_minute"] == 1


def minute_row(share: str, at: datetime, own: float, borrowed: float, samples: int):
    return UsageSample(
        resolution=Resolution.MINUTE, at=at, share=share, gpu_type="h100", limit=8, own=own,
        borrowed=borrowed, lent=0, idle=8 - own, demand=0, usage_max=own + borrowed,
        borrowed_max=borrowed, demand_max=0, samples=samples, seconds=15 * samples,
    )  # fmt: skip


@pytest.mark.django_db
def test_hours_average_minutes_weighted_by_their_samples_and_keep_the_peak(settings):
    settings.HISTORY_SAMPLE_SECONDS = 15
    UsageSample.objects.bulk_create(
        [
            minute_row("research", T0, own=8, borrowed=4, samples=4),
            minute_row("research", T0 + timedelta(minutes=30), own=2, borrowed=0, samples=2),
            minute_row("research", T0 + timedelta(minutes=61), own=6, borrowed=1, samples=4),
        ]
    )
    # At 11:00:30 hour 10:00 is complete, hour 11:00 is not.
    assert history_rollup(T0 + timedelta(minutes=60, seconds=30))["usage_hour"] == 1
    hour = usage(Resolution.HOUR, "research", T0)
    assert hour.own == pytest.approx((8 * 4 + 2 * 2) / 6)  # 6.0
    assert hour.borrowed == pytest.approx(4 * 4 / 6, abs=1e-4)  # stored to 4 decimals
    assert (hour.usage_max, hour.borrowed_max, hour.samples, hour.seconds) == (12, 4, 6, 90)
    assert history_rollup(T0 + timedelta(hours=2, minutes=1))["usage_hour"] == 1
    assert usage(Resolution.HOUR, "research", T0 + timedelta(hours=1)).own == 6


@pytest.mark.django_db
def test_pruning_keeps_each_resolution_for_its_retention(settings):
    settings.HISTORY_RAW_RETENTION_DAYS = 2
    settings.HISTORY_MINUTE_RETENTION_DAYS = 30
    settings.HISTORY_HOUR_RETENTION_DAYS = 730
    now = T0
    rows = [
        (Resolution.RAW, now - timedelta(days=2, seconds=1)),
        (Resolution.RAW, now - timedelta(days=1)),
        (Resolution.MINUTE, now - timedelta(days=31)),
        (Resolution.MINUTE, now - timedelta(days=29)),
        (Resolution.HOUR, now - timedelta(days=731)),
        (Resolution.HOUR, now - timedelta(days=365)),
    ]
    for resolution, at in rows:
        row = minute_row("vision", at, own=1, borrowed=0, samples=1)
        row.resolution = resolution
        row.save()
    assert history_prune(now) == 3
    kept = sorted(UsageSample.objects.values_list("resolution", "at"))
    assert kept == sorted([rows[1], rows[3], rows[5]])


# --- How history is drawn -------------------------------------------------------------------


def charts(now: datetime, range_key: str = "24h") -> dict[str, dict]:
    """research's h100 chart on its share page and the overview's h100 chart, built as the
    views build them for ?range=<range_key> at `now`."""
    time_range = selectors.time_range_from({"range": range_key}, now)
    window = {"start": time_range.start, "end": time_range.end,
              "resolution": selectors.resolution_for(time_range, now)}  # fmt: skip
    usage = selectors.usage_history(**window, shares=["research"])
    share = figures.share_usage(
        "research", "h100", [p for p in usage if p.gpu_type == "h100"], [], [], range_key
    )
    window["max_points"] = selectors.OVERVIEW_MAX_POINTS
    totals = selectors.usage_totals_history(**window)
    cluster = selectors.cluster_history(**window)
    overview = figures.stacked_usage(
        "h100",
        [p for p in totals if p.gpu_type == "h100"],
        [c for c in cluster if c.gpu_type == "h100"],
        range_key,
    )
    return {"share": share, "overview": overview}


def history_traces(fig: dict) -> dict[str, dict]:
    """The figure's traces over time (not its event markers), by name."""
    return {t["name"]: t for t in fig["data"] if t["mode"] == "lines"}


def times(trace: dict) -> list[datetime]:
    return [datetime.fromisoformat(x).replace(tzinfo=UTC) for x in trace["x"]]


@pytest.mark.django_db
def test_a_young_systems_chart_starts_at_its_first_sample_not_at_its_buckets_start(
    settings, cluster, vision_share, research_share, alice
):
    """The portal started at 10:03:37 and has taken three samples. The 24 h charts show
    buckets of 5 (share page) and 10 minutes (overview) that start at 10:00: each draws its one
    bucket as a step from the first sample to the last, and nothing of 10:00–10:03:37."""
    share_update(share=research_share, actor=None, source="command", capacity_limits={"h100": 8})
    settings.HISTORY_SAMPLE_SECONDS = 15
    make_job(research_share, alice, 8, Job.State.RUNNING)
    first = T0 + timedelta(minutes=3, seconds=37, microseconds=250001)  # as the clock gives it
    for n in range(3):
        history_sample(first + timedelta(seconds=15 * n))
    last = first + timedelta(seconds=30)

    built = charts(first + timedelta(seconds=40))
    drawn = {name: history_traces(fig) for name, fig in built.items()}
    assert list(drawn["share"]) == [
        "own use (within limit)", "lent to others", "borrowed (above limit)", "limit",
        "runnable demand",
    ]  # fmt: skip
    assert list(drawn["overview"]) == ["research", "vision", "capacity"]
    for traces in drawn.values():
        for name, trace in traces.items():
            assert times(trace) == [first, last], name
            assert trace["line"].get("shape") == "hv", name
    assert drawn["share"]["own use (within limit)"]["y"] == [8, 8]
    assert drawn["share"]["limit"]["y"] == [8, 8]
    assert drawn["overview"]["research"]["y"] == [8, 8]
    assert drawn["overview"]["vision"]["y"] == [0, 0]
    assert drawn["overview"]["capacity"]["y"] == [16, 16]


@pytest.mark.django_db
def test_each_bucket_holds_its_average_as_a_step_up_to_its_last_sample(
    settings, cluster, vision_share, research_share, alice
):
    """The portal started at 10:03:37; sampled every 15 s and rolled up every minute, as beat
    does, until 10:06:52. research runs 8 h100 and from 10:04:30 borrows 4 more. The share
    page's 24 h chart reads minutes (and the raw samples after the last one) into 5-minute
    buckets: 10:00 holds minute 10:03 (30 s, nothing borrowed) and 10:04 (borrowing 2 on
    average); 10:05 borrows 4 throughout. Each bucket is a step up to its last sample: the
    first from the first sample (not from 10:03, its minute's start) to 10:05, where minute
    10:04 ends, the newest from there to the last sample."""
    share_update(share=research_share, actor=None, source="command", capacity_limits={"h100": 8})
    settings.HISTORY_SAMPLE_SECONDS = 15
    make_job(research_share, alice, 8, Job.State.RUNNING)
    first = T0 + timedelta(minutes=3, seconds=37)
    samples = [first + timedelta(seconds=15 * n) for n in range(14)]
    for at in samples:
        if at == T0 + timedelta(minutes=4, seconds=37):
            make_job(research_share, alice, 4, Job.State.RUNNING)
        history_sample(at)
        history_rollup(at)
    last = samples[-1]
    assert last == T0 + timedelta(minutes=6, seconds=52)
    assert UsageSample.objects.filter(resolution=Resolution.MINUTE, share="research").count() == 3

    drawn = charts(T0 + timedelta(minutes=7))
    share = history_traces(drawn["share"])
    for name, trace in share.items():
        assert times(trace) == [first, T0 + timedelta(minutes=5), last], name
        assert trace["line"].get("shape") == "hv", name
    assert share["own use (within limit)"]["y"] == [8, 8, 8]
    borrowed = share["borrowed (above limit)"]["y"]
    assert borrowed == [pytest.approx((0 * 30 + 2 * 60) / 90), 4, 4]
    # The overview's 10-minute bucket holds it all: one step, from the first sample to the last.
    overview = history_traces(drawn["overview"])
    for name, trace in overview.items():
        assert times(trace) == [first, last], name
        assert trace["line"].get("shape") == "hv", name
    in_use = (8 * 30 + 10 * 60 + 12 * 120) / 210
    assert overview["research"]["y"] == [pytest.approx(in_use, abs=1e-3)] * 2


@pytest.mark.django_db
def test_a_gap_in_the_history_breaks_the_steps_instead_of_bridging_it(
    settings, cluster, vision_share, research_share, alice
):
    """Samples every 15 s from 10:00 to 10:02; the sampler is then down until 10:10, and
    research has started 4 more GPUs meanwhile. On the 1 h chart (raw samples, 15-second
    buckets) each sample holds its value over the 15 s before it, the first run ends at its
    last sample and the next begins at its first: between them the lines break (None) and no
    step bridges the gap."""
    share_update(share=research_share, actor=None, source="command", capacity_limits={"h100": 8})
    settings.HISTORY_SAMPLE_SECONDS = 15
    make_job(research_share, alice, 4, Job.State.RUNNING)
    before = [T0 + timedelta(seconds=15 * n) for n in range(9)]
    after = [T0 + timedelta(minutes=10, seconds=15 * n) for n in range(5)]
    for at in before:
        history_sample(at)
    make_job(research_share, alice, 4, Job.State.RUNNING)
    for at in after:
        history_sample(at)

    share = history_traces(charts(T0 + timedelta(minutes=11, seconds=10), "1h")["share"])
    for name, trace in share.items():
        assert trace["line"].get("shape") == "hv", name
        # The first run: its first sample, then each sample from the one before it, to its
        # last; a break; the second run likewise.
        assert times(trace) == [before[0], *before, before[-1], after[0], *after], name
        assert trace["y"].count(None) == 1, name
    own = share["own use (within limit)"]["y"]
    assert own == [4] * 10 + [None] + [8] * 6
