"""Writes of the utilization history and of the cycle's metrics.

`history_sample` records what `shares.selectors.current_usage()` reports, at most once per
HISTORY_SAMPLE_SECONDS; `history_rollup` averages raw samples into minutes and minutes into
hours; `history_prune` drops what is older than each resolution's retention; `cycle_record` is
the hook the scheduling cycle calls after each run."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Max, Min, Sum
from django.db.models.functions import Least
from django.utils import timezone

from dashboards.models import (
    CYCLE_DURATION_BUCKETS,
    ClusterSample,
    CycleStats,
    Resolution,
    UsageSample,
    Watermark,
    cycle_bucket_field,
)
from scheduler.models import Node
from shares.selectors import current_usage

SAMPLE_WATERMARK = "history_sample"
# Beat's ticks and the cycle's calls jitter: a call up to 5 % early still samples, so a sampler
# on the same period as beat does not skip every other tick.
SAMPLE_EARLY_TOLERANCE = 0.05
# A raw sample stands for the time since the previous one, but at most this many intervals:
# a longer gap means the sampler was down, and that time counts as no data.
MAX_GAP = 2

STEP = {Resolution.MINUTE: timedelta(minutes=1), Resolution.HOUR: timedelta(hours=1)}
# How much wider one roll-up query is than its buckets: bounds memory on a long backfill.
ROLLUP_WINDOW = {Resolution.MINUTE: timedelta(hours=6), Resolution.HOUR: timedelta(days=1)}

USAGE_AVERAGED = ("limit", "own", "borrowed", "lent", "idle", "demand")
USAGE_PEAKS = ("usage_max", "borrowed_max", "demand_max")
CLUSTER_AVERAGED = ("capacity", "in_use", "down")
CLUSTER_PEAKS = ("in_use_max",)


def history_sample(now: datetime | None = None) -> bool:
    """Record one raw sample of every share and GPU type, and of the cluster per GPU type.

    Safe to call as often as one likes (beat, and the cycle after each run): it takes a sample
    only when the last one is at least HISTORY_SAMPLE_SECONDS old, and of two concurrent callers
    only one wins (conditional update of a watermark). Returns whether it sampled."""
    now = now or timezone.now()
    interval = timedelta(seconds=settings.HISTORY_SAMPLE_SECONDS)

    def too_soon(previous: datetime | None) -> bool:
        return previous is not None and now - previous < interval * (1 - SAMPLE_EARLY_TOLERANCE)

    # Most calls (the cycle's, after every run) come too soon: one read tells, with no
    # transaction around it; the compare and swap below decides the others.
    marks = Watermark.objects.filter(name=SAMPLE_WATERMARK).values_list("at", flat=True)
    if too_soon(next(iter(marks), None)):
        return False
    with transaction.atomic():
        mark, _ = Watermark.objects.get_or_create(name=SAMPLE_WATERMARK)
        previous = mark.at
        if too_soon(previous):
            return False
        # Compare and swap: of two callers that read the same watermark, one wins.
        claimed = Watermark.objects.filter(name=SAMPLE_WATERMARK, at=previous).update(at=now)
        if not claimed:
            return False
        seconds = interval if previous is None else min(now - previous, interval * MAX_GAP)
        seconds = seconds.total_seconds()
        rows = current_usage()
        UsageSample.objects.bulk_create(
            UsageSample(
                resolution=Resolution.RAW,
                at=now,
                share=row.share,
                gpu_type=row.gpu_type,
                limit=row.limit,
                own=row.own,
                borrowed=row.borrowed,
                lent=row.lent,
                idle=row.idle,
                demand=row.demand,
                usage_max=row.usage,
                borrowed_max=row.borrowed,
                demand_max=row.demand,
                seconds=seconds,
            )
            for row in rows
        )
        in_use: dict[str, float] = defaultdict(float)
        for row in rows:
            in_use[row.gpu_type] += row.usage
        up: dict[str, float] = defaultdict(float)
        down: dict[str, float] = defaultdict(float)
        # Capacity is what the portal can plan on: GPUs used outside the portal are not
        # (docs/semantics.md), as on the overview's cards (selectors.cluster_now).
        nodes = Node.objects.values_list("gpu_type", "state").annotate(
            total=Sum("gpus"), outside=Sum(Least("outside_gpus", "gpus"))
        )
        for gpu_type, state, total, outside in nodes.order_by():
            if state == Node.State.DOWN:
                down[gpu_type] += total
            else:
                up[gpu_type] += total - outside
        ClusterSample.objects.bulk_create(
            ClusterSample(
                resolution=Resolution.RAW,
                at=now,
                gpu_type=gpu_type,
                capacity=up[gpu_type],
                in_use=in_use[gpu_type],
                down=down[gpu_type],
                in_use_max=in_use[gpu_type],
                seconds=seconds,
            )
            for gpu_type in sorted(set(up) | set(down) | set(in_use))
        )
    return True


def floor_time(at: datetime, step: timedelta) -> datetime:
    """The start of the bucket of length `step` that holds `at` (buckets aligned on the epoch)."""
    seconds = step.total_seconds()
    epoch = at.timestamp()
    return datetime.fromtimestamp(epoch - epoch % seconds, tz=UTC)


def _roll_rows(
    rows: Iterable[tuple], key_len: int, averaged: int, peaks: int, step: timedelta
) -> dict[tuple, list[float]]:
    """Group (at, *key, *averaged, *peaks, samples, seconds) rows into buckets of `step`:
    averages weighted by seconds, peaks max-ed, samples and seconds summed (seconds at most the
    bucket's length). Returns {(bucket, *key): [*averaged, *peaks, samples, seconds]}."""
    acc: dict[tuple, list[float]] = {}
    for row in rows:
        at, key = row[0], row[1 : 1 + key_len]
        values = row[1 + key_len :]
        weight = values[-1]
        bucket_key = (floor_time(at, step), *key)
        slot = acc.get(bucket_key)
        if slot is None:
            slot = acc[bucket_key] = [0.0] * (averaged + peaks + 2)
            for i in range(averaged, averaged + peaks):
                slot[i] = -math.inf
        for i in range(averaged):
            slot[i] += values[i] * weight
        for i in range(averaged, averaged + peaks):
            slot[i] = max(slot[i], values[i])
        slot[-2] += values[-2]
        slot[-1] += weight
    for slot in acc.values():
        for i in range(averaged):
            slot[i] = round(slot[i] / slot[-1], 4) if slot[-1] else 0.0
        slot[-1] = min(slot[-1], step.total_seconds())
    return acc


def _rollup_model(model, key: tuple[str, ...], averaged, peaks, source, target, end) -> int:
    """Roll `source` rows of `model` up into `target` buckets that end by `end` and that are
    newer than the newest `target` bucket. Returns how many `target` rows it wrote."""
    step = STEP[target]
    newest = model.objects.filter(resolution=target).aggregate(at=Max("at"))["at"]
    pending = model.objects.filter(resolution=source)
    if newest is not None:
        pending = pending.filter(at__gte=newest + step)
    oldest = pending.aggregate(at=Min("at"))["at"]
    if oldest is None:
        return 0
    start = floor_time(oldest, step)
    fields = ("at", *key, *averaged, *peaks, "samples", "seconds")
    written = 0
    while start < end:
        stop = min(end, start + ROLLUP_WINDOW[target])
        rows = (
            model.objects.filter(resolution=source, at__gte=start, at__lt=stop)
            .order_by()
            .values_list(*fields)
        )
        buckets = _roll_rows(
            rows.iterator(chunk_size=5000), len(key), len(averaged), len(peaks), step
        )
        objs = []
        for (bucket, *key_values), values in buckets.items():
            row = dict(zip(key, key_values, strict=True))
            row.update(zip((*averaged, *peaks), values[:-2], strict=True))
            row.update(samples=int(values[-2]), seconds=values[-1])
            objs.append(model(resolution=target, at=bucket, **row))
        model.objects.bulk_create(objs, batch_size=2000)
        written += len(objs)
        start = stop
    return written


@transaction.atomic
def history_rollup(now: datetime | None = None) -> dict[str, int]:
    """Average raw samples into minute buckets and minute buckets into hour buckets (peaks are
    max-ed, so a short burst still shows at a coarse resolution; averages are weighted by the
    time each row stands for). Only complete buckets are
    written, a HISTORY_SAMPLE_SECONDS late so that a sample still being written is not missed;
    each bucket is written once. Returns the rows written per model and resolution."""
    now = now or timezone.now()
    lag = timedelta(seconds=settings.HISTORY_SAMPLE_SECONDS)
    minute_end = floor_time(now - lag, STEP[Resolution.MINUTE])
    hour_end = floor_time(minute_end, STEP[Resolution.HOUR])
    usage_key, cluster_key = ("share", "gpu_type"), ("gpu_type",)
    written = {}
    for name, model, key, averaged, peaks in (
        ("usage", UsageSample, usage_key, USAGE_AVERAGED, USAGE_PEAKS),
        ("cluster", ClusterSample, cluster_key, CLUSTER_AVERAGED, CLUSTER_PEAKS),
    ):
        written[f"{name}_minute"] = _rollup_model(
            model, key, averaged, peaks, Resolution.RAW, Resolution.MINUTE, minute_end
        )
        written[f"{name}_hour"] = _rollup_model(
            model, key, averaged, peaks, Resolution.MINUTE, Resolution.HOUR, hour_end
        )
    return written


def retention() -> dict[int, timedelta]:
    """How long each resolution is kept (settings HISTORY_*_RETENTION_DAYS)."""
    return {
        Resolution.RAW: timedelta(days=settings.HISTORY_RAW_RETENTION_DAYS),
        Resolution.MINUTE: timedelta(days=settings.HISTORY_MINUTE_RETENTION_DAYS),
        Resolution.HOUR: timedelta(days=settings.HISTORY_HOUR_RETENTION_DAYS),
    }


def history_prune(now: datetime | None = None) -> int:
    """Delete the rows older than their resolution's retention. Returns how many."""
    now = now or timezone.now()
    deleted = 0
    for resolution, keep in retention().items():
        for model in (UsageSample, ClusterSample):
            count, _ = model.objects.filter(resolution=resolution, at__lt=now - keep).delete()
            deleted += count
    return deleted


def cycle_record(duration_seconds: float, ok: bool, *, now: datetime | None = None) -> None:
    """Count one scheduling cycle for /metrics: its duration goes into the histogram
    portal_cycle_duration_seconds, and a successful one moves
    portal_last_successful_cycle_timestamp_seconds. The cycle calls this after every run, so
    it is one UPDATE (and, the first time, the row's INSERT before it)."""
    now = now or timezone.now()
    duration = max(0.0, duration_seconds)
    bound = next(b for b in CYCLE_DURATION_BUCKETS if duration <= b)
    bucket = cycle_bucket_field(bound)
    result = "runs_ok" if ok else "runs_failed"
    changes = {
        bucket: F(bucket) + 1,
        result: F(result) + 1,
        "duration_sum": F("duration_sum") + duration,
        "last_run_at": now,
        "last_duration_seconds": duration_seconds,
    }
    if ok:
        changes["last_success_at"] = now
    if not CycleStats.objects.filter(pk=1).update(**changes):
        CycleStats.objects.get_or_create(pk=1)  # the first cycle ever: its row first
        CycleStats.objects.filter(pk=1).update(**changes)
