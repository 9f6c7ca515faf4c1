"""The READY nodes of one GPU type and their free GPU indices, kept for tightest-fit placement.

Nodes sit in buckets by their count of free GPUs, so finding the tightest node that still fits a
job costs a walk over at most `gpus per node` buckets, not over every node.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Mapping, Sequence

from scheduler.engine.snapshot import Allocation, NodeView


class NodePool:
    """Free GPUs on the READY nodes of one type; only these receive new jobs."""

    def __init__(self, nodes: Sequence[NodeView], held: Mapping[str, set[int]]) -> None:
        # Nodes keep their snapshot order as ordinal: ties between equally tight nodes go to the
        # earlier one, so the same snapshot always gives the same plan.
        self._names = [node.name for node in nodes]
        self._ordinal = {node.name: i for i, node in enumerate(nodes)}
        largest = self.largest = max((node.gpus for node in nodes), default=0)
        self._buckets: list[list[int]] = [[] for _ in range(largest + 1)]
        # Free GPU counts up front; the free indices of a node only once a job goes there (most
        # nodes of a cycle receive nothing).
        self._counts: list[int] = []
        self._free: list[list[int] | None] = []
        self._held: list[tuple[int, set[int] | None]] = []
        for i, node in enumerate(nodes):
            taken = held.get(node.name)
            count = node.gpus - len(taken.intersection(range(node.gpus))) if taken else node.gpus
            self._counts.append(count)
            self._free.append(None)
            self._held.append((node.gpus, taken))
            self._buckets[count].append(i)

    @property
    def names(self) -> list[str]:
        return self._names

    def __contains__(self, name: str) -> bool:
        return name in self._ordinal

    def free_count(self, name: str) -> int:
        return self._counts[self._ordinal[name]]

    def free_indices(self, name: str) -> list[int]:
        return self._free_list(self._ordinal[name])

    def _free_list(self, ordinal: int) -> list[int]:
        free = self._free[ordinal]
        if free is None:
            gpus, taken = self._held[ordinal]
            free = list(range(gpus)) if not taken else [i for i in range(gpus) if i not in taken]
            self._free[ordinal] = free
        return free

    def count_at_least(self, gpus: int) -> int:
        """How many nodes have at least `gpus` free GPUs."""
        return sum(len(bucket) for bucket in self._buckets[max(gpus, 0) :])

    def take(self, gpus_per_node: int, nodes: int) -> tuple[Allocation, ...] | None:
        """Allocate `gpus_per_node` free GPUs (lowest indices) on each of `nodes` distinct nodes,
        the tightest-fitting nodes first; None, and nothing taken, when they do not all fit."""
        chosen: list[int] = []
        for count in range(gpus_per_node, len(self._buckets)):
            for ordinal in self._buckets[count]:
                chosen.append(ordinal)
                if len(chosen) == nodes:
                    break
            if len(chosen) == nodes:
                break
        if len(chosen) < nodes:
            return None
        allocations = []
        for ordinal in chosen:
            free = self._free_list(ordinal)
            allocations.append(Allocation(self._names[ordinal], tuple(free[:gpus_per_node])))
            self._set_free(ordinal, free[gpus_per_node:])
        return tuple(allocations)

    def tightest_with(
        self, gpus_per_node: int, nodes: int, extra: Mapping[str, int]
    ) -> list[str] | None:
        """The `nodes` tightest nodes that have `gpus_per_node` GPUs counting free GPUs plus
        `extra` GPUs per node (GPUs being released); None when there are not enough."""
        ranked: list[tuple[int, int]] = []
        for name, more in extra.items():
            ordinal = self._ordinal[name]
            available = self._counts[ordinal] + more
            if available >= gpus_per_node:
                ranked.append((available, ordinal))
        untouched = 0
        for count in range(gpus_per_node, len(self._buckets)):
            for ordinal in self._buckets[count]:
                if self._names[ordinal] in extra:
                    continue
                ranked.append((count, ordinal))
                untouched += 1
                if untouched == nodes:
                    break
            if untouched == nodes:
                break
        if len(ranked) < nodes:
            return None
        ranked.sort()
        return [self._names[ordinal] for _, ordinal in ranked[:nodes]]

    def reserve(self, name: str, indices: Sequence[int]) -> None:
        """Withdraw these free GPUs of a node: promised to a job waiting for a reclaim."""
        ordinal = self._ordinal[name]
        gone = set(indices)
        self._set_free(ordinal, [i for i in self._free_list(ordinal) if i not in gone])

    def _set_free(self, ordinal: int, free: list[int]) -> None:
        old = self._counts[ordinal]
        self._free[ordinal] = free
        self._counts[ordinal] = len(free)
        if old != len(free):
            bucket = self._buckets[old]
            del bucket[bisect_left(bucket, ordinal)]
            insort(self._buckets[len(free)], ordinal)
