"""Reads that the API and pages need about jobs and the queue."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cache

from django.db.models import Prefetch, QuerySet

from portal.db.sql import instance_from_row, model_columns, prepared_cursor
from scheduler.cycle.snapshot import cycle_snapshot
from scheduler.engine import order
from scheduler.models import GpuAssignment, Job, JobAttempt, Node
from shares.models import CapacityLimit, Membership, QuotaShare
from shares.selectors import UsageReport, is_admin, share_usage

QUEUE_FRONT_SIZE = 100


def jobs_visible_to(user) -> QuerySet[Job]:
    """Admins see every job; anyone else the jobs of their teams' shares."""
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
    """One job with its attempts (and their GPUs) and events, or None when `user` may not see it."""
    return (
        jobs_visible_to(user)
        .prefetch_related(
            Prefetch(
                "attempts",
                queryset=JobAttempt.objects.select_related("preempted_for").prefetch_related(
                    Prefetch("gpus", queryset=GpuAssignment.objects.select_related("node"))
                ),
            ),
            "events",
        )
        .filter(pk=job_id)
        .first()
    )


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


# --- Submit -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SubmitTarget:
    """What a submit checks, read in one query: the share (None when no share has that name),
    whether the user may submit to it, its limits, and the nodes of the job's GPU type."""

    share: QuotaShare | None
    visible: bool
    limits: dict[str, int]
    largest_node: int | None  # GPUs of the largest node of the type that is not DOWN
    nodes_that_fit: int  # nodes of the type, not DOWN, with at least per_node GPUs


# Written out rather than composed with the ORM: building this query with annotations and
# subqueries costs more than running it, at every submit (bench/api.py). Plain SQL
# that SQLite and PostgreSQL both run; table and column names come from the models.
_SUBMIT_TARGET_SQL = """
SELECT {share_columns}, {visible} AS visible,
       (SELECT MAX(n.gpus) FROM {node} n WHERE n.gpu_type = %s AND n.state <> %s)
           AS largest_node,
       (SELECT COUNT(*) FROM {node} n WHERE n.gpu_type = %s AND n.state <> %s AND n.gpus >= %s)
           AS nodes_that_fit,
       l.gpu_type AS limit_gpu_type, l.max_gpus AS limit_max_gpus
FROM {share} s LEFT OUTER JOIN {limit} l ON l.share_id = s.id
WHERE s.name = %s
"""
_MEMBER_SQL = "EXISTS (SELECT 1 FROM {membership} m WHERE m.team_id = s.team_id AND m.user_id = %s)"


@cache
def _submit_target_sql(admin: bool) -> str:
    return _SUBMIT_TARGET_SQL.format(
        share_columns=model_columns(QuotaShare, "s"),
        visible="1" if admin else _MEMBER_SQL.format(membership=Membership._meta.db_table),
        node=Node._meta.db_table,
        share=QuotaShare._meta.db_table,
        limit=CapacityLimit._meta.db_table,
    )


def submit_target(*, user, share_name: str, gpu_type: str, per_node: int) -> SubmitTarget:
    """The share named `share_name` as `user` would submit to it, with its capacity limits,
    membership and the node sizes of `gpu_type`, in one query (a submit's only read besides
    the token): one row per capacity limit, the share's columns repeated."""
    admin = is_admin(user)
    sql = _submit_target_sql(admin)
    down = Node.State.DOWN
    params = [] if admin else [user.pk]
    params += [gpu_type, down, gpu_type, down, per_node, share_name]
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    if not rows:
        return SubmitTarget(
            share=None, visible=False, limits={}, largest_node=None, nodes_that_fit=0
        )
    # Each row: the share's columns, visible, largest_node, nodes_that_fit, then one limit.
    share_columns = len(QuotaShare._meta.concrete_fields)
    visible, largest_node, nodes_that_fit = rows[0][share_columns : share_columns + 3]
    return SubmitTarget(
        share=instance_from_row(QuotaShare, rows[0]),
        visible=bool(visible),
        limits={gpu_type: gpus for *_, gpu_type, gpus in rows if gpu_type},
        largest_node=largest_node,
        nodes_that_fit=nodes_that_fit,
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
