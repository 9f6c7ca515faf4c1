"""The READY nodes of one GPU type and their free GPU indices, kept for tightest-fit placement.

Nodes sit in buckets by their count of free GPUs, so finding the tightest node that still fits a
job costs a walk over at most `gpus per node` buckets, not over every node. A second set of
buckets counts GPUs being released too, for jobs that wait for them.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Mapping, Sequence

from scheduler.engine.snapshot import Allocation, NodeView


class NodeLayout:
    """The READY nodes of one GPU type, in snapshot order, and what a `NodePool` needs of them
    that stays the same while the nodes do (a plan builds it once per set of nodes)."""

    def __init__(self, nodes: Sequence[NodeView]) -> None:
        # Nodes keep their snapshot order as ordinal: ties between equally tight nodes go to the
        # earlier one, so the same snapshot always gives the same plan.
        self.names = [node.name for node in nodes]
        self.ordinal = {name: i for i, name in enumerate(self.names)}
        self.gpus = [node.gpus for node in nodes]
        self.all_gpus = [(1 << gpus) - 1 for gpus in self.gpus]  # bit masks
        self.largest = max(self.gpus, default=0)
        # GPUs held outside the portal are neither placeable nor cluster capacity.
        self.outside = {i: node.outside_gpus for i, node in enumerate(nodes) if node.outside_gpus}
        self.capacity = sum(self.gpus) - sum(min(n, self.gpus[i]) for i, n in self.outside.items())


def _taken_outside(taken: int, gpus: int, outside: int) -> int:
    """`taken` (a bit mask) with `outside` more of the node's free GPUs taken, the highest
    first: which ones does not matter, the cluster manager that runs them assigns its own."""
    for index in range(gpus - 1, -1, -1):
        if outside <= 0:
            break
        if not taken >> index & 1:
            taken |= 1 << index
            outside -= 1
    return taken


class NodePool:
    """Free GPUs on the READY nodes of one type; only these receive new jobs. It also counts the
    GPUs being released for anyone (by stopping jobs no runnable job was promised): with the
    free ones, a node's "base room", what a job waiting for releases may count on."""

    def __init__(
        self, layout: NodeLayout, held: Mapping[str, int], releasing: Mapping[str, int]
    ) -> None:
        """`held`: the GPU indices jobs hold on each node, as bit masks (bit i: GPU i);
        `releasing`: how many GPUs are being released for anyone on each node."""
        self._names = layout.names
        self._ordinal = layout.ordinal
        self.ready: Mapping[str, int] = layout.ordinal  # the nodes, for `name in pool.ready`
        self._gpus = layout.gpus
        self.largest = layout.largest
        # Free GPU counts up front; the free indices of a node only once a job goes there (most
        # nodes of a cycle receive nothing).
        self._taken = taken = [
            held.get(name, 0) & all_gpus
            for name, all_gpus in zip(layout.names, layout.all_gpus, strict=True)
        ]
        for ordinal, outside in layout.outside.items():
            taken[ordinal] = _taken_outside(taken[ordinal], layout.gpus[ordinal], outside)
        self._counts = counts = [
            gpus - mask.bit_count() for gpus, mask in zip(layout.gpus, taken, strict=True)
        ]
        self._free: list[list[int] | None] = [None] * len(counts)
        self._buckets: list[list[int]] = [[] for _ in range(self.largest + 1)]
        for ordinal, count in enumerate(counts):
            self._buckets[count].append(ordinal)
        self._releasing = [0] * len(counts)
        for name, count in releasing.items():
            self._releasing[self._ordinal[name]] = count
        # Nodes by base room: built by the first plan step that asks (most plans only place
        # jobs on free GPUs), then kept current.
        self._room_buckets_built: list[list[int]] | None = None

    @property
    def _room_buckets(self) -> list[list[int]]:
        buckets = self._room_buckets_built
        if buckets is None:
            buckets = self._room_buckets_built = [[] for _ in range(self.largest + 1)]
            for ordinal, (count, more) in enumerate(
                zip(self._counts, self._releasing, strict=True)
            ):
                buckets[count + more].append(ordinal)
        return buckets

    @property
    def names(self) -> list[str]:
        return self._names

    def base_room(self, name: str) -> int:
        """Free GPUs plus GPUs being released for anyone: the node's room before any victim."""
        ordinal = self._ordinal[name]
        return self._counts[ordinal] + self._releasing[ordinal]

    def free_indices(self, name: str) -> list[int]:
        return self._free_list(self._ordinal[name])

    def _free_list(self, ordinal: int) -> list[int]:
        free = self._free[ordinal]
        if free is None:
            gpus, taken = self._gpus[ordinal], self._taken[ordinal]
            free = (
                list(range(gpus)) if not taken else [i for i in range(gpus) if not taken >> i & 1]
            )
            self._free[ordinal] = free
        return free

    def count_room_at_least(self, gpus: int) -> int:
        """How many nodes have at least `gpus` GPUs of base room."""
        return sum(len(bucket) for bucket in self._room_buckets[max(gpus, 0) :])

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
        """The `nodes` tightest nodes that have `gpus_per_node` GPUs counting their base room plus
        `extra` GPUs per node (GPUs stopping for the job); None when there are not enough."""
        ranked: list[tuple[int, int]] = []
        for name, more in extra.items():
            ordinal = self._ordinal[name]
            available = self._counts[ordinal] + self._releasing[ordinal] + more
            if available >= gpus_per_node:
                ranked.append((available, ordinal))
        others = 0
        for room in range(gpus_per_node, len(self._room_buckets)):
            for ordinal in self._room_buckets[room]:
                if self._names[ordinal] in extra:
                    continue
                ranked.append((room, ordinal))
                others += 1
                if others == nodes:
                    break
            if others == nodes:
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

    def claim_released(self, name: str, count: int) -> None:
        """`count` of the GPUs being released on the node are promised to a job."""
        ordinal = self._ordinal[name]
        room = self._counts[ordinal] + self._releasing[ordinal]
        self._releasing[ordinal] -= count
        if self._room_buckets_built is not None:
            _move(self._room_buckets_built, ordinal, room, room - count)

    def _set_free(self, ordinal: int, free: list[int]) -> None:
        old = self._counts[ordinal]
        self._free[ordinal] = free
        self._counts[ordinal] = len(free)
        if old != len(free):
            _move(self._buckets, ordinal, old, len(free))
            if self._room_buckets_built is not None:
                more = self._releasing[ordinal]
                _move(self._room_buckets_built, ordinal, old + more, len(free) + more)


def _move(buckets: list[list[int]], ordinal: int, old: int, new: int) -> None:
    """Move a node from one bucket to another, keeping each bucket in node order."""
    if old != new:
        bucket = buckets[old]
        del bucket[bisect_left(bucket, ordinal)]
        insort(buckets[new], ordinal)
