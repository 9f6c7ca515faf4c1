"""Utilization history (samples rolled up raw → minute → hour) and the cycle's own metrics."""

from __future__ import annotations

import math

from django.db import models


class Resolution(models.IntegerChoices):
    """How much time one history row covers. RAW rows are single samples."""

    RAW = 0, "raw"
    MINUTE = 1, "minute"
    HOUR = 2, "hour"


class UsageSample(models.Model):
    """One share's use of one GPU type at `at` (RAW) or averaged over the bucket that starts
    at `at` (MINUTE, HOUR). The *_max columns keep the peak inside the bucket; `samples` is how
    many raw samples the bucket holds and `seconds` how much time they stand for: averages are
    weighted by time, and GPU-hours are average × seconds.

    The share is kept by name, not by key: history outlives a renamed or deleted share."""

    resolution = models.PositiveSmallIntegerField(choices=Resolution.choices)
    at = models.DateTimeField()
    share = models.CharField(max_length=63)
    gpu_type = models.CharField(max_length=32)
    limit = models.FloatField()
    own = models.FloatField(help_text="GPUs used within the limit.")
    borrowed = models.FloatField(help_text="GPUs used above the limit.")
    lent = models.FloatField(help_text="Idle GPUs of the limit that borrowers use.")
    idle = models.FloatField(help_text="GPUs of the limit neither used nor lent.")
    demand = models.FloatField(help_text="GPUs that the share's runnable jobs ask for.")
    usage_max = models.FloatField()
    borrowed_max = models.FloatField()
    demand_max = models.FloatField()
    samples = models.PositiveIntegerField(default=1)
    seconds = models.FloatField(
        help_text="Time the row stands for: a raw sample, the time since the previous sample "
        "(at most twice the interval, so an outage counts as no data); a bucket, their sum."
    )

    class Meta:
        ordering = ["resolution", "at", "share", "gpu_type"]
        constraints = [
            models.UniqueConstraint(
                fields=["resolution", "share", "gpu_type", "at"], name="usage_sample_once"
            )
        ]
        indexes = [
            # Charts of every share over a range (overview, team page, roll-ups, pruning):
            # WHERE resolution = ? AND at BETWEEN ? AND ?.
            models.Index(fields=["resolution", "at"], name="usage_sample_range"),
        ]
        # The unique constraint's index (resolution, share, gpu_type, at) serves the share page:
        # WHERE resolution = ? AND share = ? AND at BETWEEN ? AND ?.

    def __str__(self) -> str:
        when = f"{self.at:%Y-%m-%d %H:%M:%S}"
        return f"{self.share}/{self.gpu_type} @ {when} ({self.get_resolution_display()})"

    @property
    def usage(self) -> float:
        return self.own + self.borrowed


class ClusterSample(models.Model):
    """GPUs of one type in the whole cluster: on nodes that are up (READY or DRAINING), held by
    placed jobs, and on DOWN nodes."""

    resolution = models.PositiveSmallIntegerField(choices=Resolution.choices)
    at = models.DateTimeField()
    gpu_type = models.CharField(max_length=32)
    capacity = models.FloatField()
    in_use = models.FloatField()
    down = models.FloatField()
    in_use_max = models.FloatField()
    samples = models.PositiveIntegerField(default=1)
    seconds = models.FloatField(help_text="As UsageSample.seconds.")

    class Meta:
        ordering = ["resolution", "at", "gpu_type"]
        constraints = [
            # Also the index of the overview's query: WHERE resolution = ? AND at BETWEEN ? AND ?
            # (per type the rows are few).
            models.UniqueConstraint(
                fields=["resolution", "at", "gpu_type"], name="cluster_sample_once"
            )
        ]

    def __str__(self) -> str:
        return f"{self.gpu_type} @ {self.at:%Y-%m-%d %H:%M:%S} ({self.get_resolution_display()})"


class Watermark(models.Model):
    """A named instant that workers advance with a conditional update, so two of them never do
    the same periodic work (e.g. 'history_sample': when the last sample was taken)."""

    name = models.CharField(max_length=50, unique=True)
    at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.name}: {self.at}"


# The upper bounds (seconds) of the cycle duration histogram's buckets, as Prometheus's `le`.
CYCLE_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, math.inf)


def cycle_bucket_label(bound: float) -> str:
    """A bucket's upper bound as /metrics writes it: '0.005', ..., '+Inf'."""
    return "+Inf" if math.isinf(bound) else repr(bound)


def cycle_bucket_field(bound: float) -> str:
    """The CycleStats column that counts the runs of a bucket: le_0_005, ..., le_inf."""
    return "le_inf" if math.isinf(bound) else "le_" + repr(bound).replace(".", "_")


class CycleStats(models.Model):
    """The scheduling cycle's counters for /metrics: one row (pk=1), updated by `cycle_record`
    in one statement.

    A column per bucket of CYCLE_DURATION_BUCKETS (`cycle_bucket_field`, added below) counts
    the runs whose duration fell in it; /metrics adds them up into Prometheus's cumulative
    histogram."""

    duration_sum = models.FloatField(default=0.0)
    runs_ok = models.PositiveBigIntegerField(default=0)
    runs_failed = models.PositiveBigIntegerField(default=0)
    last_run_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_duration_seconds = models.FloatField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "cycle stats"

    def __str__(self) -> str:
        return f"cycles: {self.runs_ok} ok, {self.runs_failed} failed"

    @property
    def runs(self) -> int:
        return self.runs_ok + self.runs_failed


for _bound in CYCLE_DURATION_BUCKETS:
    CycleStats.add_to_class(cycle_bucket_field(_bound), models.PositiveBigIntegerField(default=0))
del _bound
