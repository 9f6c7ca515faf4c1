"""A stop order as an agent's poll answer carries it (`scheduler.nodes.services.node_orders`),
and the stop orders just given, by node, for their nodes' wake-up to carry
(`scheduler.cycle.wake.notify_nodes`): a waiting poll then answers without reading its orders
again."""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.models import GpuAssignment


def stop_order(attempt_id: int, *, grace_seconds: int, started: bool) -> dict:
    """Stop this attempt within `grace_seconds`; `started`: whether it ever started (an agent
    never starts an attempt whose stop it has)."""
    return {"attempt": attempt_id, "grace_seconds": grace_seconds, "started": started}


def stop_orders_by_node(attempt_ids: Iterable[int]) -> dict[int, list[dict]]:
    """The stop orders of these attempts, just given in this transaction, by the nodes where
    they hold GPUs (a gang's attempt on each of its nodes)."""
    ids = list(attempt_ids)
    if not ids:
        return {}
    rows = (
        GpuAssignment.objects.filter(attempt_id__in=ids, released=False)
        .order_by()
        .values_list(
            "node_id", "attempt_id", "attempt__started_at", "attempt__job__share__grace_seconds"
        )
        .distinct()
    )
    by_node: dict[int, list[dict]] = {}
    for node_id, attempt_id, started_at, grace in sorted(rows, key=lambda row: row[:2]):
        by_node.setdefault(node_id, []).append(
            stop_order(attempt_id, grace_seconds=grace, started=started_at is not None)
        )
    return by_node
