"""The orders as an agent's poll answer carries them (`scheduler.nodes.services.node_orders`),
and the orders just given, by node, for their nodes' wake-up to carry
(`scheduler.cycle.wake.notify_nodes`): a waiting poll then answers with them without reading
its orders again."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.models import GpuAssignment

# What a node is sent of the orders given in a transaction: {"run": [...], "stop": [...]}.
NewOrders = dict[str, list[dict]]


def run_order(
    attempt_id: int, *, job_id: int, number: int, command: str, env: Any, working_dir: str,
    gpu_indices: list[int], timeout_seconds: int | None, grace_seconds: int, started: bool,
    node_count: int,
) -> dict:  # fmt: skip
    """Run this attempt of a job on these GPUs of the node; `started`: it already started
    once (an agent that does not have it lost it); `node_count`: how many nodes the attempt
    runs on (more than one: a gang)."""
    return {
        "attempt": attempt_id,
        "job": job_id,
        "node_count": node_count,
        "number": number,
        "command": command,
        "env": env,
        "working_dir": working_dir,
        "gpu_indices": gpu_indices,
        "timeout_seconds": timeout_seconds,
        "grace_seconds": grace_seconds,
        "started": started,
    }


def stop_order(attempt_id: int, *, grace_seconds: int, started: bool) -> dict:
    """Stop this attempt within `grace_seconds`; `started`: whether it ever started (an agent
    never starts an attempt whose stop it has)."""
    return {"attempt": attempt_id, "grace_seconds": grace_seconds, "started": started}


def new_stop_orders(attempts: Iterable[int]) -> dict[int, NewOrders]:
    """The stop orders just given in this transaction to these attempts, by the nodes where
    they hold GPUs (a gang's attempt on each of its nodes)."""
    to_stop = set(attempts)
    if not to_stop:
        return {}
    rows = (
        GpuAssignment.objects.filter(attempt_id__in=to_stop, released=False)
        .order_by("node_id", "attempt_id")
        .values_list(
            "node_id", "attempt_id", "attempt__started_at", "attempt__job__share__grace_seconds"
        )
        .distinct()
    )
    by_node: dict[int, NewOrders] = {}
    for node_id, attempt_id, started_at, grace in rows:
        orders = by_node.setdefault(node_id, {"run": [], "stop": []})
        orders["stop"].append(
            stop_order(attempt_id, grace_seconds=grace, started=started_at is not None)
        )
    return by_node


@dataclass(frozen=True)
class NewAttempt:
    """An attempt just placed, with what its run order needs (the cycle has it at hand)."""

    attempt_id: int
    job_id: int
    number: int
    command: str
    env: Any
    working_dir: str
    timeout_seconds: int | None
    grace_seconds: int
    node_count: int
    gpus: Mapping[int, Sequence[int]]  # node id → the GPU indices it holds there


def new_run_orders(attempts: Iterable[NewAttempt]) -> dict[int, NewOrders]:
    """The run orders of attempts just placed, by node (nodes, then attempts, then GPU indices
    in order, as a node's poll reads them: `scheduler.nodes.services.node_orders`), made from
    what the cycle has at hand, without a query."""
    by_node: dict[int, NewOrders] = {}
    for attempt in sorted(attempts, key=lambda a: a.attempt_id):
        for node_id, indices in attempt.gpus.items():
            orders = by_node.setdefault(node_id, {"run": [], "stop": []})
            orders["run"].append(
                run_order(
                    attempt.attempt_id, job_id=attempt.job_id, number=attempt.number,
                    command=attempt.command, env=attempt.env, working_dir=attempt.working_dir,
                    gpu_indices=sorted(indices), timeout_seconds=attempt.timeout_seconds,
                    grace_seconds=attempt.grace_seconds, started=False,
                    node_count=attempt.node_count,
                )
            )  # fmt: skip
    return {node_id: by_node[node_id] for node_id in sorted(by_node)}
