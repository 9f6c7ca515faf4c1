"""The orders as an agent's poll answer carries them (`scheduler.nodes.services.node_orders`),
and the orders just given, by node, for their nodes' wake-up to carry
(`scheduler.cycle.wake.notify_nodes`): a waiting poll then answers with them without reading
its orders again."""

from __future__ import annotations

from collections.abc import Iterable
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


def new_orders_by_node(
    *, run: Iterable[int] = (), stop: Iterable[int] = ()
) -> dict[int, NewOrders]:
    """The orders just given in this transaction, by the nodes where their attempts hold GPUs
    (a gang's attempt on each of its nodes): to run the attempts `run` (just placed), to stop
    the attempts `stop`."""
    to_run, to_stop = set(run), set(stop)
    if not to_run and not to_stop:
        return {}
    rows = (
        GpuAssignment.objects.filter(attempt_id__in=to_run | to_stop, released=False)
        .order_by("node_id", "attempt_id", "gpu_index")
        .values_list(
            "node_id", "attempt_id", "gpu_index", "attempt__number", "attempt__started_at",
            "attempt__job_id", "attempt__job__command", "attempt__job__env",
            "attempt__job__working_dir", "attempt__job__timeout_seconds",
            "attempt__job__share__grace_seconds", "attempt__job__nodes",
        )
    )  # fmt: skip
    by_node: dict[int, NewOrders] = {}
    last: tuple[int, int] | None = None
    for (
        node_id, attempt_id, index, number, started_at, job_id, command, env, working_dir,
        timeout_seconds, grace, nodes,
    ) in rows:  # fmt: skip
        orders = by_node.setdefault(node_id, {"run": [], "stop": []})
        if (node_id, attempt_id) == last:
            if attempt_id not in to_stop:  # a run order names every GPU of the node
                orders["run"][-1]["gpu_indices"].append(index)
            continue
        last = (node_id, attempt_id)
        started = started_at is not None
        if attempt_id in to_stop:
            orders["stop"].append(stop_order(attempt_id, grace_seconds=grace, started=started))
        else:
            orders["run"].append(
                run_order(
                    attempt_id, job_id=job_id, number=number, command=command, env=env,
                    working_dir=working_dir, gpu_indices=[index],
                    timeout_seconds=timeout_seconds, grace_seconds=grace, started=started,
                    node_count=nodes,
                )
            )  # fmt: skip
    return by_node
