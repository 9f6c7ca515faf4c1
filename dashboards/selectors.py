"""Reads that the dashboards and /metrics need: history at the right resolution, events,
the queue as the engine considers it, and who may see what."""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db.models import (
    Case,
    Count,
    F,
    FloatField,
    Func,
    IntegerField,
    Max,
    Min,
    Q,
    QuerySet,
    Sum,
    When,
)
from django.db.models.functions import Coalesce, Least
from django.utils import timezone

from dashboards.models import ClusterSample, Resolution, UsageSample
from dashboards.services import STEP, retention
from portal.ids import is_row_id
from scheduler.cycle.estimates import expected_times_of
from scheduler.engine import order
from scheduler.jobs import selectors as job_selectors
from scheduler.models import Job, JobAttempt, Node
from shares.models import CapacityLimit, Membership, QuotaShare, ShareChange, Team
from shares.selectors import ShareUsage, current_usage, is_admin

# --- Who may see what ---------------------------------------------------------------------


def teams_led_by(user) -> QuerySet[Team]:
    return Team.objects.filter(
        memberships__user=user, memberships__role=Membership.Role.LEAD
    ).distinct()


def can_view_dashboards(user) -> bool:
    """Admins and team leads see the dashboards; members and outsiders do not."""
    return is_admin(user) or (user.is_authenticated and teams_led_by(user).exists())


def navigation(user) -> dict:
    """What the pages' header links to for `user`: the cluster and queue pages (`dashboards`),
    the teams it leads (every team for an admin), and the admin (`is_admin`)."""
    return {
        "dashboards": can_view_dashboards(user),
        "nav_teams": visible_teams(user),
        "is_admin": is_admin(user),
    }


def visible_teams(user) -> QuerySet[Team]:
    return Team.objects.all() if is_admin(user) else teams_led_by(user)


def visible_shares(user) -> QuerySet[QuotaShare]:
    """Every share for an admin; the shares of the teams a lead leads."""
    shares = QuotaShare.objects.select_related("team").prefetch_related("capacity_limits")
    return shares if is_admin(user) else shares.filter(team__in=teams_led_by(user))


# --- Time ranges and resolution -------------------------------------------------------------

RANGES = {
    "1h": timedelta(hours=1),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
}
DEFAULT_RANGE = "24h"
CUSTOM_RANGE_INVALID = (
    "custom range: give start and end as YYYY-MM-DDTHH:MM (UTC), start before end; "
    "showing the last 24 hours instead."
)
# The finest resolution whose points per series stay readable (and fast) for a range.
RAW_UP_TO = timedelta(hours=6)
MINUTE_UP_TO = timedelta(hours=36)


@dataclass(frozen=True)
class TimeRange:
    key: str
    start: datetime
    end: datetime
    error: str = ""

    @property
    def span(self) -> timedelta:
        return self.end - self.start

    @property
    def query(self) -> str:
        """The query string that selects this range again (for links between pages)."""
        if self.key == "custom":
            fmt = "%Y-%m-%dT%H:%M"
            return f"range=custom&start={self.start:{fmt}}&end={self.end:{fmt}}"
        return f"range={self.key}"


def _parse_utc(value: str | None) -> datetime | None:
    """A custom range's start or end in UTC: as given where it has no offset, converted once
    here where it has one (so the page's label and links give the range in UTC); None where it
    is no time, or lies outside the years 1 to 9999 once in UTC."""
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except (ValueError, OverflowError):
        return None


def time_range_from(params: Mapping[str, str], now: datetime | None = None) -> TimeRange:
    """The range a page asks for: ?range=1h|24h|7d|30d, or ?range=custom&start=..&end=.. (UTC)."""
    now = now or timezone.now()
    key = params.get("range") or DEFAULT_RANGE
    if key == "custom":
        start, end = _parse_utc(params.get("start")), _parse_utc(params.get("end"))
        if start and end and start < end:
            return TimeRange("custom", start, end)
        return TimeRange(DEFAULT_RANGE, now - RANGES[DEFAULT_RANGE], now, CUSTOM_RANGE_INVALID)
    key = key if key in RANGES else DEFAULT_RANGE
    return TimeRange(key, now - RANGES[key], now)


def resolution_for(time_range: TimeRange, now: datetime | None = None) -> Resolution:
    """Raw samples up to 6 hours, minutes up to 36 hours, hours beyond (and whenever the range
    starts before the finer resolution's retention)."""
    now = now or timezone.now()
    keep = retention()
    if time_range.span <= RAW_UP_TO and time_range.start >= now - keep[Resolution.RAW]:
        return Resolution.RAW
    if time_range.span <= MINUTE_UP_TO and time_range.start >= now - keep[Resolution.MINUTE]:
        return Resolution.MINUTE
    return Resolution.HOUR


# --- History ------------------------------------------------------------------------------

# Every point below is one display bucket that starts at `at` and holds `seconds` of samples.
# `since` and `until` are the time a chart draws it over. A sample stands for the time since
# the one before it, so a bucket ends at its last sample (where it holds only rolled-up rows,
# at its own end) and begins where the bucket before it ended; where the history begins, or
# comes back after a gap, at its first sample (see _spans). None where the point does not say:
# from `at`, for `seconds`.


@dataclass(frozen=True)
class UsagePoint:
    at: datetime
    seconds: float
    share: str
    gpu_type: str
    limit: float
    own: float
    borrowed: float
    lent: float
    idle: float
    demand: float
    usage_max: float
    since: datetime | None = None
    until: datetime | None = None

    @property
    def usage(self) -> float:
        return self.own + self.borrowed


@dataclass(frozen=True)
class ClusterPoint:
    at: datetime
    seconds: float
    gpu_type: str
    capacity: float
    in_use: float
    down: float
    in_use_max: float
    since: datetime | None = None
    until: datetime | None = None


class EpochBucket(Func):
    """floor(unix time of a datetime column / step) × step, in SQL: the start of the display
    bucket a row falls into, as an integer (SQLite and PostgreSQL)."""

    output_field = IntegerField()

    def __init__(self, expression, step: int) -> None:
        super().__init__(expression)
        self.step = int(step)  # inlined into the SQL: an integer from DISPLAY_STEPS

    def as_sqlite(self, compiler, connection, **extra):
        column, params = compiler.compile(self.source_expressions[0])
        # unixepoch() (SQLite 3.38+) takes a third less time than parsing strftime's text.
        if connection.Database.sqlite_version_info >= (3, 38):
            return f"(unixepoch({column}) / {self.step}) * {self.step}", params
        return f"(CAST(strftime('%%s', {column}) AS INTEGER) / {self.step}) * {self.step}", params

    def as_postgresql(self, compiler, connection, **extra):
        column, params = compiler.compile(self.source_expressions[0])
        return f"(FLOOR(EXTRACT(EPOCH FROM {column}) / {self.step}) * {self.step})::bigint", params

    def as_sql(self, compiler, connection, **extra):
        raise NotImplementedError("EpochBucket supports SQLite and PostgreSQL only.")


class EpochSeconds(Func):
    """The unix time of a datetime (a column, or Min or Max of one) to the microsecond, as a
    float, in SQL (SQLite and PostgreSQL): the buckets' first and last samples are read so, as
    numbers, which Django's SQLite backend does not parse one by one as it does datetimes."""

    output_field = FloatField()

    def as_sqlite(self, compiler, connection, **extra):
        column, params = compiler.compile(self.source_expressions[0])
        # SQLite keeps 'YYYY-MM-DD HH:MM:SS.ffffff': whole seconds, then the fraction after them
        # (Min and Max of that text are the earliest and latest: wrap them, not each row).
        if connection.Database.sqlite_version_info >= (3, 38):
            whole = f"unixepoch({column})"
        else:
            whole = f"CAST(strftime('%%s', {column}) AS INTEGER)"
        return f"({whole} + CAST(substr({column}, 20) AS REAL))", [*params, *params]

    def as_postgresql(self, compiler, connection, **extra):
        column, params = compiler.compile(self.source_expressions[0])
        return f"EXTRACT(EPOCH FROM {column})::float8", params

    def as_sql(self, compiler, connection, **extra):
        raise NotImplementedError("EpochSeconds supports SQLite and PostgreSQL only.")


# Points per series that a chart shows at most: a range is cut into display buckets of a
# round length, so 24 h shows 5-minute points and 30 days 3-hour points. The overview stacks
# every share, so it shows half as many (10 minutes, 6 hours): its page stays light to build,
# send and draw.
MAX_POINTS = 300
OVERVIEW_MAX_POINTS = 150
DISPLAY_STEPS = (15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)


def display_step(
    start: datetime, end: datetime, resolution: int, max_points: int = MAX_POINTS
) -> int:
    """Seconds per point: the shortest round step that keeps max_points per series and is no
    finer than the resolution read."""
    finest = 15 if resolution == Resolution.RAW else int(STEP[resolution].total_seconds())
    wanted = (end - start).total_seconds() / max_points
    return next((s for s in DISPLAY_STEPS if s >= max(finest, wanted)), DISPLAY_STEPS[-1])


def _stitched(model, resolution, start, end, filters: Q, key, averaged, peaks, max_points):
    """Rows of `resolution` in [start, end), then rows of each finer resolution for the time
    after the newest coarse bucket (so a 30-day chart still reaches the last sample), averaged
    in SQL into display buckets (weighted by the time each row stands for; peaks max-ed).
    `averaged` maps names to fields or expressions. Yields (bucket start, seconds, *key,
    *averaged, *peaks, since, until), oldest first."""
    step = display_step(start, end, resolution, max_points)
    averaged = {f: F(f) for f in averaged} if not isinstance(averaged, dict) else averaged
    aggregates = {f"w_{f}": Sum(e * F("seconds")) for f, e in averaged.items()}
    aggregates.update({f"p_{f}": Max(f) for f in peaks})
    aggregates["covered"] = Sum("seconds")
    n_key, n_sums = len(key), 1 + len(averaged)
    n_values = n_sums + len(peaks)
    # {(bucket, *key): [covered, *time-weighted sums, *peaks]}; a bucket may get rows from two
    # resolutions where they meet.
    merged: dict[tuple, list[float]] = {}
    # {bucket: its last raw sample (unix time)}. Raw rows are read after the coarser ones, so
    # where a bucket has any, the newest is its last sample.
    lasts: dict[int, float] = {}
    cutoff, current = start, resolution
    while True:
        last = {"last": EpochSeconds(Max("at"))} if current == Resolution.RAW else {}
        rows = (
            model.objects.filter(filters, resolution=current, at__gte=cutoff, at__lt=end)
            .annotate(bucket=EpochBucket("at", step))
            .values("bucket", *key)
            .annotate(**aggregates, **last)
            .order_by()
            .values_list("bucket", *key, "covered", *(f"w_{f}" for f in averaged),
                         *(f"p_{f}" for f in peaks), *last)
        )  # fmt: skip
        for row in rows:
            slot_key, values = row[: 1 + n_key], row[1 + n_key : 1 + n_key + n_values]
            if last and row[-1] > lasts.get(row[0], 0.0):
                lasts[row[0]] = row[-1]
            slot = merged.get(slot_key)
            if slot is None:
                merged[slot_key] = list(values)
                continue
            for i in range(n_sums):
                slot[i] += values[i]
            for i in range(n_sums, len(values)):
                slot[i] = max(slot[i], values[i])
        if current == Resolution.RAW:
            break
        newest = model.objects.filter(resolution=current).aggregate(at=Max("at"))["at"]
        if newest is not None:
            cutoff = max(cutoff, newest + STEP[current])
        if cutoff >= end:
            break
        current -= 1
    spans = _spans(model, filters, resolution, step, start, end, {k[0] for k in merged}, lasts)
    for slot_key, (covered, *values) in sorted(merged.items()):
        at, since, until = spans[slot_key[0]]
        yield (
            at,
            covered,
            *slot_key[1:],
            *(v / covered if covered else 0.0 for v in values[: len(averaged)]),
            *values[len(averaged) :],
            since,
            until,
        )


def _spans(
    model,
    filters: Q,
    resolution: int,
    step: int,
    start: datetime,
    end: datetime,
    buckets: set[int],
    lasts: dict[int, float],
) -> dict[int, tuple[datetime, datetime, datetime]]:
    """Where a chart draws each of its display buckets: {bucket: (its start, since, until)}.
    Every series of a chart is sampled at the same instants (history_sample writes them
    together), so one span serves them all.

    A bucket is drawn from where the bucket before it ended up to its last sample: the last
    of its raw samples, or the end of the bucket where it holds only rolled-up rows. Where a
    run of buckets begins (the history's start, or after a gap) it is drawn from its first
    sample, and where a run ends, to its last. A rolled-up row knows only its minute (hour), so
    those edges are read from the finest rows still kept (_first_and_last): a young system's
    chart starts at its first sample, not at the start of that sample's minute."""
    end_time = end.timestamp()
    ordered = sorted(buckets)
    untils = {b: min(lasts.get(b, b + step), end_time) for b in ordered}
    spans = {b: [b if b - step not in buckets else untils[b - step], untils[b]] for b in ordered}
    begins = {b for b in ordered if b - step not in buckets}
    ends = {b for b in ordered if b + step not in buckets and b not in lasts}
    for bucket, (first, last) in _first_and_last(
        model, filters, resolution, step, start, end, begins | ends
    ).items():
        if bucket in begins:
            spans[bucket][0] = first
        if bucket in ends:
            spans[bucket][1] = min(last, end_time)
    return {
        b: (datetime.fromtimestamp(b, UTC), *(datetime.fromtimestamp(t, UTC) for t in span))
        for b, span in spans.items()
    }


def _first_and_last(
    model,
    filters: Q,
    resolution: int,
    step: int,
    start: datetime,
    end: datetime,
    buckets: set[int],
) -> dict[int, tuple[float, float]]:
    """The first and last sample (unix time) in each of the given display buckets: {bucket:
    (first, last)}. Each is read from the coarsest rows in [start, end) (those of
    `resolution`, which the chart reads), then from each finer resolution whose rows lie inside
    that row's minute (hour) or after it, down to the raw samples where still kept."""
    if not buckets:
        return {}
    # One range of the index (resolution, at) per bucket and resolution: only those rows.
    within = Q()
    for bucket in buckets:
        since = max(start, datetime.fromtimestamp(bucket, UTC))
        until = min(end, datetime.fromtimestamp(bucket + step, UTC))
        for finer in range(resolution + 1):
            within |= Q(resolution=finer, at__gte=since, at__lt=until)
    rows = (
        model.objects.filter(filters, within)
        .annotate(bucket=EpochBucket("at", step))
        .values("bucket", "resolution")
        .annotate(first=EpochSeconds(Min("at")), last=EpochSeconds(Max("at")))
        .order_by("bucket", "-resolution")
        .values_list("bucket", "first", "last", "resolution")
    )
    edges: dict[int, list[float]] = {}
    for bucket, first, last, row_resolution in rows:  # coarsest first
        period = STEP[row_resolution].total_seconds() if row_resolution in STEP else 0.0
        edge = edges.get(bucket)
        if edge is None:
            edges[bucket] = [first, period, last + period, period]
            continue
        if first < edge[0] + edge[1]:  # inside the coarser first row, or before it
            edge[0:2] = first, period
        if last >= edge[2] - edge[3]:  # inside the coarser last row, or after it
            edge[2:4] = last + period, period
    return {bucket: (edge[0], edge[2]) for bucket, edge in edges.items()}


def usage_history(
    *,
    start: datetime,
    end: datetime,
    resolution: int,
    shares: Iterable[str] | None = None,
    max_points: int = MAX_POINTS,
) -> list[UsagePoint]:
    """Usage of the given shares (all when None) in [start, end), oldest first, one point per
    share, GPU type and display bucket."""
    filters = Q() if shares is None else Q(share__in=list(shares))
    return [
        UsagePoint(*row)
        for row in _stitched(
            UsageSample, resolution, start, end, filters, ("share", "gpu_type"),
            ("limit", "own", "borrowed", "lent", "idle", "demand"), ("usage_max",), max_points,
        )
    ]  # fmt: skip


def cluster_history(
    *, start: datetime, end: datetime, resolution: int, max_points: int = MAX_POINTS
) -> list[ClusterPoint]:
    return [
        ClusterPoint(*row)
        for row in _stitched(
            ClusterSample, resolution, start, end, Q(), ("gpu_type",),
            ("capacity", "in_use", "down"), ("in_use_max",), max_points,
        )
    ]  # fmt: skip


@dataclass(frozen=True)
class ShareTotalPoint:
    at: datetime
    seconds: float
    share: str
    gpu_type: str
    usage: float
    since: datetime | None = None
    until: datetime | None = None


def usage_totals_history(
    *, start: datetime, end: datetime, resolution: int, max_points: int = OVERVIEW_MAX_POINTS
) -> list[ShareTotalPoint]:
    """GPUs in use (own + borrowed) per share and GPU type in [start, end): the overview's
    stacked areas, with one aggregate instead of usage_history's seven."""
    return [
        ShareTotalPoint(*row)
        for row in _stitched(
            UsageSample, resolution, start, end, Q(), ("share", "gpu_type"),
            {"usage": F("own") + F("borrowed")}, (), max_points,
        )
    ]  # fmt: skip


@dataclass(frozen=True)
class GpuHours:
    used: float = 0.0
    borrowed: float = 0.0
    lent: float = 0.0


def gpu_hours(*, shares: Iterable[str], start: datetime, end: datetime) -> dict[str, GpuHours]:
    """GPU-hours each share used, borrowed and lent in [start, end): every history row's average
    times the time it stands for (its `seconds`), at minute resolution up to 8 days and hour
    resolution beyond, stitched with finer rows up to now."""
    shares = list(shares)
    totals: dict[str, list[float]] = {share: [0.0, 0.0, 0.0] for share in shares}
    resolution = Resolution.MINUTE if end - start <= timedelta(days=8) else Resolution.HOUR
    for point in usage_history(start=start, end=end, resolution=resolution, shares=shares):
        hours = point.seconds / 3600
        slot = totals[point.share]
        slot[0] += point.usage * hours
        slot[1] += point.borrowed * hours
        slot[2] += point.lent * hours
    return {share: GpuHours(*(round(v, 2) for v in values)) for share, values in totals.items()}


FREE_POOL = "free pool"


@dataclass(frozen=True)
class LendingFlows:
    """GPU-hours that flowed, approximately, from lenders to borrowers."""

    lent_to: dict[str, float]  # borrower share → GPU-hours the given shares lent it
    borrowed_from: dict[str, float]  # lender share (or FREE_POOL) → GPU-hours they borrowed


def lending_flows(*, shares: Iterable[str], start: datetime, end: datetime, resolution: int):
    """Who borrowed from the given shares and from whom they borrowed, in [start, end).

    History records per share only how much it borrowed and how much it lent, not to whom. So
    at every point in time and per GPU type, each borrower is taken to draw on every source in
    proportion to its part of all borrowing: lender L → borrower B gets lent(L) × borrowed(B) /
    Σ borrowed, and the rest of B's borrowing, (Σ borrowed − Σ lent) × borrowed(B) / Σ
    borrowed, came from the free pool (capacity no share's limit covers). This mirrors how
    `usage_by_share` splits borrowing among lenders."""
    ours = set(shares)
    at_time: dict[tuple[datetime, str], list[UsagePoint]] = defaultdict(list)
    for point in usage_history(start=start, end=end, resolution=resolution):
        if point.borrowed or point.lent:
            at_time[(point.at, point.gpu_type)].append(point)
    lent_to: dict[str, float] = defaultdict(float)
    borrowed_from: dict[str, float] = defaultdict(float)
    for points in at_time.values():
        total_borrowed = sum(p.borrowed for p in points)
        if not total_borrowed:
            continue
        total_lent = sum(p.lent for p in points)
        for borrower in (p for p in points if p.borrowed):
            part = borrower.borrowed / total_borrowed
            hours = borrower.seconds / 3600
            for lender in (p for p in points if p.lent and p.share != borrower.share):
                flow = lender.lent * part * hours
                if lender.share in ours:
                    lent_to[borrower.share] += flow
                if borrower.share in ours:
                    borrowed_from[lender.share] += flow
            if borrower.share in ours:
                borrowed_from[FREE_POOL] += max(0.0, total_borrowed - total_lent) * part * hours
    return LendingFlows(
        lent_to={k: round(v, 2) for k, v in sorted(lent_to.items()) if v > 0},
        borrowed_from={k: round(v, 2) for k, v in sorted(borrowed_from.items()) if v > 0},
    )


# --- Events ---------------------------------------------------------------------------------

RECLAIM, IN_SHARE, UNKNOWN = "reclaim", "in_share", "unknown"


@dataclass(frozen=True)
class PreemptionEvent:
    at: datetime
    job_id: int
    job: str
    share: str
    gpu_type: str
    gpus: int
    kind: str  # RECLAIM (for another share's job), IN_SHARE, or UNKNOWN (not recorded)
    for_job_id: int | None
    for_job: str
    for_share: str

    @property
    def text(self) -> str:
        if self.kind == UNKNOWN:
            return f"{self.job} ({self.share}, {self.gpus} {self.gpu_type}) preempted"
        verb = "reclaimed by" if self.kind == RECLAIM else "preempted in-share for"
        return (
            f"{self.job} ({self.share}, {self.gpus} {self.gpu_type}) {verb} "
            f"{self.for_job} of share {self.for_share}"
        )


def preemption_kind(victim_share_id: int, for_share_id: int | None) -> str:
    if for_share_id is None:
        return UNKNOWN
    return IN_SHARE if for_share_id == victim_share_id else RECLAIM


def preemption_events(
    *, start: datetime, end: datetime, share: QuotaShare | None = None
) -> list[PreemptionEvent]:
    """Attempts that ended PREEMPTED in [start, end): of the share's jobs (victims) and of other
    jobs preempted for the share's jobs (its reclaims). All of them when share is None."""
    attempts = (
        JobAttempt.objects.filter(outcome=JobAttempt.Outcome.PREEMPTED)
        .annotate(when=Coalesce("ended_at", "stop_requested_at", "scheduled_at"))
        .filter(when__gte=start, when__lt=end)
        .select_related("job__share", "preempted_for__share")
        .order_by("when")
    )
    if share is not None:
        attempts = attempts.filter(Q(job__share=share) | Q(preempted_for__share=share))
    events = []
    for attempt in attempts[:2000]:
        job, for_job = attempt.job, attempt.preempted_for
        events.append(
            PreemptionEvent(
                at=attempt.when,
                job_id=job.pk,
                job=str(job),
                share=job.share.name,
                gpu_type=job.gpu_type,
                gpus=job.gpus,
                kind=preemption_kind(job.share_id, for_job.share_id if for_job else None),
                for_job_id=for_job.pk if for_job else None,
                for_job=str(for_job) if for_job else "",
                for_share=for_job.share.name if for_job else "",
            )
        )
    return events


def share_change_events(*, share: QuotaShare, start: datetime, end: datetime) -> list[dict]:
    """The share's changes in [start, end), the fields changed at one instant grouped."""
    grouped: dict[datetime, dict] = {}
    changes = (
        ShareChange.objects.filter(share=share, changed_at__gte=start, changed_at__lt=end)
        .select_related("changed_by")
        .order_by("changed_at", "id")
    )
    for change in changes[:500]:
        at = change.changed_at.replace(microsecond=0)
        entry = grouped.setdefault(
            at, {"at": at, "by": str(change.changed_by or change.source), "fields": []}
        )
        entry["fields"].append(f"{change.field}: {change.old_value or '∅'} → {change.new_value}")
    return list(grouped.values())


# --- Now ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuTypeNow:
    gpu_type: str
    capacity: int  # GPUs on nodes that are up (READY or DRAINING), less those used outside
    in_use: int
    down: int
    idle_lendable: float  # idle GPUs a borrower could get now: free pool + lendable quota
    # GPUs on nodes that are up held by jobs the portal did not submit (a cluster manager's
    # own): never planned on and not capacity (docs/semantics.md), so shown beside it.
    outside: int = 0


def cluster_now(usage: list[ShareUsage] | None = None) -> list[GpuTypeNow]:
    """Per GPU type: capacity, GPUs in use, used outside the portal and down, and idle GPUs that
    borrowers could use (the free pool plus every LEND / LEND_AND_BORROW share's idle quota
    within its lend_limit)."""
    usage = current_usage() if usage is None else usage
    up: dict[str, int] = defaultdict(int)
    ready: dict[str, int] = defaultdict(int)
    down: dict[str, int] = defaultdict(int)
    outside: dict[str, int] = defaultdict(int)
    for gpu_type, state, _nodes, total, held_outside in node_gpus():
        if state == Node.State.DOWN:
            down[gpu_type] += total
            continue
        up[gpu_type] += total - held_outside
        outside[gpu_type] += held_outside
        if state == Node.State.READY:
            ready[gpu_type] += total - held_outside
    lend_rules = {
        (share, gpu_type): (strategy, lend_limit)
        for share, gpu_type, strategy, lend_limit in CapacityLimit.objects.values_list(
            "share__name", "gpu_type", "share__strategy", "lend_limit"
        )
    }
    in_use: dict[str, int] = defaultdict(int)
    covered: dict[str, int] = defaultdict(int)
    lendable: dict[str, float] = defaultdict(float)
    for row in usage:
        in_use[row.gpu_type] += row.usage
        covered[row.gpu_type] += row.limit
        strategy, lend_limit = lend_rules.get((row.share, row.gpu_type), ("RESERVE", None))
        if strategy != QuotaShare.Strategy.RESERVE:
            can_lend = row.idle if lend_limit is None else min(row.idle, lend_limit - row.lent)
            lendable[row.gpu_type] += max(0.0, can_lend)
    result = []
    for gpu_type in sorted(set(up) | set(down) | set(in_use)):
        borrowed = sum(r.borrowed for r in usage if r.gpu_type == gpu_type)
        lent = sum(r.lent for r in usage if r.gpu_type == gpu_type)
        pool_left = max(0.0, ready[gpu_type] - covered[gpu_type] - (borrowed - lent))
        result.append(
            GpuTypeNow(
                gpu_type=gpu_type,
                capacity=up[gpu_type],
                in_use=in_use[gpu_type],
                down=down[gpu_type],
                idle_lendable=round(pool_left + lendable[gpu_type], 3),
                outside=outside[gpu_type],
            )
        )
    return result


def node_gpus() -> QuerySet:
    """(gpu_type, state, nodes, GPUs, GPUs used outside the portal) per GPU type and node
    state. A node never has more GPUs outside the portal than it has (the connector API checks
    it); Least keeps it so for a row written otherwise, as the engine does."""
    return (
        Node.objects.values_list("gpu_type", "state")
        .annotate(n=Count("id"), total=Sum("gpus"), outside=Sum(Least("outside_gpus", "gpus")))
        .order_by()
    )


@dataclass(frozen=True)
class NodeHoldingBack:
    name: str
    gpu_type: str
    gpus: int
    state: str
    state_reason: str
    outside_gpus: int
    connector: str  # "" for a node its own agent runs


# The overview lists only the nodes that hold GPUs back: a large cluster's healthy nodes would
# bury them, and the page must stay light (bench/dashboard.py).
MAX_NODES_HOLDING_BACK = 200


def nodes_holding_back(limit: int = MAX_NODES_HOLDING_BACK) -> list[NodeHoldingBack]:
    """Nodes that do not give all their GPUs to the portal: DRAINING or DOWN, or with GPUs used
    outside the portal; the most GPUs held back first, then by name."""
    rows = (
        Node.objects.filter(~Q(state=Node.State.READY) | Q(outside_gpus__gt=0))
        .annotate(
            held_back=Case(
                When(state=Node.State.READY, then=Least("outside_gpus", "gpus")),
                default=F("gpus"),
            )
        )
        .order_by("-held_back", "name")
        .values_list(
            "name", "gpu_type", "gpus", "state", "state_reason", "outside_gpus", "connector__name"
        )[:limit]
    )
    return [NodeHoldingBack(*row[:6], connector=row[6] or "") for row in rows]


@dataclass(frozen=True)
class QueueEntry:
    position: int
    job_id: int
    job: str
    share: str
    gpu_type: str
    gpus: int
    priority: int
    submitted_at: datetime
    waiting: timedelta
    pass_: str  # order.PROMISED, order.WITHIN_LIMIT or order.BORROWING
    reason: str
    held_off_until: datetime | None = None  # the churn breaker's, if it holds the job off
    estimated_start: datetime | None = None  # docs/estimates.md
    expected_seconds: float | None = None  # what the estimate counts on for its run time

    @property
    def within_limit(self) -> bool:
        """Considered before the borrowers (promised GPUs, or within its share's limit)."""
        return self.pass_ != order.BORROWING


def queue_front(*, limit: int = 200, now: datetime | None = None) -> list[QueueEntry]:
    """RUNNABLE jobs in the order the engine considers them, as the API's queue shows them
    (`scheduler.jobs.selectors.queue_front`)."""
    now = now or timezone.now()
    _runnable, front = job_selectors.queue_front(limit=limit)
    held = job_selectors.held_off(Job.objects.filter(pk__in=[entry.job.pk for entry in front]), now)
    expected = expected_times_of(entry.job for entry in front if entry.job.estimated_start)
    return [
        QueueEntry(
            position=entry.position,
            job_id=entry.job.pk,
            job=str(entry.job),
            share=entry.job.share.name,
            gpu_type=entry.job.gpu_type,
            gpus=entry.job.gpus,
            priority=entry.job.priority,
            submitted_at=entry.job.submitted_at,
            waiting=now - entry.job.submitted_at,
            pass_=entry.pass_,
            reason=entry.job.reason,
            held_off_until=held.get(entry.job.pk),
            estimated_start=entry.job.estimated_start,
            expected_seconds=expected[entry.job.pk].seconds if entry.job.pk in expected else None,
        )
        for entry in front
    ]


def queue_summary(now: datetime | None = None) -> dict:
    """How many jobs wait (RUNNABLE), for how many GPUs, and since when the oldest waits."""
    now = now or timezone.now()
    row = Job.objects.filter(state=Job.State.RUNNABLE).aggregate(
        jobs=Count("id"), gpus=Sum("gpus"), oldest=Min("submitted_at")
    )
    return {
        "jobs": row["jobs"],
        "gpus": row["gpus"] or 0,
        "oldest_wait": now - row["oldest"] if row["oldest"] else None,
    }


def wait_times(*, shares: Iterable[str], start: datetime, end: datetime) -> dict[str, list[float]]:
    """Minutes from submission to first start of the shares' jobs that started in [start, end)."""
    waits: dict[str, list[float]] = defaultdict(list)
    jobs = Job.objects.filter(
        share__name__in=list(shares), started_at__gte=start, started_at__lt=end
    ).values_list("share__name", "submitted_at", "started_at")
    for share, submitted_at, started_at in jobs.order_by()[:20000]:
        waits[share].append(max(0.0, (started_at - submitted_at).total_seconds() / 60))
    return dict(waits)


def share_jobs(share: QuotaShare, limit: int = 100):
    """The share's jobs: those not ended first, then the latest ended ones."""
    active = list(
        Job.objects.filter(share=share)
        .exclude(state__in=Job.FINAL_STATES)
        .select_related("submitted_by")
        .order_by("-priority", "submitted_at")[:limit]
    )
    ended = list(
        Job.objects.filter(share=share, state__in=Job.FINAL_STATES)
        .select_related("submitted_by")
        .order_by("-submitted_at")[: max(0, limit - len(active))]
    )
    mark_held_off(active + ended)
    return active + ended


# --- Jobs, for everyone who submits -------------------------------------------------------------

JOBS_PER_PAGE = 50
AHEAD_SHOWN = 20  # jobs ahead listed on a waiting job's page


def jobs_of(user, *, mine: bool, state: str | None) -> QuerySet[Job]:
    """The jobs `user` submitted (`mine`), or every job they may see (their teams' shares;
    every job for an admin), newest first, in `state` when given."""
    return job_selectors.job_list(
        user=user,
        states=[state] if state else None,
        submitted_by=user.get_username() if mine else None,
    )


def mark_held_off(jobs: Iterable[Job]) -> None:
    """Set `held_off_until` on each job: until when the churn breaker keeps it off borrowed
    GPUs, or None."""
    jobs = list(jobs)
    held = job_selectors.held_off(Job.objects.filter(pk__in=[job.pk for job in jobs]))
    for job in jobs:
        job.held_off_until = held.get(job.pk)


def jobs_shown(jobs: Iterable[Job], count: int) -> str:
    """What a jobs page shows of its `jobs` (with `held_off_until`, as `mark_held_off` sets
    it) and of the `count` of jobs its filter finds, as one string that changes when any of
    it does: the page follows its jobs by comparing it (times to the minute, as shown)."""

    def minute(at: datetime | None) -> str:
        return f"{at:%Y-%m-%d %H:%M}" if at is not None else ""

    digest = hashlib.sha256(str(count).encode())
    for job in jobs:
        estimate = job.estimated_start if job.state == Job.State.RUNNABLE else None
        row = (job.pk, job.state, job.reason, minute(estimate), minute(job.held_off_until),
               minute(job.started_at), minute(job.finished_at), job.priority)  # fmt: skip
        digest.update(repr(row).encode())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class AttemptRow:
    attempt: JobAttempt
    # (node, GPU indices), in the order given: those the cluster manager gave where its
    # connector said (a Slurm job's), else the portal's own.
    gpus: list[tuple[str, list[int]]]
    cluster_id: str  # what a connector's cluster manager runs it as ("": an agent runs it)


@dataclass(frozen=True)
class JobPage:
    """What a job's page shows: the job (with `held_off_until`), its attempts newest first,
    its events in order, where it stands in the queue, and whether the viewer may cancel it
    (`cancellable`: may, and there is something left to cancel) or change its priority."""

    job: Job
    attempts: list[AttemptRow]
    events: list
    ahead: job_selectors.SeenAhead
    may_cancel: bool
    may_change_priority: bool

    @property
    def cancellable(self) -> bool:
        return self.may_cancel and not self.job.is_final and not self.job.cancel_requested


def visible_job(user, job_id: int) -> Job | None:
    """The job as `user` may see it (`job_selectors.job_detail`), or None: also for an id the
    database cannot hold, as the API's `jobs/<id>/` (`portal.ids`)."""
    if not is_row_id(job_id):
        return None
    return job_selectors.job_detail(user=user, job_id=job_id)


def job_page(user, job_id: int) -> JobPage | None:
    """The job's page as `user` may see it (`visible_job`), or None."""
    job = visible_job(user, job_id)
    if job is None:
        return None
    mark_held_off([job])
    attempts = []
    for attempt in reversed(job.attempt_list):
        cluster_job = attempt.cluster_job or {}
        given = [(a["node"], list(a["gpu_indices"])) for a in cluster_job.get("allocations", [])]
        if not given:
            by_node: dict[str, list[int]] = {}
            for node, index in attempt.gpu_list:
                by_node.setdefault(node, []).append(index)
            given = list(by_node.items())
        attempts.append(AttemptRow(attempt, given, str(cluster_job.get("id", ""))))
    return JobPage(
        job=job,
        attempts=attempts,
        events=job.event_list,
        ahead=job_selectors.ahead_seen_by(user, job, limit=AHEAD_SHOWN),
        may_cancel=job_selectors.may_cancel(user, job),
        may_change_priority=job_selectors.may_change_priority(user, job),
    )
