"""Who uses, borrows and lends how many GPUs right now (DESIGN §2 accounting).

`usage_by_share` is pure arithmetic on counts; `current_usage` loads the counts from the
database. The API, the dashboards, the history sampler and the metrics all read from here."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

RESERVE = "RESERVE"


@dataclass(frozen=True)
class ShareLimit:
    share: str
    gpu_type: str
    limit: int
    strategy: str
    lend_limit: int | None = None


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
    lent: float
    idle: float
    demand: int = 0

    @property
    def usage(self) -> int:
        return self.own + self.borrowed


def usage_by_share(
    *,
    limits: Iterable[ShareLimit],
    used: Mapping[tuple[str, str], int],
    capacity: Mapping[str, int],
    demand: Mapping[tuple[str, str], int] | None = None,
) -> list[ShareUsage]:
    """Split each GPU type's use into own, borrowed and lent per share.

    `used[(share, type)]` counts GPUs held by placed jobs, `capacity[type]` the GPUs of
    schedulable nodes. Borrowing draws on the free pool (capacity no share's limit covers)
    first, then on lenders in proportion to what each can lend (its idle quota, within its
    lend_limit; a RESERVE share lends nothing)."""
    demand = demand or {}
    limits = list(limits)
    by_type: dict[str, list[ShareLimit]] = defaultdict(list)
    for entry in limits:
        by_type[entry.gpu_type].append(entry)
    # Shares with jobs of a type they have no limit for (limit lowered or removed) borrow all.
    for share, gpu_type in used:
        if not any(e.share == share for e in by_type.get(gpu_type, [])):
            by_type[gpu_type].append(ShareLimit(share, gpu_type, 0, RESERVE))

    result: list[ShareUsage] = []
    for gpu_type, entries in sorted(by_type.items()):
        covered = sum(e.limit for e in entries)
        free_pool = max(0, capacity.get(gpu_type, 0) - covered)
        borrowed = {e.share: max(0, used.get((e.share, gpu_type), 0) - e.limit) for e in entries}
        lendable = {}
        for e in entries:
            idle = max(0, e.limit - used.get((e.share, gpu_type), 0))
            if e.strategy == RESERVE:
                lendable[e.share] = 0
            elif e.lend_limit is not None:
                lendable[e.share] = min(idle, e.lend_limit)
            else:
                lendable[e.share] = idle
        from_lenders = max(0, sum(borrowed.values()) - free_pool)
        total_lendable = sum(lendable.values())
        for e in sorted(entries, key=lambda e: e.share):
            use = used.get((e.share, gpu_type), 0)
            lent = from_lenders * lendable[e.share] / total_lendable if total_lendable else 0.0
            lent = min(lent, float(lendable[e.share]))
            result.append(
                ShareUsage(
                    share=e.share,
                    gpu_type=gpu_type,
                    limit=e.limit,
                    own=min(use, e.limit),
                    borrowed=borrowed[e.share],
                    lent=round(lent, 3),
                    idle=round(max(0.0, e.limit - use - lent), 3),
                    demand=demand.get((e.share, gpu_type), 0),
                )
            )
    return result


def current_usage() -> list[ShareUsage]:
    """Usage of every share and GPU type now, from the database (three aggregate queries)."""
    from django.db.models import Sum

    from scheduler.models import Job, Node
    from shares.models import CapacityLimit

    limits = [
        ShareLimit(share, gpu_type, max_gpus, strategy, lend_limit)
        for share, gpu_type, max_gpus, strategy, lend_limit in CapacityLimit.objects.values_list(
            "share__name", "gpu_type", "max_gpus", "share__strategy", "lend_limit"
        )
    ]
    jobs = Job.objects.values_list("share__name", "gpu_type").annotate(total=Sum("gpus"))
    used = {(share, t): n for share, t, n in jobs.filter(state__in=Job.PLACED_STATES).order_by()}
    demand = {(share, t): n for share, t, n in jobs.filter(state=Job.State.RUNNABLE).order_by()}
    capacity = dict(
        Node.objects.filter(state=Node.State.READY)
        .values_list("gpu_type")
        .annotate(total=Sum("gpus"))
        .values_list("gpu_type", "total")
        .order_by()
    )
    return usage_by_share(limits=limits, used=used, capacity=capacity, demand=demand)
