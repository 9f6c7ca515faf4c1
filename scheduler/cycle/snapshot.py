"""What the engine needs to plan, loaded from the database: nodes, shares, placed jobs (their
open attempts) and runnable jobs, as tuples of the needed columns.

`cycle_snapshot()` reads it all. The cycle itself (`SnapshotCache.load`, under the cycle lock)
keeps the placed and runnable jobs between cycles and reads again only the jobs the database's
change feed names (migrations 0005 and 0009: triggers record every job whose row, or one of whose
attempts, changed, whoever wrote it, in the writer's transaction; the cycle consumes the feed).
Each load leaves a row in the feed's history (migration 0014): the jobs it read from the feed,
and those whose reasons its cycle wrote without recording them; a worker process whose copy the
other processes' cycles brought up to date since reads again the jobs their rows name. Nodes
and shares, a few thousand rows at most, are read every cycle. Whenever the cache cannot prove
itself current (first cycle, a history that no longer reaches back to its own load, a TRUNCATE,
a missing trigger, an error) it reads everything, as `cycle_snapshot()`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from itertools import pairwise
from typing import Generic, TypeVar

from django.conf import settings
from django.db import connection
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from portal.db.sql import ids_param, ids_sql, json_value, prepared_cursor
from scheduler import engine
from scheduler.models import ClusterSettings, Job, JobAttempt, Node
from shares.models import CapacityLimit, QuotaShare

R = TypeVar("R")

logger = logging.getLogger(__name__)

CHANGES_TABLE = "scheduler_snapshotchange"
# Up to this many changed jobs are always read one by one.
FULL_READ_CHANGES = 1000
STATE_TABLE = "scheduler_snapshotstate"
HISTORY_TABLE = "scheduler_snapshothistory"
# How many loads the history keeps: a worker process whose copy is older reads everything.
HISTORY_KEEP = 1000
# The history's statements. A load's row: its token, the token it found and the jobs it read
# from the feed; more jobs (the first parameter, after a comma) for a load's row (its token);
# keep the latest loads (how many: the parameter); (token, previous, job ids) of a load (its
# token) and of every load after it, in order.
HISTORY_ADD_SQL = f"INSERT INTO {HISTORY_TABLE} (token, previous, job_ids) VALUES (%s, %s, %s)"
HISTORY_APPEND_SQL = f"UPDATE {HISTORY_TABLE} SET job_ids = job_ids || %s WHERE token = %s"
HISTORY_PRUNE_SQL = (
    f"DELETE FROM {HISTORY_TABLE} WHERE id <= (SELECT MAX(id) FROM {HISTORY_TABLE}) - %s"
)
HISTORY_SINCE_SQL = (
    f"SELECT token, previous, job_ids FROM {HISTORY_TABLE} "
    f"WHERE id >= (SELECT id FROM {HISTORY_TABLE} WHERE token = %s) ORDER BY id"
)
# The triggers of migrations 0005 and 0012, by database: without all of them the feed may miss
# changes, and every cycle reads everything. On SQLite a migration that rebuilds the job or the
# attempt table drops its triggers: it must make them again, as 0012 does (tests/db checks).
# A column the snapshot starts to read goes into the update triggers' lists in a migration.
FEED_TRIGGERS = {
    "postgresql": (
        "job_snapshot_insert_delete", "job_snapshot_update", "job_snapshot_truncate",
        "attempt_snapshot_insert_delete", "attempt_snapshot_update", "attempt_snapshot_truncate",
    ),
    "sqlite": (
        "job_snapshot_insert", "job_snapshot_delete", "job_snapshot_update",
        "attempt_snapshot_insert", "attempt_snapshot_delete", "attempt_snapshot_update",
    ),
}  # fmt: skip


@dataclass
class SnapshotContext:
    """What applying a plan needs to know about the snapshot it came from."""

    reasons: dict[str, str]  # runnable job's engine id (RunnableJob.id) → its reason when loaded
    # The reasons are the kept snapshot's own: the cycle writes them without recording them in
    # the change feed, updates `reasons` with what it wrote (apply._apply_waiting) and tells
    # `reasons_written` which jobs' it wrote.
    keeps_reasons: bool = False
    reasons_written: Callable[[Iterable[int]], None] = lambda job_ids: None


def cycle_snapshot() -> tuple[engine.Snapshot, SnapshotContext]:
    """Load everything the engine needs: nodes, shares, placed jobs (open attempts) and
    runnable jobs (in id order), as tuples of the needed columns (no model instances but the
    few shares), with written-out SQL: for a queue of 10,000 jobs, composing and iterating the
    ORM's queries cost the cycle several times what PostgreSQL spends on them
    (bench/cycle.py). Reads the change feed nothing and leaves it as it is."""
    jobs = _Jobs(churn=_churn())
    node_views = _nodes()
    share_names, share_views = _shares()
    jobs.load(share_names, ids=None)
    return jobs.snapshot(node_views, share_views), SnapshotContext(reasons=dict(jobs.reasons))


class _MadeFromRows(Generic[R]):
    """What is made from the rows a query reads, made again only when they differ from the rows
    read last: every cycle reads them, and what is made of them seldom changes. `make` gets the
    rows (it may read more itself, after them: if that changed in between, the next read's rows
    differ from these, and it is made again)."""

    def __init__(self, sql: Callable[[], str], make: Callable[[list[tuple]], R]) -> None:
        self.sql = sql
        self.make = make
        self.last: tuple[list[tuple], R] | None = None

    def __call__(self) -> R:
        with prepared_cursor() as cursor:
            cursor.execute(self.sql())
            rows = cursor.fetchall()
        last = self.last
        if last is not None and last[0] == rows:
            return last[1]
        made = self.make(rows)
        self.last = (rows, made)
        return made


def _node_views(rows: list[tuple]) -> tuple[engine.NodeView, ...]:
    node_view = engine.NodeView
    return tuple(
        node_view(name=name, gpu_type=gpu_type, gpus=gpus, state=state, outside_gpus=outside)
        for name, gpu_type, gpus, state, outside in rows
    )


def _churn() -> tuple[int, float]:
    """The churn breaker's settings: (preemptions, window in seconds)."""
    row = ClusterSettings.load()
    return row.churn_preemptions, float(row.churn_window_seconds)


def _share_views(rows: list[tuple]) -> tuple[dict[int, str], tuple[engine.ShareView, ...]]:
    """The shares' names by id, and their views (`QuotaShare.engine_view`), the one way a share
    becomes the engine's: `rows` only tell when to make them again."""
    share_views = []
    share_names: dict[int, str] = {}
    for share in QuotaShare.objects.prefetch_related("capacity_limits"):
        share_names[share.pk] = share.name
        share_views.append(share.engine_view())
    return share_names, tuple(share_views)


@dataclass
class _Jobs:
    """The placed and runnable jobs of a snapshot, by id, as the engine takes them."""

    # The churn breaker's settings the jobs were read with: a job's latest preemptions, as
    # many as it counts, go with it.
    churn: tuple[int, float] = (0, 0.0)
    runnable: dict[int, engine.RunnableJob] = field(default_factory=dict)  # no claims
    # By the engine's id of the job, as the plan's `waiting` names them: a cycle compares
    # every waiting job's reason with this.
    reasons: dict[str, str] = field(default_factory=dict)
    # Requeued victims whose latest attempt was preempted for a job: id → (that job's id,
    # the attempt's end), for `_claims`.
    victims: dict[int, tuple[int, float]] = field(default_factory=dict)
    placed: dict[int, engine.PlacedJob] = field(default_factory=dict)  # by attempt id
    attempts_of: dict[int, list[int]] = field(default_factory=dict)  # job id → attempt ids

    def forget(self, ids: Iterable[int]) -> None:
        for job_id in ids:
            self.runnable.pop(job_id, None)
            self.reasons.pop(str(job_id), None)
            self.victims.pop(job_id, None)
            for attempt_id in self.attempts_of.pop(job_id, ()):
                self.placed.pop(attempt_id, None)

    def load(self, share_names: dict[int, str], *, ids: list[int] | None) -> None:
        """Read the placed and runnable jobs among `ids` (all of them: None), which this holds
        none of."""
        self._load_placed(share_names, ids)
        self._load_runnable(share_names, ids)

    def _load_placed(self, share_names: dict[int, str], ids: list[int] | None) -> None:
        sql, to_epoch = _placed_sql(ids is not None)
        params = [Job.State.PREEMPTING, *Job.PLACED_STATES]
        if ids is not None:
            params.append(ids_param(ids))
        with prepared_cursor() as cursor:
            cursor.execute(sql, params)
            attempts = cursor.fetchall()
        allocation = engine.Allocation
        placed_job = engine.PlacedJob
        for (
            attempt_id,
            job_id,
            share_id,
            gpu_type,
            gpus,
            priority,
            submitted,
            started,
            stopping,
            preempted_for,
            allocations,
            borrowed,
            preemptible,
            checkpointed,
        ) in attempts:  # fmt: skip
            self.placed[attempt_id] = placed_job(
                id=str(job_id),
                share=share_names[share_id],
                gpu_type=gpu_type,
                gpus=gpus,
                priority=priority,
                submitted=to_epoch(submitted),
                started=to_epoch(started),
                allocations=tuple(
                    allocation(node=a["node"], gpu_indices=tuple(a["gpu_indices"]))
                    for a in json_value(allocations)
                ),
                stopping=bool(stopping),
                preempted_for=str(preempted_for) if preempted_for else None,
                # Victim ties: jobs on borrowed GPUs go before jobs on their own quota.
                borrowed=borrowed,
                preemptible=bool(preemptible),
                checkpointed=to_epoch(checkpointed) if checkpointed is not None else None,
            )
            self.attempts_of.setdefault(job_id, []).append(attempt_id)

    def _load_runnable(self, share_names: dict[int, str], ids: list[int] | None) -> None:
        sql, to_epoch = _runnable_sql(ids is not None)
        params = [JobAttempt.Outcome.PREEMPTED, Job.State.RUNNABLE]
        if ids is not None:
            params.append(ids_param(ids))
        with prepared_cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        runnable_job = engine.RunnableJob
        runnable, reasons, victims = self.runnable, self.reasons, self.victims
        limit = self.churn[0]
        churned = []
        for (
            job_id, share_id, gpu_type, gpus, nodes_wanted, priority, submitted, reason,
            claimant, ended, preemptible, preemptions,
        ) in rows:  # fmt: skip
            view_id = str(job_id)
            runnable[job_id] = runnable_job(
                view_id,
                share_names[share_id],
                gpu_type,
                gpus,
                nodes_wanted,
                priority,
                to_epoch(submitted),
                preemptible=bool(preemptible),
            )
            reasons[view_id] = reason
            if claimant is not None:
                victims[job_id] = (claimant, to_epoch(ended))
            if limit and preemptions >= limit:
                churned.append(job_id)
        if churned:
            self._load_preemptions(churned, limit)

    def _load_preemptions(self, job_ids: list[int], limit: int) -> None:
        """The latest `limit` preemptions of each of the jobs, for the churn breaker: only
        jobs preempted that often can be held off."""
        sql, to_epoch = _preemptions_sql()
        ended: dict[int, list[float]] = {}
        with prepared_cursor() as cursor:
            cursor.execute(sql, [JobAttempt.Outcome.PREEMPTED, ids_param(job_ids)])
            for job_id, at in cursor.fetchall():
                ended.setdefault(job_id, []).append(to_epoch(at))
        for job_id, times in ended.items():
            view = self.runnable[job_id]
            self.runnable[job_id] = engine.RunnableJob(
                view.id, view.share, view.gpu_type, view.gpus, view.nodes, view.priority,
                view.submitted, preemptible=view.preemptible,
                preempted_at=tuple(sorted(times)[-limit:]),
            )  # fmt: skip

    def snapshot(
        self, nodes: tuple[engine.NodeView, ...], shares: tuple[engine.ShareView, ...]
    ) -> engine.Snapshot:
        """The engine's snapshot: jobs in id order (placed ones by attempt), claims as of
        now."""
        runnable = self.runnable
        jobs = [runnable[job_id] for job_id in sorted(runnable)]
        claims = _claims(self.victims)
        if claims:
            for place, job in enumerate(jobs):
                claimant = claims.get(int(job.id))
                if claimant is not None:
                    jobs[place] = engine.RunnableJob(
                        job.id, job.share, job.gpu_type, job.gpus, job.nodes, job.priority,
                        job.submitted, claimant, job.preemptible, job.preempted_at,
                    )  # fmt: skip
        placed = self.placed
        return engine.Snapshot(
            nodes=nodes,
            shares=shares,
            placed=tuple(placed[attempt_id] for attempt_id in sorted(placed)),
            runnable=tuple(jobs),
            borrow_order=settings.BORROW_ORDER,
            now=timezone.now().timestamp(),
            churn_preemptions=self.churn[0],
            churn_window_seconds=self.churn[1],
        )


def _claims(victims: dict[int, tuple[int, float]]) -> dict[int, str]:
    """{requeued victim: the job it was last preempted for}, while that job has not been placed
    since: the engine lets the claimant start on the freed GPUs before its victims return
    (without it, within-limit victims retake them and the same preemption repeats forever)."""
    if not victims:
        return {}
    claimants = sorted({claimant for claimant, _ in victims.values()})
    sql, to_epoch = _last_placed_sql()
    with prepared_cursor() as cursor:
        cursor.execute(sql, [ids_param(claimants)])
        last_placed = {job_id: to_epoch(latest) for job_id, latest in cursor.fetchall()}
    return {
        victim: str(claimant)
        for victim, (claimant, ended_at) in victims.items()
        if last_placed.get(claimant) is None or last_placed[claimant] < ended_at
    }


class SnapshotCache:
    """The cycle's snapshot, kept between cycles and brought up to date from the change feed.
    `load()` runs under the cycle lock, in the cycle's transaction; `forget()` after anything
    that went wrong."""

    def __init__(self) -> None:
        self.token: str | None = None  # the feed's token this copy is current with
        self.jobs = _Jobs()
        self.share_names: dict[int, str] = {}
        # What the last load did, for tests and the benchmark: "full" or "changes", and how
        # many jobs the feed named.
        self.last_load = ""
        self.last_changes = 0

    def forget(self) -> None:
        self.token = None

    def load(self) -> tuple[engine.Snapshot, SnapshotContext]:
        token, triggers = self._feed_state()
        # Until this load completes, this copy proves nothing (an error leaves it forgotten).
        known, self.token = self.token, None
        with prepared_cursor() as cursor:
            cursor.execute(_consume_sql())
            consumed = {job_id for (job_id,) in cursor.fetchall()}
        changed = set(consumed)
        node_views = _nodes()
        share_names, share_views = _shares()
        churn = _churn()
        jobs = self.jobs
        current = (
            known is not None
            and token is not None
            and (token == known or self._catch_up(known, token, changed))
            and triggers
            and share_names == self.share_names
            and churn == jobs.churn
            # Reading most of the jobs one by one costs more than reading them all.
            and len(changed) <= max(FULL_READ_CHANGES, (len(jobs.runnable) + len(jobs.placed)) // 2)
        )
        if current:
            ids = sorted(changed)
            jobs.forget(ids)
            if ids:
                jobs.load(share_names, ids=ids)
        else:
            jobs = self.jobs = _Jobs(churn=churn)
            jobs.load(share_names, ids=None)
        self.share_names = share_names
        self.last_load, self.last_changes = ("changes" if current else "full"), len(changed)
        new_token = uuid.uuid4().hex
        with prepared_cursor() as cursor:
            cursor.execute(f"DELETE FROM {STATE_TABLE}")
            cursor.execute(f"INSERT INTO {STATE_TABLE} (id, token) VALUES (1, %s)", [new_token])
            cursor.execute(HISTORY_ADD_SQL, [new_token, token, _ids_text(consumed)])
            cursor.execute(HISTORY_PRUNE_SQL, [HISTORY_KEEP])
        self.token = new_token
        context = SnapshotContext(
            reasons=jobs.reasons,
            keeps_reasons=connection.vendor == "postgresql",
            reasons_written=self.reasons_written,
        )
        return jobs.snapshot(node_views, share_views), context

    def reasons_written(self, job_ids: Iterable[int]) -> None:
        """This cycle wrote these jobs' reasons without recording them in the feed (its own
        copy has them): the other worker processes' copies learn of them from the history."""
        text = _ids_text(job_ids)
        if self.token is not None and text:
            with prepared_cursor() as cursor:
                cursor.execute(HISTORY_APPEND_SQL, ["," + text, self.token])

    def _catch_up(self, known: str, token: str, changed: set[int]) -> bool:
        """Whether the history links this copy's load (`known`) to the latest (`token`), load
        after load (other worker processes' cycles since); if so, the jobs those loads read
        again or whose reasons they wrote go into `changed`."""
        with prepared_cursor() as cursor:
            cursor.execute(HISTORY_SINCE_SQL, [known])
            loads = cursor.fetchall()
        if not loads or loads[0][0] != known or loads[-1][0] != token:
            return False
        for (earlier, _, _), (_, previous, job_ids) in pairwise(loads):
            if previous != earlier:
                return False  # a load that found another token (a TRUNCATE, a full read)
            changed.update(int(job_id) for job_id in job_ids.split(",") if job_id)
        return True

    def _feed_state(self) -> tuple[str | None, bool]:
        """The feed's token, and whether every trigger that writes the feed is in place."""
        names = FEED_TRIGGERS.get(connection.vendor, ())
        with prepared_cursor() as cursor:
            cursor.execute(_feed_state_sql(len(names)), list(names))
            token, triggers = cursor.fetchone()
        return token, bool(names) and triggers == len(names)


snapshot_cache = SnapshotCache()


@cache
def _shares_sql() -> str:
    """Every column of every share and of its limits: anything a share's view is made of."""
    share = connection.ops.quote_name(QuotaShare._meta.db_table)
    limit = connection.ops.quote_name(CapacityLimit._meta.db_table)
    return (
        f"SELECT s.*, l.* FROM {share} s LEFT JOIN {limit} l ON l.share_id = s.id "
        "ORDER BY s.id, l.id"
    )


@cache
def _nodes_sql() -> str:
    return (
        "SELECT name, gpu_type, gpus, state, outside_gpus "
        f"FROM {connection.ops.quote_name(Node._meta.db_table)} ORDER BY name"
    )


# The nodes' views: the same rows as last time give that same tuple, and the engine keeps what
# it derives from the tuple of nodes it saw last (their layout); 2,000 nodes' views cost a few
# milliseconds to make again.
_nodes = _MadeFromRows(_nodes_sql, _node_views)
# The shares' names and views: 30 shares' views made from model instances cost 4 ms, ten times
# what reading their rows (each column of the share and of its limits) does.
_shares = _MadeFromRows(_shares_sql, _share_views)


@cache
def _consume_sql() -> str:
    """Take every change the feed holds (that this transaction can see)."""
    return f"DELETE FROM {CHANGES_TABLE} RETURNING job_id"


def _ids_text(job_ids: Iterable[int]) -> str:
    return ",".join(map(str, sorted(job_ids)))


@cache
def _feed_state_sql(triggers: int) -> str:
    """The token (NULL without one) and how many of the named triggers (the parameters)
    exist."""
    names = ", ".join(["%s"] * triggers)
    if connection.vendor == "postgresql":
        present = f"SELECT COUNT(*) FROM pg_trigger WHERE tgname IN ({names})"
    else:
        present = f"SELECT COUNT(*) FROM sqlite_master WHERE type = 'trigger' AND name IN ({names})"
    return f"SELECT (SELECT MAX(token) FROM {STATE_TABLE}), ({present})"


def _epoch(column: str) -> tuple[str, Callable[[object], float]]:
    """SQL for a timestamp column (or expression) as seconds since the epoch, and the
    conversion its values still need. PostgreSQL computes the float itself (the same one
    `datetime.timestamp()` gives: both round the exact value), so a snapshot of a long queue
    parses no timestamps in Python; SQLite stores text, parsed here."""
    if connection.vendor == "postgresql":
        return f"EXTRACT(EPOCH FROM {column})::double precision", _float_or_zero
    return column, _parsed_epoch


def _float_or_zero(value) -> float:
    return value or 0.0


def _parsed_epoch(value) -> float:
    if value is None:
        return 0.0
    moment = value if isinstance(value, datetime) else parse_datetime(value)
    if timezone.is_naive(moment):
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


@cache
def _placed_sql(of_ids: bool) -> tuple[str, Callable[[object], float]]:
    """The open attempts of placed jobs, by attempt id, with what the engine needs of them and
    of their jobs. Parameters: PREEMPTING (`stopping`: a stop was ordered, or the job is
    PREEMPTING), then the placed states, then (`of_ids`) the jobs' ids."""
    table = connection.ops.quote_name
    submitted, to_epoch = _epoch("job.submitted_at")
    started, _ = _epoch("COALESCE(attempt.started_at, attempt.scheduled_at)")
    checkpointed, _ = _epoch("attempt.last_checkpoint_at")
    states = ", ".join(["%s"] * len(Job.PLACED_STATES))
    sql = (
        "SELECT attempt.id, attempt.job_id, job.share_id, job.gpu_type, job.gpus, job.priority, "
        f"{submitted}, {started}, "
        "(attempt.stop_requested_at IS NOT NULL OR job.state = %s), "
        "attempt.preempted_for_id, attempt.allocations, attempt.borrowed_gpus, job.preemptible, "
        f"{checkpointed} "
        f"FROM {table(JobAttempt._meta.db_table)} attempt "
        f"JOIN {table(Job._meta.db_table)} job ON job.id = attempt.job_id "
        f"WHERE attempt.ended_at IS NULL AND job.state IN ({states})"
    )
    if of_ids:
        sql += f" AND {ids_sql('attempt.job_id')}"
    return sql + " ORDER BY attempt.id", to_epoch


@cache
def _runnable_sql(of_ids: bool) -> tuple[str, Callable[[object], float]]:
    """The runnable jobs, in id order, with their reasons and, for a requeued victim whose
    latest attempt was preempted for a job, that job and the attempt's end. Parameters:
    PREEMPTED, RUNNABLE, then (`of_ids`) the jobs' ids. The index job_state_gpu_type serves
    WHERE state = 'RUNNABLE', attempt_number_once_per_job the latest attempt."""
    table = connection.ops.quote_name
    submitted, to_epoch = _epoch("job.submitted_at")
    ended, _ = _epoch("attempt.ended_at")
    sql = (
        "SELECT job.id, job.share_id, job.gpu_type, job.gpus, job.nodes, job.priority, "
        f"{submitted}, job.reason, attempt.preempted_for_id, {ended}, job.preemptible, "
        "job.preemption_count "
        f"FROM {table(Job._meta.db_table)} job "
        f"LEFT JOIN {table(JobAttempt._meta.db_table)} attempt ON attempt.job_id = job.id "
        "AND attempt.number = job.attempt_count AND attempt.outcome = %s "
        "AND attempt.preempted_for_id IS NOT NULL "
        "WHERE job.state = %s"
    )
    if of_ids:
        sql += f" AND {ids_sql('job.id')}"
    return sql + " ORDER BY job.id", to_epoch


@cache
def _preemptions_sql() -> tuple[str, Callable[[object], float]]:
    """(job id, end) of the PREEMPTED attempts (the first parameter) of the jobs among the ids
    (the second)."""
    ended, to_epoch = _epoch("ended_at")
    sql = (
        f"SELECT job_id, {ended} FROM {connection.ops.quote_name(JobAttempt._meta.db_table)} "
        f"WHERE outcome = %s AND ended_at IS NOT NULL AND {ids_sql('job_id')}"
    )
    return sql, to_epoch


@cache
def _last_placed_sql() -> tuple[str, Callable[[object], float]]:
    """(job id, its latest attempt's scheduling) of the jobs among the ids (the parameter)."""
    latest, to_epoch = _epoch("MAX(scheduled_at)")
    sql = (
        f"SELECT job_id, {latest} FROM {connection.ops.quote_name(JobAttempt._meta.db_table)} "
        f"WHERE {ids_sql('job_id')} GROUP BY job_id"
    )
    return sql, to_epoch
