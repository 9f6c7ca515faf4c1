"""What the engine needs to plan, loaded from the database: nodes, shares, placed jobs (their
open attempts) and runnable jobs, as tuples of the needed columns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache

from django.conf import settings
from django.db import connection
from django.db.models import F, Max
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from portal.db.sql import json_value, prepared_cursor
from scheduler import engine
from scheduler.models import Job, JobAttempt, Node
from shares.models import QuotaShare


@dataclass
class SnapshotContext:
    """What applying a plan needs to know about the snapshot it came from."""

    reasons: dict[int, str]  # runnable job id → its reason when loaded
    node_ids: dict[str, int]  # node name → id


def cycle_snapshot() -> tuple[engine.Snapshot, SnapshotContext]:
    """Load what the engine needs: nodes, shares, placed jobs (open attempts) and runnable jobs,
    as tuples of the needed columns (no model instances but the few shares). The placed and
    runnable jobs are read with written-out SQL: for a queue of 10,000 jobs, composing and
    iterating the ORM's queries cost the cycle several times what PostgreSQL spends on them
    (bench/cycle.py)."""
    nodes = list(Node.objects.values_list("pk", "name", "gpu_type", "gpus", "state"))
    node_views = tuple(
        engine.NodeView(name=name, gpu_type=gpu_type, gpus=gpus, state=state)
        for _, name, gpu_type, gpus, state in nodes
    )
    share_views = []
    share_names: dict[int, str] = {}
    for share in QuotaShare.objects.prefetch_related("capacity_limits"):
        share_names[share.pk] = share.name
        share_views.append(share.engine_view())
    sql, to_epoch = _placed_sql()
    with prepared_cursor() as cursor:
        cursor.execute(sql, [Job.State.PREEMPTING, *Job.PLACED_STATES])
        attempts = cursor.fetchall()
    allocation = engine.Allocation
    placed = [
        engine.PlacedJob(
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
        )
        for (
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
        ) in attempts  # fmt: skip
    ]
    claims = _reclaim_claims()
    sql, to_epoch = _runnable_sql()
    with prepared_cursor() as cursor:
        cursor.execute(sql, [Job.State.RUNNABLE])
        rows = cursor.fetchall()
    runnable_job = engine.RunnableJob
    runnable = [
        runnable_job(
            str(job_id),
            share_names[share_id],
            gpu_type,
            gpus,
            nodes_wanted,
            priority,
            to_epoch(submitted),
            claims.get(job_id),
        )
        for job_id, share_id, gpu_type, gpus, nodes_wanted, priority, submitted, _reason in rows
    ]
    snapshot = engine.Snapshot(
        nodes=node_views,
        shares=tuple(share_views),
        placed=tuple(placed),
        runnable=tuple(runnable),
        borrow_order=settings.BORROW_ORDER,
    )
    context = SnapshotContext(
        reasons={row[0]: row[-1] for row in rows},
        node_ids={name: pk for pk, name, *_ in nodes},
    )
    return snapshot, context


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
def _placed_sql() -> tuple[str, Callable[[object], float]]:
    """The open attempts of placed jobs, with what the engine needs of them and of their jobs.
    Parameters: PREEMPTING (`stopping`: a stop was ordered, or the job is PREEMPTING), then the
    placed states."""
    table = connection.ops.quote_name
    submitted, to_epoch = _epoch("job.submitted_at")
    started, _ = _epoch("COALESCE(attempt.started_at, attempt.scheduled_at)")
    states = ", ".join(["%s"] * len(Job.PLACED_STATES))
    sql = (
        "SELECT attempt.job_id, job.share_id, job.gpu_type, job.gpus, job.priority, "
        f"{submitted}, {started}, "
        "(attempt.stop_requested_at IS NOT NULL OR job.state = %s), "
        "attempt.preempted_for_id, attempt.allocations, attempt.borrowed_gpus "
        f"FROM {table(JobAttempt._meta.db_table)} attempt "
        f"JOIN {table(Job._meta.db_table)} job ON job.id = attempt.job_id "
        f"WHERE attempt.ended_at IS NULL AND job.state IN ({states})"
    )
    return sql, to_epoch


@cache
def _runnable_sql() -> tuple[str, Callable[[object], float]]:
    """The runnable jobs (the state is the parameter), with their reasons; the index
    job_state_gpu_type serves WHERE state = 'RUNNABLE'."""
    submitted, to_epoch = _epoch("submitted_at")
    sql = (
        f"SELECT id, share_id, gpu_type, gpus, nodes, priority, {submitted}, reason "
        f"FROM {connection.ops.quote_name(Job._meta.db_table)} WHERE state = %s"
    )
    return sql, to_epoch


def _reclaim_claims() -> dict[int, str]:
    """{requeued victim: the job it was last preempted for}, while that job has not been placed
    since: the engine lets the claimant start on the freed GPUs before its victims return
    (without it, within-limit victims retake them and the same preemption repeats forever)."""
    victims = list(
        JobAttempt.objects.filter(
            job__state=Job.State.RUNNABLE,
            outcome=JobAttempt.Outcome.PREEMPTED,
            preempted_for__isnull=False,
            number=F("job__attempt_count"),  # the victim's latest attempt
        ).values_list("job_id", "preempted_for_id", "ended_at")
    )
    if not victims:
        return {}
    last_placed = dict(
        JobAttempt.objects.filter(job_id__in={claimant for _, claimant, _ in victims})
        .values("job_id")
        .annotate(latest=Max("scheduled_at"))
        .values_list("job_id", "latest")
        .order_by()
    )
    return {
        victim: str(claimant)
        for victim, claimant, ended_at in victims
        if last_placed.get(claimant) is None or last_placed[claimant] < ended_at
    }
