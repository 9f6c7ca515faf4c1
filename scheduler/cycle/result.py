"""What one cycle did: counts, plan entries refused at apply, nodes to wake, step timings."""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from scheduler.cycle.orders import NewOrders


@dataclass
class CycleResult:
    """What one cycle did."""

    skipped: bool = False
    # Skipped without a query: asked for by a change a committed cycle had already seen.
    covered: bool = False
    placed: int = 0
    preempted: int = 0
    rejected: int = 0
    stop_orders: int = 0
    nodes_lost: int = 0
    attempts_lost: int = 0
    # Preempted attempts that had not started, ended at once: their GPUs are free for the next
    # cycle, which no agent's report will ask for.
    ended_unstarted: int = 0
    reasons_updated: int = 0
    stale: list[str] = field(default_factory=list)  # plan entries refused at apply
    # Nodes whose orders changed: their polls read them again.
    nodes_to_notify: set[int] = field(default_factory=set)
    # The orders given, by node: the nodes' wake-up carries them (scheduler.cycle.wake).
    orders_to_send: dict[int, NewOrders] = field(default_factory=dict)
    # Seconds spent in each step, for the benchmark and for logs of slow cycles.
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        """Whether the cycle changed jobs, attempts or GPUs (writing reasons aside)."""
        return bool(
            self.placed or self.preempted or self.rejected or self.stop_orders
            or self.nodes_lost or self.attempts_lost
        )  # fmt: skip

    def orders_given(self, by_node: Mapping[int, NewOrders]) -> None:
        """Orders were just given (`scheduler.cycle.orders`: new_run_orders, new_stop_orders),
        by node: send them to their nodes."""
        for node_id, orders in by_node.items():
            sent = self.orders_to_send.setdefault(node_id, {"run": [], "stop": []})
            sent["run"] += orders["run"]
            sent["stop"] += orders["stop"]

    @contextmanager
    def timed(self, step: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[step] = self.timings.get(step, 0.0) + time.perf_counter() - start
