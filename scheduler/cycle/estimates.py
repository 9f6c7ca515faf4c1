"""Estimated starts of the waiting jobs (docs/estimates.md): the cycle's snapshot, the jobs'
expected run times, and the engine replayed forward by `scheduler.simulator.estimate`; stored on
the jobs. Run by a Celery task after cycles, coalesced (`request_estimates`), never on the
request path; `jobs_estimate` answers a what-if for a job not submitted."""

from __future__ import annotations

import functools
import logging
import statistics
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from functools import cache

from django.conf import settings
from django.db import connection, transaction

from portal.db.bulk import rows_update
from portal.db.sql import ids_param, ids_sql, prepared_cursor
from portal.priority import at_low_priority
from portal.redis import redis_client
from scheduler import engine
from scheduler.cycle.snapshot import cycle_snapshot
from scheduler.engine.collector import collector_paused
from scheduler.models import Job, JobAttempt, allocations_data
from scheduler.simulator.estimate import Estimates, estimate_starts

logger = logging.getLogger(__name__)

QUEUED_KEY = "portal:estimates:queued:{db}"  # a refresh was queued less than N s ago
PENDING_KEY = "portal:estimates:pending:{db}"  # a cycle planned since the last one queued
# Of a share's history: the latest this many successful runs of a size count.
HISTORY_RUNS = 20
# Without anything to go on: a job is assumed to run this long.
DEFAULT_EXPECTED_SECONDS = 3600.0

BASIS_EXPECTED = "its expected_seconds"
BASIS_TIMEOUT = "its timeout"
BASIS_HISTORY = "the median of the last {runs} runs of share {share} at {gpus} GPUs"
BASIS_SHARE_HISTORY = "the median of the last {runs} runs of share {share}"
BASIS_DEFAULT = "no history: {hours:g} h assumed"
# Every estimate says what it counts on: its own run time's basis, and that new jobs are not.
BASIS = "simulated from the queue now, assuming no new job is submitted; its run time: {own}"
# A job the replay did not see start: it starts later than this (the horizon, or as far as the
# replay got in its time budget).
LATER_THAN = "starts after {when:%Y-%m-%d %H:%M} UTC, beyond what the estimate replayed; "


@dataclass(frozen=True)
class ExpectedTime:
    seconds: float
    basis: str


@dataclass
class EstimateRun:
    """What one refresh did, for logs, tests and the benchmark."""

    runnable: int = 0
    estimated: int = 0
    seconds: float = 0.0
    replayed: float = 0.0  # seconds ahead the replay got
    # Seconds of each step: snapshot, expected times, replay, write.
    timings: dict[str, float] = field(default_factory=dict)


class History:
    """Recent successful run times by share and size, and by share, read in one query."""

    def __init__(self) -> None:
        self.by_size: dict[tuple[str, int], list[float]] = defaultdict(list)
        self.by_share: dict[str, list[float]] = defaultdict(list)
        with prepared_cursor() as cursor:
            cursor.execute(_history_sql(), [JobAttempt.Outcome.SUCCEEDED, 50 * HISTORY_RUNS])
            for share, gpus, seconds in cursor.fetchall():
                if seconds is None or seconds <= 0:
                    continue
                if len(self.by_size[share, gpus]) < HISTORY_RUNS:
                    self.by_size[share, gpus].append(float(seconds))
                if len(self.by_share[share]) < HISTORY_RUNS:
                    self.by_share[share].append(float(seconds))

    def expected(self, share: str, gpus: int) -> ExpectedTime:
        runs = self.by_size.get((share, gpus))
        if runs:
            basis = BASIS_HISTORY.format(runs=len(runs), share=share, gpus=gpus)
            return ExpectedTime(statistics.median(runs), basis)
        runs = self.by_share.get(share)
        if runs:
            return ExpectedTime(
                statistics.median(runs), BASIS_SHARE_HISTORY.format(runs=len(runs), share=share)
            )
        return ExpectedTime(
            DEFAULT_EXPECTED_SECONDS, BASIS_DEFAULT.format(hours=DEFAULT_EXPECTED_SECONDS / 3600)
        )


def expected_time(
    *, expected_seconds: int | None, timeout_seconds: int | None, share: str, gpus: int,
    history: History,
) -> ExpectedTime:  # fmt: skip
    """How long a job is expected to run: its own `expected_seconds`, else its timeout, else
    its share's history."""
    if expected_seconds:
        return ExpectedTime(float(expected_seconds), BASIS_EXPECTED)
    if timeout_seconds:
        return ExpectedTime(float(timeout_seconds), BASIS_TIMEOUT)
    return history.expected(share, gpus)


def expected_times_of(jobs: Iterable[Job]) -> dict[int, ExpectedTime]:
    """The expected run time of each of `jobs` (as an estimate counts on it), by id."""
    history = History()
    return {
        job.pk: expected_time(
            expected_seconds=job.expected_seconds,
            timeout_seconds=job.timeout_seconds,
            share=job.share.name,
            gpus=job.gpus,
            history=history,
        )  # fmt: skip
        for job in jobs
    }


def estimates_refresh(*, horizon: float | None = None) -> EstimateRun:
    """Estimate when every RUNNABLE job starts and store it on the job (none: not within the
    horizon); clear the estimates of jobs no longer waiting."""
    with collector_paused():
        return _refresh(horizon)


def _refresh(horizon: float | None) -> EstimateRun:
    started = time.perf_counter()
    timings = {}
    snapshot, _context = cycle_snapshot()
    timings["snapshot"] = time.perf_counter() - started
    result, times = _estimate(snapshot, horizon, timings=timings, background=True)
    step = time.perf_counter()
    estimates = result.starts
    now = datetime.fromtimestamp(snapshot.now, tz=UTC)
    later = LATER_THAN.format(when=now + timedelta(seconds=result.replayed))
    rows = []
    for job in snapshot.runnable:
        estimate = estimates.get(job.id)
        basis = BASIS.format(own=times[job.id].basis)
        if estimate is None:
            rows.append((int(job.id), None, [], later + basis))
        else:
            start = now + timedelta(seconds=estimate.start)
            rows.append((int(job.id), start, allocations_data(estimate.allocations), basis))
    fields = ("estimated_start", "estimated_allocations", "estimate_basis")
    with transaction.atomic():
        # The jobs are locked first, in id order, as the cycle locks them, and those that
        # another transaction holds (a cycle placing them, a report) are left for the next
        # refresh: an UPDATE of many rows locks them in its plan's order, and deadlocked with
        # the cycle at 2,000 agents.
        free = _unlocked(Job.objects.filter(state=Job.State.RUNNABLE))
        rows_update(Job, fields, [row for row in rows if row[0] in free],
                    where=("state", Job.State.RUNNABLE))  # fmt: skip
        # Jobs leave the queue without their estimates (scheduler.transitions); these are
        # older.
        stale = _unlocked(Job.objects.exclude(state=Job.State.RUNNABLE).exclude(estimate_basis=""))
        Job.objects.filter(pk__in=stale).update(**Job.no_estimate())
    ended = time.perf_counter()
    timings["write"] = ended - step
    run = EstimateRun(len(snapshot.runnable), len(estimates), ended - started, result.replayed,
                      timings)  # fmt: skip
    steps = ", ".join(f"{name} {seconds * 1000:.0f}" for name, seconds in timings.items())
    logger.info("estimates: %d of %d waiting jobs within the horizon, in %.2f s (ms: %s)",
                run.estimated, run.runnable, run.seconds, steps)  # fmt: skip
    return run


def _unlocked(jobs) -> set[int]:
    """The ids of `jobs`, locked in id order, but for those another transaction holds."""
    return set(jobs.select_for_update(skip_locked=True).order_by("pk").values_list("pk", flat=True))


@dataclass(frozen=True)
class WhatIf:
    """When a job not submitted would start if it were submitted now, and why it would wait."""

    estimated_start: datetime | None  # None: not within the horizon
    estimated_nodes: tuple[str, ...]
    estimated_allocations: list[dict]  # [{node, gpu_indices}]
    estimate_basis: str
    reason: str | None  # why it would wait at the next cycle; None: it would start at once


WHAT_IF_ID = "what-if"  # no job's id (those are numbers)


def what_if(job: Job) -> WhatIf:
    """What-if for `job`, checked as a submission but not saved: behind the queue as it is."""
    snapshot, _context = cycle_snapshot()
    view = engine.RunnableJob(
        WHAT_IF_ID, job.share.name, job.gpu_type, job.gpus, job.nodes, job.priority,
        snapshot.now, preemptible=job.preemptible,
    )  # fmt: skip
    snapshot = replace(snapshot, runnable=(*snapshot.runnable, view))
    own = expected_time(
        expected_seconds=job.expected_seconds, timeout_seconds=job.timeout_seconds,
        share=job.share.name, gpus=job.gpus, history=History(),
    )  # fmt: skip
    reason = engine.plan(snapshot).waiting.get(WHAT_IF_ID)
    result, _times = _estimate(snapshot, None, extra={WHAT_IF_ID: own})
    estimate = result.starts.get(WHAT_IF_ID)
    now = datetime.fromtimestamp(snapshot.now, tz=UTC)
    basis = BASIS.format(own=own.basis)
    if estimate is None:
        basis = LATER_THAN.format(when=now + timedelta(seconds=result.replayed)) + basis
    return WhatIf(
        estimated_start=None if estimate is None else now + timedelta(seconds=estimate.start),
        estimated_nodes=() if estimate is None else estimate.nodes,
        estimated_allocations=[] if estimate is None else allocations_data(estimate.allocations),
        estimate_basis=basis,
        reason=reason,
    )


def _estimate(
    snapshot: engine.Snapshot,
    horizon: float | None,
    extra: Mapping[str, ExpectedTime] | None = None,
    timings: dict[str, float] | None = None,
    background: bool = False,
) -> tuple[Estimates, dict[str, ExpectedTime]]:
    """The replay of `snapshot`, and the expected times it counted on; `timings`, if given,
    gets the seconds of reading the expected times and of the replay. `background` (a refresh,
    not a what-if someone waits for): the replay runs at low priority (`at_low_priority`), so
    on a busy machine it takes only the CPU the cycles and the requests leave, and sees less
    far ahead within its budget."""
    extra = extra or {}
    started = time.perf_counter()
    times = _expected_times(
        [job.id for job in snapshot.runnable if job.id not in extra]
        + [job.id for job in snapshot.placed]
    )
    times.update(extra)
    grace = {share.name: share.grace_seconds for share in snapshot.shares}
    stopped = _stops_ordered([placed.id for placed in snapshot.placed if placed.stopping])
    remaining = {}
    for placed in snapshot.placed:
        if placed.stopping:
            # At most what is left of its grace period since its stop was ordered.
            left = float(grace.get(placed.share, 0))
            if placed.id in stopped:
                left = max(0.0, left - (snapshot.now - stopped[placed.id]))
            remaining[placed.id] = left
        else:
            remaining[placed.id] = times[placed.id].seconds - (snapshot.now - placed.started)
    read = time.perf_counter()
    replay = functools.partial(
        estimate_starts,
        snapshot,
        expected={job_id: time_.seconds for job_id, time_ in times.items()},
        remaining=remaining,
        horizon=settings.ESTIMATE_HORIZON_SECONDS if horizon is None else horizon,
        budget=settings.ESTIMATE_BUDGET_SECONDS,
    )
    estimates = at_low_priority(replay) if background else replay()
    if timings is not None:
        timings["expected times"] = read - started
        timings["replay"] = time.perf_counter() - read
    return estimates, times


def _stops_ordered(job_ids: list[str]) -> dict[str, float]:
    """When the stop of each job's open attempt was ordered (epoch seconds), for the jobs
    among `job_ids` (those being stopped: a few) that have one."""
    if not job_ids:
        return {}
    attempts = JobAttempt.objects.filter(
        job_id__in=[int(job_id) for job_id in job_ids],
        ended_at__isnull=True,
        stop_requested_at__isnull=False,
    )
    return {
        str(job_id): at.timestamp()
        for job_id, at in attempts.values_list("job_id", "stop_requested_at")
    }


def _expected_times(job_ids: Iterable[str]) -> dict[str, ExpectedTime]:
    ids = sorted({int(job_id) for job_id in job_ids})
    history = History()
    times = {}
    with prepared_cursor() as cursor:
        # The ids as one parameter: tens of thousands of them in an IN list cost more to send
        # and parse than the rows cost to read.
        cursor.execute(_job_times_sql(), [ids_param(ids)])
        rows = cursor.fetchall()
    for pk, expected_seconds, timeout_seconds, share, gpus in rows:
        times[str(pk)] = expected_time(
            expected_seconds=expected_seconds, timeout_seconds=timeout_seconds, share=share,
            gpus=gpus, history=history,
        )  # fmt: skip
    return times


@cache
def _job_times_sql() -> str:
    """(id, expected_seconds, timeout_seconds, share name, GPUs) of the jobs whose ids are the
    parameter (`ids_param`)."""
    job = connection.ops.quote_name(Job._meta.db_table)
    share = connection.ops.quote_name(Job._meta.get_field("share").related_model._meta.db_table)
    return (
        f"SELECT j.id, j.expected_seconds, j.timeout_seconds, s.name, j.gpus FROM {job} j "
        f"JOIN {share} s ON s.id = j.share_id WHERE {ids_sql('j.id')}"
    )


def estimates_wanted(*, planned: bool) -> bool:
    """After each cycle (`planned`: it ran the engine): whether to queue a refresh of the
    estimates now. A cycle that planned marks one pending; a pending refresh is queued unless
    one was queued less than ESTIMATE_EVERY_SECONDS ago, so the beat's next cycle queues it
    once that time has passed, planning or not: refreshes are coalesced, and none is lost."""
    if not settings.ESTIMATES_ENABLED:
        return False
    db = connection.settings_dict["NAME"]
    try:
        client = redis_client()
        if planned:
            client.set(PENDING_KEY.format(db=db), "1", ex=3600)
        elif not client.exists(PENDING_KEY.format(db=db)):
            return False
        every = max(1, int(settings.ESTIMATE_EVERY_SECONDS))
        if not client.set(QUEUED_KEY.format(db=db), "1", nx=True, ex=every):
            return False
        client.delete(PENDING_KEY.format(db=db))
        return True
    except Exception:  # noqa: BLE001 — estimates are a convenience: the cycle goes on
        logger.warning("could not queue an estimate refresh", exc_info=True)
        return False


@cache
def _history_sql() -> str:
    """(share name, GPUs, seconds) of the latest successful attempts, newest first.
    Parameters: SUCCEEDED, how many."""
    attempt = connection.ops.quote_name(JobAttempt._meta.db_table)
    job = connection.ops.quote_name(Job._meta.db_table)
    share = connection.ops.quote_name(Job._meta.get_field("share").related_model._meta.db_table)
    if connection.vendor == "postgresql":
        seconds = "EXTRACT(EPOCH FROM (a.ended_at - a.started_at))"
    else:
        # A julianday is a double of about 2.46 million days: its difference is off by up to
        # about 0.1 ms, which the rounding takes back off (times are kept to the microsecond).
        seconds = "ROUND((julianday(a.ended_at) - julianday(a.started_at)) * 86400.0, 3)"
    return (
        f"SELECT s.name, j.gpus, {seconds} FROM {attempt} a "
        f"JOIN {job} j ON j.id = a.job_id JOIN {share} s ON s.id = j.share_id "
        "WHERE a.outcome = %s AND a.started_at IS NOT NULL AND a.ended_at IS NOT NULL "
        "ORDER BY a.ended_at DESC LIMIT %s"
    )
