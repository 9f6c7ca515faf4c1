"""Chargeback (issue 23): per period, share and GPU type, the GPU-hours a share used on its own
quota, borrowed, lent, had reclaimed from it, reclaimed for itself and lost to preemption.

GPU-hours of use come from the utilization history, read by the very selector and at the
very resolution the dashboards' charts read for the same range (`usage_history`,
`resolution_for`), so a chargeback agrees with the charts. What preemptions cost comes from
the attempts that ended PREEMPTED, the share page's markers. docs/chargeback.md defines every
column; all times are UTC."""

from __future__ import annotations

import csv
import io
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import astuple, dataclass, fields
from datetime import UTC, datetime, timedelta

from django.core.exceptions import ValidationError
from django.db.models import Q
from django.db.models.functions import Coalesce
from django.utils import timezone

from dashboards.models import Resolution, UsageSample
from dashboards.selectors import (
    RECLAIM,
    TimeRange,
    can_view_dashboards,
    preemption_kind,
    resolution_for,
    usage_history,
    visible_shares,
    visible_teams,
)
from scheduler.models import JobAttempt, seconds_lost
from shares.models import CapacityLimit, QuotaShare, Team
from shares.selectors import is_admin

MAX_DAYS = 366
PER_RANGE, PER_MONTH = "range", "month"
PER_CHOICES = (PER_RANGE, PER_MONTH)
FORMATS = ("json", "csv")
# History of a portal cannot predate it, and a bound keeps month arithmetic clear of year 9999.
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
LATEST = datetime(2100, 1, 1, tzinfo=UTC)

# Messages that tests assert: each names the field and the rule.
TIME_INVALID = (
    "{field}: give a date YYYY-MM-DD or a time YYYY-MM-DDTHH:MM[:SS], in UTC (a trailing Z or "
    "an offset +HH:MM is allowed) (got {value!r})."
)
TIME_OUT_OF_BOUNDS = "{field}: must lie between 2000-01-01 and 2100-01-01 UTC (got {value!r})."
MONTH_INVALID = "month: give a month as YYYY-MM, in UTC (got {value!r})."
MONTH_WITH_RANGE = "month: give either month, or start and end, not both."
TIME_REQUIRED = "{field}: required (or give month=YYYY-MM instead of start and end)."
END_NOT_AFTER_START = "end: must be after start (the range is [start, end), UTC, end excluded)."
RANGE_TOO_LONG = (
    f"end: a range spans at most {MAX_DAYS} days (got {{days}} days); ask for several ranges."
)
PER_INVALID = "per: must be 'range' (one row per share and GPU type) or 'month' (one per month)."
FORMAT_INVALID = "format: must be 'json' (the default) or 'csv' (got {value!r})."

_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2})?(Z|[+-]\d{2}:\d{2})?")
_MONTH = re.compile(r"(\d{4})-(\d{2})")


@dataclass(frozen=True)
class ChargebackRequest:
    """A validated request: the range [start, end) in UTC, cut into periods by `per`."""

    start: datetime
    end: datetime
    per: str = PER_RANGE

    @property
    def periods(self) -> list[tuple[datetime, datetime]]:
        """[start, end) whole, or cut at every first of a month 00:00 UTC inside it."""
        if self.per == PER_RANGE:
            return [(self.start, self.end)]
        cuts, at = [self.start], self.start
        while (at := month_after(at)) < self.end:
            cuts.append(at)
        return list(zip(cuts, [*cuts[1:], self.end], strict=True))


def month_after(at: datetime) -> datetime:
    """The first of the month after `at`'s, 00:00 UTC."""
    year, month = (at.year + 1, 1) if at.month == 12 else (at.year, at.month + 1)
    return datetime(year, month, 1, tzinfo=UTC)


def month_range(at: datetime) -> tuple[datetime, datetime]:
    """The calendar month (UTC) that holds `at`: [its first 00:00, the next month's first)."""
    start = at.astimezone(UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return start, month_after(start)


def _parse_time(field: str, value: str, errors: dict[str, str]) -> datetime | None:
    value = value.strip()
    if not (_DATE.fullmatch(value) or _TIME.fullmatch(value)):
        errors[field] = TIME_INVALID.format(field=field, value=value)
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:  # well formed, but no such day or hour (2026-02-30, 25:00)
        errors[field] = TIME_INVALID.format(field=field, value=value)
        return None
    parsed = parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    if not EARLIEST <= parsed <= LATEST:
        errors[field] = TIME_OUT_OF_BOUNDS.format(field=field, value=value)
        return None
    return parsed


def chargeback_request(
    *,
    start: str | None = None,
    end: str | None = None,
    month: str | None = None,
    per=None,
    format=None,
) -> ChargebackRequest:
    """Validate a chargeback's range: `month` (YYYY-MM), or `start` and `end` (a date, or a time
    to the minute or second; UTC unless an offset says otherwise; end excluded), at most
    MAX_DAYS long; `per` is 'range' (default) or 'month'; `format`, where given, one of
    FORMATS. Raises ValidationError {field: message} naming each field and its rule."""
    errors: dict[str, str] = {}
    per = per or PER_RANGE
    if per not in PER_CHOICES:
        errors["per"] = PER_INVALID
    if format and format not in FORMATS:
        errors["format"] = FORMAT_INVALID.format(value=format)
    begin = until = None
    if month:
        if start or end:
            errors["month"] = MONTH_WITH_RANGE
        elif not (found := _MONTH.fullmatch(month.strip())) or not 1 <= int(found[2]) <= 12:
            errors["month"] = MONTH_INVALID.format(value=month)
        else:
            begin = datetime(int(found[1]), int(found[2]), 1, tzinfo=UTC)
            if not EARLIEST <= begin < LATEST:
                errors["month"] = TIME_OUT_OF_BOUNDS.format(field="month", value=month)
            else:
                until = month_after(begin)
    else:
        for field, value in (("start", start), ("end", end)):
            if not value:
                errors[field] = TIME_REQUIRED.format(field=field)
        begin = _parse_time("start", start, errors) if start else None
        until = _parse_time("end", end, errors) if end else None
        if begin and until:
            if until <= begin:
                errors["end"] = END_NOT_AFTER_START
            elif until - begin > timedelta(days=MAX_DAYS):
                days = round((until - begin) / timedelta(days=1), 2)
                errors["end"] = RANGE_TOO_LONG.format(days=f"{days:g}")
    if errors:
        raise ValidationError({field: [message] for field, message in errors.items()})
    return ChargebackRequest(start=begin, end=until, per=per)


@dataclass(frozen=True)
class ChargebackRow:
    """One period, share and GPU type. GPU-hours are rounded to the thousandth (3.6 s of one
    GPU); docs/chargeback.md defines each column."""

    period_start: datetime
    period_end: datetime
    share: str
    team: str  # the team's slug; "" for a share that no longer exists (history keeps names)
    gpu_type: str
    resolution: str  # of the history read: raw, minute or hour, as the charts of the period
    sampled_hours: float  # time the history covers; less than the period where it has gaps
    quota_gpu_hours: float  # the limit over the sampled time
    used_gpu_hours: float  # own + borrowed
    own_gpu_hours: float  # used within the limit ("on own quota")
    borrowed_gpu_hours: float  # used above the limit
    lent_gpu_hours: float  # idle GPUs of the limit that borrowers used
    reclaimed_from_gpu_hours: float  # own work lost when lenders reclaimed GPUs from the share
    reclaimed_for_gpu_hours: float  # borrowers' work lost when the share reclaimed its GPUs
    lost_gpu_hours: float  # own work lost to every preemption (reclaims, in-share, unknown)
    preemptions: int  # the share's attempts preempted
    reclaims_from: int  # ... of them by another share's reclaim
    reclaims_for: int  # other shares' attempts preempted for the share's jobs


COLUMNS = tuple(f.name for f in fields(ChargebackRow))
# {(share, GPU type): {column: running total}} while a period is added up.
Totals = dict[tuple[str, str], dict[str, float]]
GPU_HOURS_DIGITS = 3
_HISTORY_COLUMNS = ("sampled", "quota", "used", "own", "borrowed", "lent")
_PREEMPTION_COLUMNS = ("reclaimed_from", "reclaimed_for", "lost")
_COUNT_COLUMNS = ("preemptions", "reclaims_from", "reclaims_for")


def chargeback(
    request: ChargebackRequest, *, shares: Iterable[str] | None = None, now: datetime | None = None
) -> list[ChargebackRow]:
    """The chargeback of the given shares (every share when None, including names that only the
    history still knows), one row per period, share and GPU type, ordered by period, share,
    GPU type. A share has a row for each GPU type of its limits (zeros where nothing
    happened), and for any other GPU type it has history or preemptions of in the period."""
    now = now or timezone.now()
    names = None if shares is None else sorted(set(shares))
    teams = dict(QuotaShare.objects.values_list("name", "team__slug"))
    limits = CapacityLimit.objects.values_list("share__name", "gpu_type")
    if names is not None:
        limits = limits.filter(share__name__in=names)
    current = set(limits)
    rows = []
    for start, end in request.periods:
        resolution = resolution_for(TimeRange("custom", start, end), now)
        totals: Totals = defaultdict(lambda: defaultdict(float))
        for key in current:  # a row even where nothing happened
            totals[key] = defaultdict(float)
        _add_history(totals, start=start, end=end, resolution=resolution, shares=names)
        _add_preemptions(totals, start=start, end=end, shares=names)
        for (share, gpu_type), values in sorted(totals.items()):
            hours = {
                k: round(values[k], GPU_HOURS_DIGITS)
                for k in (*_HISTORY_COLUMNS, *_PREEMPTION_COLUMNS)
            }
            rows.append(
                ChargebackRow(
                    period_start=start,
                    period_end=end,
                    share=share,
                    team=teams.get(share, ""),
                    gpu_type=gpu_type,
                    resolution=Resolution(resolution).label,
                    sampled_hours=hours["sampled"],
                    quota_gpu_hours=hours["quota"],
                    used_gpu_hours=hours["used"],
                    own_gpu_hours=hours["own"],
                    borrowed_gpu_hours=hours["borrowed"],
                    lent_gpu_hours=hours["lent"],
                    reclaimed_from_gpu_hours=hours["reclaimed_from"],
                    reclaimed_for_gpu_hours=hours["reclaimed_for"],
                    lost_gpu_hours=hours["lost"],
                    **{k: int(values[k]) for k in _COUNT_COLUMNS},
                )
            )
    return rows


def _add_history(
    totals: Totals, *, start: datetime, end: datetime, resolution: int, shares: list[str] | None
) -> None:
    """GPU-hours from the history: Σ average × the time it stands for, as the charts' points
    and the team page's GPU-hours (dashboards.selectors.gpu_hours) count them."""
    for point in usage_history(start=start, end=end, resolution=resolution, shares=shares):
        slot = totals[(point.share, point.gpu_type)]
        hours = point.seconds / 3600
        slot["sampled"] += hours
        slot["quota"] += point.limit * hours
        slot["used"] += point.usage * hours
        slot["own"] += point.own * hours
        slot["borrowed"] += point.borrowed * hours
        slot["lent"] += point.lent * hours


def _add_preemptions(
    totals: Totals, *, start: datetime, end: datetime, shares: list[str] | None
) -> None:
    """Preemptions that ended in [start, end), at the instant the share page marks them
    (dashboards.selectors.preemption_events): the whole work an attempt lost counts in the
    period in which it was preempted, so periods add up."""
    attempts = (
        JobAttempt.objects.filter(outcome=JobAttempt.Outcome.PREEMPTED)
        .annotate(when=Coalesce("ended_at", "stop_requested_at", "scheduled_at"))
        .filter(when__gte=start, when__lt=end)
    )
    if shares is not None:
        attempts = attempts.filter(
            Q(job__share__name__in=shares) | Q(preempted_for__share__name__in=shares)
        )
    visible = None if shares is None else set(shares)
    rows = attempts.values_list(
        "job__share_id", "job__share__name", "job__gpu_type", "job__gpus", "started_at",
        "last_checkpoint_at", "when", "preempted_for__share_id", "preempted_for__share__name",
    ).order_by()  # fmt: skip
    for share_id, share, gpu_type, gpus, started, checkpoint, when, for_id, for_share in rows:
        lost = gpus * seconds_lost(started, checkpoint, when) / 3600
        reclaim = preemption_kind(share_id, for_id) == RECLAIM
        if visible is None or share in visible:
            victim = totals[(share, gpu_type)]
            victim["preemptions"] += 1
            victim["lost"] += lost
            if reclaim:
                victim["reclaims_from"] += 1
                victim["reclaimed_from"] += lost
        if reclaim and (visible is None or for_share in visible):
            lender = totals[(for_share, gpu_type)]
            lender["reclaims_for"] += 1
            lender["reclaimed_for"] += lost


def history_share_exists(name: str) -> bool:
    """Whether the history knows a share of that name (it may have been renamed or deleted)."""
    return UsageSample.objects.filter(share=name).exists()


# --- Output ---------------------------------------------------------------------------------


def utc_text(at: datetime) -> str:
    """An instant as ISO 8601 in UTC with a Z, to the second (microseconds where it has any)."""
    at = at.astimezone(UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if at.microsecond else "%Y-%m-%dT%H:%M:%SZ")


def row_dict(row: ChargebackRow) -> dict:
    """A row for JSON: times as UTC text, the rest as they are."""
    data = dict(zip(COLUMNS, astuple(row), strict=True))
    data["period_start"], data["period_end"] = utc_text(row.period_start), utc_text(row.period_end)
    return data


# A cell starting with one of these is a formula to a spreadsheet (OWASP, "CSV Injection").
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_cell(value):
    """`value` as a CSV cell that a spreadsheet shows as written: text that starts like a
    formula (a share named `-2-3`) gets a leading single quote, as OWASP advises, so it is
    read as text, not evaluated; numbers and other text as they are."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def rows_csv(rows: Iterable[dict]) -> str:
    """CSV with a header row of COLUMNS, one line per row (dicts as row_dict gives them), every
    cell a `spreadsheet_cell`."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\r\n")
    writer.writeheader()
    writer.writerows(
        {column: spreadsheet_cell(value) for column, value in row.items()} for row in rows
    )
    return out.getvalue()


def report(request: ChargebackRequest, rows: list[ChargebackRow]) -> dict:
    """The JSON document of a chargeback: the range, its time zone, and the rows."""
    return {
        "start": utc_text(request.start),
        "end": utc_text(request.end),
        "timezone": "UTC",
        "per": request.per,
        "columns": list(COLUMNS),
        "rows": [row_dict(row) for row in rows],
    }


def filename(request: ChargebackRequest, extension: str) -> str:
    """chargeback-2026-11-01T00-00Z--2026-12-01T00-00Z.csv: the range, safe in a file name."""
    fmt = "%Y-%m-%dT%H-%MZ"
    return f"chargeback-{request.start:{fmt}}--{request.end:{fmt}}.{extension}"


# --- Whose chargeback ----------------------------------------------------------------------

CHARGEBACK_FORBIDDEN = (
    "chargeback: only team leads (for their teams' shares) and admins (for every share) may "
    "read chargebacks."
)
TEAM_NOT_VISIBLE = "team: no team with slug {slug!r} among the teams whose chargeback you see."
SHARE_NOT_VISIBLE = "share: no share named {name!r} among the shares whose chargeback you see."


class NotVisible(Exception):
    """A team or share the caller may not read the chargeback of (or that does not exist)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def can_read_chargeback(user) -> bool:
    """Whoever sees the dashboards: admins and team leads; members and outsiders do not."""
    return can_view_dashboards(user)


def chargeback_shares(user, *, team: str = "", share: str = "") -> list[str] | None:
    """The share names a chargeback covers: every share (None) for an admin, or for the
    operator's management command (user None); a lead's teams' shares; narrowed to one team
    (slug) or one share when given. Raises NotVisible for a team or share outside them."""
    everything = user is None or is_admin(user)
    names: list[str] | None = None
    if not everything:
        names = list(visible_shares(user).values_list("name", flat=True))
    if team:
        teams = Team.objects.all() if everything else visible_teams(user)
        found = teams.filter(slug=team).first()
        if found is None:
            raise NotVisible("team", TEAM_NOT_VISIBLE.format(slug=team))
        names = list(found.shares.values_list("name", flat=True))
    if share:
        if names is None:  # an admin may also name a share that only the history knows
            known = QuotaShare.objects.filter(name=share).exists() or history_share_exists(share)
        else:
            known = share in names
        if not known:
            raise NotVisible("share", SHARE_NOT_VISIBLE.format(name=share))
        names = [share]
    return names
