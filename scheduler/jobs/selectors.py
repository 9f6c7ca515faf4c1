"""Reads that the API and pages need about jobs and the queue."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache

from django.contrib.auth import get_user_model
from django.db import models
from django.db.models import QuerySet
from django.utils import timezone

from portal.db.sql import instance_from_row, model_columns, prepared_cursor
from scheduler.cycle.snapshot import cycle_snapshot
from scheduler.engine import churn, order
from scheduler.models import ClusterSettings, GpuAssignment, Job, JobAttempt, JobEvent, Node
from shares.models import CapacityLimit, Membership, QuotaShare, Team
from shares.selectors import UsageReport, is_admin, share_usage, shares_visible_to

QUEUE_FRONT_SIZE = 100


def jobs_visible_to(user) -> QuerySet[Job]:
    """Admins see every job; anyone else the jobs of their teams' shares (the rule that
    `job_detail` and `submit_target` write out as `_MEMBER_SQL`)."""
    jobs = Job.objects.select_related("share__team", "submitted_by")
    if is_admin(user):
        return jobs
    if not user or not user.is_authenticated:
        return jobs.none()
    return jobs.filter(share__team__memberships__user=user)


def job_list(
    *,
    user,
    share: str | None = None,
    states: list[str] | None = None,
    submitted_by: str | None = None,
    since: datetime | None = None,
    gpu_type: str | None = None,
) -> QuerySet[Job]:
    """The jobs `user` may see, newest first, filtered like AWS ListServiceJobs."""
    jobs = jobs_visible_to(user)
    if share:
        jobs = jobs.filter(share__name=share)
    if states:
        jobs = jobs.filter(state__in=states)
    if submitted_by:
        jobs = jobs.filter(submitted_by__username=submitted_by)
    if since:
        jobs = jobs.filter(submitted_at__gte=since)
    if gpu_type:
        jobs = jobs.filter(gpu_type=gpu_type)
    return jobs.order_by("-submitted_at", "-id")


def job_detail(*, user, job_id: int) -> Job | None:
    """One job as describe shows it, or None when `user` may not see it (the rule of
    `jobs_visible_to`). The job comes with its `share` (with the share's `team`) and
    `submitted_by`, as select_related loads them; `job.attempt_list` holds its attempts by
    number, each with `gpu_list`: (node name, GPU index) of every GPU it holds or held, in the
    order they were given; `job.event_list` its events by time, as Prefetch(to_attr=...) would
    leave them."""
    if is_admin(user):
        rows = _detail_rows("job", [job_id])
    elif user and user.is_authenticated:
        rows = _detail_rows("job if on its team", [job_id, user.pk])
    else:
        return None
    if not rows:
        return None
    job, share, team, submitted_by = _instances_from_row(
        (Job, QuotaShare, Team, get_user_model()), rows[0]
    )
    share.team = team
    job.share, job.submitted_by = share, submitted_by
    attempts = [instance_from_row(JobAttempt, row) for row in _detail_rows("attempts", [job_id])]
    gpus: dict[int, list[tuple[str, int]]] = {}
    if attempts:  # a job that never ran never held a GPU
        for attempt_id, node, gpu_index in _detail_rows("gpus", [job_id]):
            gpus.setdefault(attempt_id, []).append((node, gpu_index))
    for attempt in attempts:
        attempt.gpu_list = gpus.get(attempt.pk, [])
    job.attempt_list = attempts
    job.event_list = [instance_from_row(JobEvent, row) for row in _detail_rows("events", [job_id])]
    return job


# Written out, like the submit's read: composing the ORM's four queries of a describe (the job
# with select_related, then the prefetches of its attempts, their GPUs and its events) cost
# several times what the database spends running them, at every describe (bench/api.py).
# Plain SQL that SQLite and PostgreSQL both run; table and column names come from the models.
# A non-admin sees the job when they are on its share's team (`_MEMBER_SQL`, as for a submit).
_JOB_DETAIL_SQL = """
SELECT {job_columns}, {share_columns}, {team_columns}, {user_columns}
FROM {job} j
INNER JOIN {share} s ON s.id = j.share_id
INNER JOIN {team} t ON t.id = s.team_id
INNER JOIN {user} u ON u.id = j.submitted_by_id
WHERE j.id = %s{visible}
"""
_ATTEMPTS_SQL = "SELECT {attempt_columns} FROM {attempt} a WHERE a.job_id = %s ORDER BY a.number"
# GpuAssignment has no ordering of its own: its rows by id are an attempt's GPUs as given.
_GPUS_SQL = """
SELECT g.attempt_id, n.name, g.gpu_index
FROM {gpu} g
INNER JOIN {attempt} a ON a.id = g.attempt_id
INNER JOIN {node} n ON n.id = g.node_id
WHERE a.job_id = %s
ORDER BY g.id
"""
_EVENTS_SQL = "SELECT {event_columns} FROM {event} e WHERE e.job_id = %s ORDER BY e.at, e.id"


@cache
def _detail_statements() -> dict[str, str]:
    """`job_detail`'s statements by name, with the models' tables and columns."""
    tables = {
        "job": Job,
        "share": QuotaShare,
        "team": Team,
        "user": get_user_model(),
        "attempt": JobAttempt,
        "event": JobEvent,
        "gpu": GpuAssignment,
        "node": Node,
    }
    names = {name: model._meta.db_table for name, model in tables.items()}
    aliases = {"job": "j", "share": "s", "team": "t", "user": "u", "attempt": "a", "event": "e"}
    for name, alias in aliases.items():
        names[f"{name}_columns"] = model_columns(tables[name], alias)
    member = _MEMBER_SQL.format(membership=Membership._meta.db_table)
    return {
        "job": _JOB_DETAIL_SQL.format(visible="", **names),
        "job if on its team": _JOB_DETAIL_SQL.format(visible=f" AND {member}", **names),
        "attempts": _ATTEMPTS_SQL.format(**names),
        "gpus": _GPUS_SQL.format(**names),
        "events": _EVENTS_SQL.format(**names),
    }


def _detail_rows(statement: str, params: list) -> list[tuple]:
    with prepared_cursor() as cursor:
        cursor.execute(_detail_statements()[statement], params)
        return cursor.fetchall()


def _instances_from_row(row_models: tuple[type[models.Model], ...], row: tuple) -> list:
    """An instance of each of `row_models` from one row that selects each model's columns
    (`model_columns`) in turn."""
    instances, start = [], 0
    for model in row_models:
        instances.append(instance_from_row(model, row[start:]))
        start += len(model._meta.concrete_fields)
    return instances


def user_role_for_share(user, share: QuotaShare) -> str | None:
    """'ADMIN', Membership.Role.LEAD or MEMBER, or None when the user is not on the team."""
    if is_admin(user):
        return "ADMIN"
    if not user or not user.is_authenticated:
        return None
    return (
        Membership.objects.filter(team_id=share.team_id, user=user)
        .values_list("role", flat=True)
        .first()
    )


CANCEL_REFUSED = "only the job's submitter, a lead of team {team} or an admin may cancel this job."
PRIORITY_REFUSED = "only a lead of team {team} (or an admin) may change this job."


def may_change_priority(user, job: Job) -> bool:
    """Changing a job's priority is the lead's call: it reorders the team's queue."""
    return user_role_for_share(user, job.share) in ("ADMIN", Membership.Role.LEAD)


def may_cancel(user, job: Job) -> bool:
    """Who may cancel a job: its submitter, a lead of its share's team, or an admin."""
    role = user_role_for_share(user, job.share)
    if role in ("ADMIN", Membership.Role.LEAD):
        return True
    return role == Membership.Role.MEMBER and job.submitted_by_id == user.pk


# --- Submit -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SubmitTarget:
    """What a submit checks, read in one query: the share (None when no share has that name),
    whether the user may submit to it, its limits, the nodes of the job's GPU type, and whether
    the user already submitted a job with the request's client_token."""

    share: QuotaShare | None
    visible: bool
    limits: dict[str, int]
    largest_node: int | None  # GPUs of the largest node of the type that is not DOWN
    nodes_that_fit: int  # nodes of the type, not DOWN, with at least per_node GPUs
    # False too when no share has that name: the query has no row to say it on.
    token_used: bool = False


# Written out rather than composed with the ORM: building this query with annotations and
# subqueries costs more than running it, at every submit (bench/api.py). Plain SQL
# that SQLite and PostgreSQL both run; table and column names come from the models.
_SUBMIT_TARGET_SQL = """
SELECT {share_columns}, {visible} AS visible,
       (SELECT MAX(n.gpus) FROM {node} n WHERE n.gpu_type = %s AND n.state <> %s)
           AS largest_node,
       (SELECT COUNT(*) FROM {node} n WHERE n.gpu_type = %s AND n.state <> %s AND n.gpus >= %s)
           AS nodes_that_fit,
       {token_used} AS token_used,
       l.gpu_type AS limit_gpu_type, l.max_gpus AS limit_max_gpus
FROM {share} s LEFT OUTER JOIN {limit} l ON l.share_id = s.id
WHERE s.name = %s
"""
_MEMBER_SQL = "EXISTS (SELECT 1 FROM {membership} m WHERE m.team_id = s.team_id AND m.user_id = %s)"
# `client_token <> ''` says what the index of job_client_token_once_per_user covers, so that
# the prepared statement's generic plan can use it (it cannot tell that %s is not '').
_TOKEN_USED_SQL = (
    "EXISTS (SELECT 1 FROM {job} j WHERE j.submitted_by_id = %s AND j.client_token = %s "
    "AND j.client_token <> '')"
)


@cache
def _submit_target_sql(admin: bool, client_token: bool) -> str:
    return _SUBMIT_TARGET_SQL.format(
        share_columns=model_columns(QuotaShare, "s"),
        visible="1" if admin else _MEMBER_SQL.format(membership=Membership._meta.db_table),
        token_used=_TOKEN_USED_SQL.format(job=Job._meta.db_table) if client_token else "0",
        node=Node._meta.db_table,
        share=QuotaShare._meta.db_table,
        limit=CapacityLimit._meta.db_table,
    )


def submit_target(
    *, user, share_name: str, gpu_type: str, per_node: int, client_token: str = ""
) -> SubmitTarget:
    """The share named `share_name` as `user` would submit to it, with its capacity limits,
    membership and the node sizes of `gpu_type`, and whether `user` already used
    `client_token`, in one query (a submit's only read besides the token): one row per
    capacity limit, the share's columns repeated."""
    admin = is_admin(user)
    sql = _submit_target_sql(admin, bool(client_token))
    down = Node.State.DOWN
    params = [] if admin else [user.pk]
    params += [gpu_type, down, gpu_type, down, per_node]
    params += [user.pk, client_token] if client_token else []
    params += [share_name]
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    if not rows:
        return SubmitTarget(
            share=None, visible=False, limits={}, largest_node=None, nodes_that_fit=0
        )
    # Each row: the share's columns, visible, largest_node, nodes_that_fit, token_used, then
    # one limit.
    share_columns = len(QuotaShare._meta.concrete_fields)
    visible, largest_node, nodes_that_fit, token_used = rows[0][share_columns : share_columns + 4]
    return SubmitTarget(
        share=instance_from_row(QuotaShare, rows[0]),
        visible=bool(visible),
        limits={gpu_type: gpus for *_, gpu_type, gpus in rows if gpu_type},
        largest_node=largest_node,
        nodes_that_fit=nodes_that_fit,
        token_used=bool(token_used),
    )


# --- Queue snapshot ---------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueEntry:
    position: int
    job: Job
    pass_: str  # order.PROMISED, order.WITHIN_LIMIT or order.BORROWING


@dataclass(frozen=True)
class QueueSnapshot:
    runnable: int
    front: list[QueueEntry]
    usage: UsageReport


def queue_front(*, limit: int = QUEUE_FRONT_SIZE) -> tuple[int, list[QueueEntry]]:
    """How many jobs wait, and the first `limit` of them in the order the engine considers them
    (`engine.order`): the jobs promised GPUs, then every job that fits within its share's
    limit, then the borrowers, as if each job ahead were admitted in turn; read from the same
    snapshot a cycle plans. A job that ended since the snapshot is left out."""
    snapshot, _context = cycle_snapshot()
    positions = order.queue_order(snapshot)[:limit]
    jobs = Job.objects.select_related("share", "submitted_by").in_bulk(
        [int(entry.job.id) for entry in positions]
    )
    front = [
        QueueEntry(position=entry.position, job=jobs[int(entry.job.id)], pass_=entry.pass_)
        for entry in positions
        if int(entry.job.id) in jobs
    ]
    return len(snapshot.runnable), front


def queue_snapshot(*, limit: int = QUEUE_FRONT_SIZE) -> QueueSnapshot:
    """AWS GetJobQueueSnapshot: the front of the queue (`queue_front`) and every share's usage."""
    runnable, front = queue_front(limit=limit)
    return QueueSnapshot(runnable=runnable, front=front, usage=share_usage())


def held_off(jobs: QuerySet[Job] | None = None, now: datetime | None = None) -> dict[int, datetime]:
    """The runnable jobs (of `jobs`, default all) the churn breaker holds off borrowed GPUs,
    with when it lets them borrow again (`scheduler.engine.churn`, as the cycle applies it)."""
    settings = ClusterSettings.load()
    limit = settings.churn_preemptions
    if not limit:
        return {}
    runnable = (Job.objects if jobs is None else jobs).filter(
        state=Job.State.RUNNABLE, preemption_count__gte=limit
    )
    ended: dict[int, list[float]] = {}
    for job_id, at in JobAttempt.objects.filter(
        job__in=runnable, outcome=JobAttempt.Outcome.PREEMPTED, ended_at__isnull=False
    ).values_list("job_id", "ended_at"):
        ended.setdefault(job_id, []).append(at.timestamp())
    moment = (now or timezone.now()).timestamp()
    held: dict[int, datetime] = {}
    for job_id, times in ended.items():
        until = churn.held_off_until(times, moment, limit, float(settings.churn_window_seconds))
        if until is not None:
            held[job_id] = datetime.fromtimestamp(until, tz=UTC)
    return held


@dataclass(frozen=True)
class Holder:
    """Placed jobs a waiting job waits for: its victims stopping for it (`stopping`), or the
    jobs of a share that hold its GPU type above the share's limit (borrowers). `job_id` is
    None where the viewer may not see the job (`ahead_seen_by`)."""

    share: str
    job_id: int | None
    gpus: int
    stopping: bool


@dataclass(frozen=True)
class Ahead:
    """Where a waiting job stands in its GPU type's queue (`position`, 1 is next; None: not
    waiting), the jobs ahead of it (up to a limit; `count` and `gpus` count them all), and whose
    jobs hold what it waits for."""

    position: int | None
    ahead: list[QueueEntry]
    count: int
    gpus: int
    holders: list[Holder]


def jobs_ahead(job: Job, *, limit: int = QUEUE_FRONT_SIZE) -> Ahead:
    """The jobs ahead of `job` in its GPU type, in the order the engine considers them (the one
    queue order, `engine.order.queue_order`), and, when it waits for a reclaim or for borrowed
    GPUs, the jobs that hold them."""
    if job.state != Job.State.RUNNABLE:
        return Ahead(None, [], 0, 0, [])
    snapshot, _context = cycle_snapshot()
    same_type = [
        entry for entry in order.queue_order(snapshot) if entry.job.gpu_type == job.gpu_type
    ]
    index = next((i for i, entry in enumerate(same_type) if entry.job.id == str(job.pk)), None)
    if index is None:  # it left the queue since
        return Ahead(None, [], 0, 0, [])
    before = same_type[:index]
    shown = Job.objects.select_related("share", "submitted_by").in_bulk(
        [int(entry.job.id) for entry in before[:limit]]
    )
    ahead = [
        QueueEntry(position=n, job=shown[int(entry.job.id)], pass_=entry.pass_)
        for n, entry in enumerate(before[:limit], start=1)
        if int(entry.job.id) in shown
    ]
    limits = {share.name: share.capacity_limits.get(job.gpu_type, 0) for share in snapshot.shares}
    usage: dict[str, int] = {}
    for placed in snapshot.placed:
        if placed.gpu_type == job.gpu_type:
            usage[placed.share] = usage.get(placed.share, 0) + placed.gpus
    same = [placed for placed in snapshot.placed if placed.gpu_type == job.gpu_type]
    # Reclaiming (or preempting in its share): its victims hold what it waits for. Otherwise,
    # the other shares' jobs above their limits: what it could borrow or reclaim is theirs.
    holders = [
        Holder(placed.share, int(placed.id), placed.gpus, True)
        for placed in same
        if placed.stopping and placed.preempted_for == str(job.pk)
    ] or [
        Holder(placed.share, int(placed.id), placed.gpus, placed.stopping)
        for placed in same
        if placed.share != job.share.name and usage[placed.share] > limits.get(placed.share, 0)
    ]
    holders.sort(key=lambda holder: (holder.share, holder.job_id))
    return Ahead(
        position=index + 1,
        ahead=ahead,
        count=len(before),
        gpus=sum(entry.job.gpus for entry in before),
        holders=holders,
    )


@dataclass(frozen=True)
class AheadEntry:
    """A job ahead, as a viewer sees it: `job_id` None for another team's job."""

    position: int
    pass_: str
    job_id: int | None
    share: str
    gpus: int
    priority: int


@dataclass(frozen=True)
class SeenAhead:
    position: int | None
    ahead: list[AheadEntry]
    count: int
    gpus: int
    holders: list[Holder]


def ahead_seen_by(user, job: Job, *, limit: int = QUEUE_FRONT_SIZE) -> SeenAhead:
    """`jobs_ahead` as `user` may see it: the jobs ahead and the holders of shares not on the
    user's teams keep their share, size and priority, never their job's id (an admin sees
    every id)."""
    where = jobs_ahead(job, limit=limit)
    visible = (
        None if is_admin(user) else set(shares_visible_to(user).values_list("name", flat=True))
    )

    def shown(share: str, job_id: int | None) -> int | None:
        return job_id if visible is None or share in visible else None

    return SeenAhead(
        position=where.position,
        ahead=[
            AheadEntry(
                entry.position,
                entry.pass_,
                shown(entry.job.share.name, entry.job.pk),
                entry.job.share.name,
                entry.job.gpus,
                entry.job.priority,
            )
            for entry in where.ahead
        ],
        count=where.count,
        gpus=where.gpus,
        holders=[
            Holder(h.share, shown(h.share, h.job_id), h.gpus, h.stopping) for h in where.holders
        ],
    )
