"""Reads that the admin and pages need about shares."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass

from django.db.models import F, QuerySet, Sum
from django.db.models.functions import Least

from scheduler.engine import accounting
from scheduler.models import Job, Node
from shares.models import CapacityLimit, Membership, QuotaShare

OVERPROMISED = "GPU type {gpu_type}: shares promise {promised} GPUs, READY nodes have {capacity}."
NO_NODES = (
    "GPU type {gpu_type}: shares promise {promised} GPUs, but there is no READY {gpu_type} node."
)


def ready_capacity() -> dict[str, int]:
    """GPUs of each type on READY nodes, less those used outside the portal (a cluster
    manager's own jobs): the cluster capacity the engine plans with (docs/semantics.md)."""
    return dict(
        Node.objects.filter(state=Node.State.READY)
        .values_list("gpu_type")
        .annotate(total=Sum(F("gpus") - Least("outside_gpus", "gpus")))
        .values_list("gpu_type", "total")
    )


def capacity_warnings() -> list[str]:
    """One line per GPU type whose enabled shares' limits add up to more than its READY nodes
    have, or that has no READY node at all."""
    promised: dict[str, int] = defaultdict(int)
    rows = (
        CapacityLimit.objects.filter(share__state=QuotaShare.State.ENABLED)
        .values("gpu_type")
        .annotate(total=Sum("max_gpus"))
    )
    for row in rows:
        promised[row["gpu_type"]] = row["total"]
    capacity = ready_capacity()
    warnings = []
    for gpu_type in sorted(promised):
        have = capacity.get(gpu_type, 0)
        if have == 0:
            warnings.append(NO_NODES.format(gpu_type=gpu_type, promised=promised[gpu_type]))
        elif promised[gpu_type] > have:
            warnings.append(
                OVERPROMISED.format(gpu_type=gpu_type, promised=promised[gpu_type], capacity=have)
            )
    return warnings


# --- Who sees which share ---------------------------------------------------------------------


def is_admin(user) -> bool:
    """An admin sees and may change everything: an active staff member or superuser. The one
    definition for the API, the dashboards and the admin's own pages."""
    return bool(
        user and user.is_authenticated and user.is_active and (user.is_staff or user.is_superuser)
    )


def shares_visible_to(user) -> QuerySet[QuotaShare]:
    """Admins see every share; anyone else the shares of the teams they belong to."""
    shares = QuotaShare.objects.select_related("team").prefetch_related("capacity_limits")
    if is_admin(user):
        return shares
    if not user or not user.is_authenticated:
        return shares.none()
    return shares.filter(team__memberships__user=user).distinct()


def team_roles(user) -> dict[int, str]:
    """{team id: Membership.Role} for the user's teams."""
    if not user or not user.is_authenticated:
        return {}
    return dict(Membership.objects.filter(user=user).values_list("team_id", "role"))


# --- Live usage: own, borrowed, lent ----------------------------------------------------------


@dataclass(frozen=True)
class TypeUsage:
    """A share's GPUs of one type right now. `own` = used within the limit, `borrowed` = used
    above it, `lent` = its idle GPUs that borrowers use now, `lendable` = idle GPUs it could
    still lend (0 for RESERVE; within its lend_limit)."""

    limit: int
    lend_limit: int | None
    used: int
    own: int
    borrowed: int
    lent: int
    lendable: int

    def as_dict(self) -> dict[str, int | None]:
        return asdict(self)


@dataclass(frozen=True)
class PoolUsage:
    """One GPU type across the cluster: READY capacity, the part no share's limit covers (the
    free pool), and how much of it borrowers use."""

    capacity: int
    covered_by_limits: int
    free_pool: int
    borrowed_from_pool: int
    used: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class UsageReport:
    shares: dict[str, dict[str, TypeUsage]]
    pool: dict[str, PoolUsage]


def share_usage() -> UsageReport:
    """Live usage of every share per GPU type (DESIGN §2 "Precise rules").

    usage = GPUs of the share's placed jobs (SCHEDULED, STARTING, RUNNING, PREEMPTING);
    borrowed = max(0, usage − limit). What borrowers use is drawn first from the free pool
    (READY capacity not covered by any share's limit), then from lenders in proportion to what
    each can lend: its idle quota, within its lend_limit; a RESERVE share lends nothing."""
    shares = list(QuotaShare.objects.prefetch_related("capacity_limits"))
    used: dict[tuple[int, str], int] = {
        (row["share_id"], row["gpu_type"]): row["total"]
        for row in Job.objects.filter(state__in=Job.PLACED_STATES)
        .values("share_id", "gpu_type")
        .annotate(total=Sum("gpus"))
    }
    capacity = ready_capacity()
    gpu_types = set(capacity) | {gpu_type for _, gpu_type in used}
    views = {share.pk: share.engine_view() for share in shares}
    for view in views.values():
        gpu_types |= set(view.capacity_limits)

    report: dict[str, dict[str, TypeUsage]] = {share.name: {} for share in shares}
    pool: dict[str, PoolUsage] = {}
    for gpu_type in sorted(gpu_types):
        rows = []
        for share in shares:
            view = views[share.pk]
            limit = view.capacity_limits.get(gpu_type, 0)
            use = used.get((share.pk, gpu_type), 0)
            if not limit and not use:
                continue
            lendable = accounting.lendable(limit, use, accounting.lend_cap(view, gpu_type))
            lend_limit = (view.lend_limit or {}).get(gpu_type)
            rows.append((share, limit, lend_limit, use, lendable))
        borrowed_total = sum(max(0, use - limit) for _, limit, _, use, _ in rows)
        covered = sum(limit for _, limit, _, _, _ in rows)
        free_pool = max(0, capacity.get(gpu_type, 0) - covered)
        lent = accounting.in_whole_gpus(
            accounting.split_lent(
                borrowed_total, free_pool, {share.name: lendable for share, *_, lendable in rows}
            )
        )
        for share, limit, lend_limit, use, lendable in rows:
            share_lent = lent.get(share.name, 0)
            report[share.name][gpu_type] = TypeUsage(
                limit=limit,
                lend_limit=lend_limit,
                used=use,
                own=min(use, limit),
                borrowed=max(0, use - limit),
                lent=share_lent,
                lendable=lendable - share_lent,
            )
        pool[gpu_type] = PoolUsage(
            capacity=capacity.get(gpu_type, 0),
            covered_by_limits=covered,
            free_pool=free_pool,
            borrowed_from_pool=min(borrowed_total, free_pool),
            used=sum(use for _, _, _, use, _ in rows),
        )
    return UsageReport(shares=report, pool=pool)


# --- Rows for history and metrics -------------------------------------------------------------


@dataclass(frozen=True)
class ShareUsage:
    """One share's GPUs of one type: `own` (used within its limit), `borrowed` (used above it),
    `lent` (its idle GPUs that borrowers use), `idle` (neither used nor lent), and `demand`
    (GPUs its runnable jobs ask for)."""

    share: str
    gpu_type: str
    limit: int
    own: int
    borrowed: int
    lent: int
    idle: int
    demand: int = 0

    @property
    def usage(self) -> int:
        return self.own + self.borrowed


def current_usage() -> list[ShareUsage]:
    """Usage of every share and GPU type now, sorted by GPU type then share."""
    demand = {
        (share, gpu_type): total
        for share, gpu_type, total in Job.objects.filter(state=Job.State.RUNNABLE)
        .values_list("share__name", "gpu_type")
        .annotate(total=Sum("gpus"))
        .order_by()
    }
    rows = [
        ShareUsage(
            share=share,
            gpu_type=gpu_type,
            limit=row.limit,
            own=row.own,
            borrowed=row.borrowed,
            lent=row.lent,
            idle=max(0, row.limit - row.used - row.lent),
            demand=demand.get((share, gpu_type), 0),
        )
        for share, types in share_usage().shares.items()
        for gpu_type, row in types.items()
    ]
    return sorted(rows, key=lambda row: (row.gpu_type, row.share))
