"""What the engine needs to plan, loaded from the database: nodes, shares, placed jobs (their
open attempts) and runnable jobs, as tuples of the needed columns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import connection
from django.db.models import Expression, F, FloatField, Func, Max
from django.db.models.functions import Coalesce

from scheduler import engine
from scheduler.models import Job, JobAttempt, Node
from shares.models import QuotaShare


@dataclass
class SnapshotContext:
    """What applying a plan needs to know about the snapshot it came from."""

    reasons: dict[int, str]  # runnable job id → its reason when loaded
    node_ids: dict[str, int]  # node name → id


def _epoch(value: datetime | None) -> float:
    return value.timestamp() if value is not None else 0.0


class Epoch(Func):
    """A timestamp as seconds since the epoch, computed by PostgreSQL: the same float as
    `datetime.timestamp()` (both round the exact value), without parsing 20,000 timestamps in
    Python for a snapshot of a long queue."""

    template = "EXTRACT(EPOCH FROM %(expressions)s)::double precision"
    output_field = FloatField()


def _epoch_columns(*columns: str | Expression) -> tuple[list, Callable[[object], float]]:
    """Datetime columns (names or expressions) for values_list() that load as epoch seconds on
    PostgreSQL, and the conversion to epoch seconds their values still need."""
    if connection.vendor == "postgresql":
        return [Epoch(column) for column in columns], lambda value: value or 0.0
    return list(columns), _epoch


def cycle_snapshot() -> tuple[engine.Snapshot, SnapshotContext]:
    """Load what the engine needs: nodes, shares, placed jobs (open attempts) and runnable jobs,
    as tuples of the needed columns (no model instances but the few shares)."""
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
    (submitted_column, started_column), to_epoch = _epoch_columns(
        "job__submitted_at", Coalesce("started_at", "scheduled_at")
    )
    placed = []
    attempts = JobAttempt.objects.filter(
        ended_at__isnull=True, job__state__in=Job.PLACED_STATES
    ).values_list(
        "job_id",
        "job__share_id",
        "job__gpu_type",
        "job__gpus",
        "job__priority",
        submitted_column,
        "job__state",
        started_column,
        "stop_requested_at",
        "preempted_for_id",
        "allocations",
        "borrowed_gpus",
    )
    for (
        job_id,
        share_id,
        gpu_type,
        gpus,
        priority,
        submitted,
        state,
        started,
        stop_requested_at,
        preempted_for,
        allocations,
        borrowed,
    ) in attempts:
        placed.append(
            engine.PlacedJob(
                id=str(job_id),
                share=share_names[share_id],
                gpu_type=gpu_type,
                gpus=gpus,
                priority=priority,
                submitted=to_epoch(submitted),
                started=to_epoch(started),
                allocations=tuple(
                    engine.Allocation(node=a["node"], gpu_indices=tuple(a["gpu_indices"]))
                    for a in allocations
                ),
                stopping=stop_requested_at is not None or state == Job.State.PREEMPTING,
                preempted_for=str(preempted_for) if preempted_for else None,
                # Victim ties: jobs on borrowed GPUs go before jobs on their own quota.
                borrowed=borrowed,
            )
        )
    (submitted_column,), to_epoch = _epoch_columns("submitted_at")
    claims = _reclaim_claims()
    runnable = []
    reasons = {}
    # The index job_state_gpu_type serves WHERE state = 'RUNNABLE'.
    for job_id, share_id, gpu_type, gpus, nodes_wanted, priority, submitted, reason in (
        Job.objects.filter(state=Job.State.RUNNABLE)
        .order_by()
        .values_list(
            "pk", "share_id", "gpu_type", "gpus", "nodes", "priority", submitted_column, "reason"
        )
    ):
        reasons[job_id] = reason
        runnable.append(
            engine.RunnableJob(
                id=str(job_id),
                share=share_names[share_id],
                gpu_type=gpu_type,
                gpus=gpus,
                nodes=nodes_wanted,
                priority=priority,
                submitted=to_epoch(submitted),
                preempted_for=claims.get(job_id),
            )
        )
    snapshot = engine.Snapshot(
        nodes=node_views,
        shares=tuple(share_views),
        placed=tuple(placed),
        runnable=tuple(runnable),
        borrow_order=settings.BORROW_ORDER,
    )
    context = SnapshotContext(reasons=reasons, node_ids={name: pk for pk, name, *_ in nodes})
    return snapshot, context


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
