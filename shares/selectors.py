"""Reads that the admin and pages need about shares."""

from __future__ import annotations

from collections import defaultdict

from django.db.models import Sum

from shares.models import CapacityLimit, QuotaShare

OVERPROMISED = "GPU type {gpu_type}: shares promise {promised} GPUs, READY nodes have {capacity}."
NO_NODES = (
    "GPU type {gpu_type}: shares promise {promised} GPUs, but there is no READY {gpu_type} node."
)


def capacity_warnings() -> list[str]:
    """One line per GPU type whose enabled shares' limits add up to more than its READY nodes
    have, or that has no READY node at all."""
    from scheduler.models import Node

    promised: dict[str, int] = defaultdict(int)
    rows = (
        CapacityLimit.objects.filter(share__state=QuotaShare.State.ENABLED)
        .values("gpu_type")
        .annotate(total=Sum("max_gpus"))
    )
    for row in rows:
        promised[row["gpu_type"]] = row["total"]
    capacity = dict(
        Node.objects.filter(state=Node.State.READY)
        .values_list("gpu_type")
        .annotate(total=Sum("gpus"))
        .values_list("gpu_type", "total")
    )
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
