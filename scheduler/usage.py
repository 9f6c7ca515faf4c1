"""Who uses, borrows and lends how many GPUs right now, as rows for history and metrics.

The accounting itself (DESIGN §2: borrowing draws on the free pool first, then on lenders in
proportion to what each can lend) is `shares.selectors.share_usage`; this adds each share's
runnable demand and flattens it into one row per share and GPU type."""

from __future__ import annotations

from dataclasses import dataclass


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
    from django.db.models import Sum

    from scheduler.models import Job
    from shares.selectors import share_usage

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
