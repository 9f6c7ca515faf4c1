"""The fast victim search: the same victims as `victims.find_victims`, found with less work.

`victims.py` states the rule (tries, greedy walk in victim order, backward prune) and walks
every candidate to apply it. On a busy cluster that is most of a plan's time, so `Shortcuts`
keeps indexes across the searches of one GPU type's plan and answers each search by steps that
each either give the reference's answer or give up and leave the answer to the next step:

- `own_victims_may_suffice`: a try that needs more of the job's own share's jobs than it has
  fails, without a walk (the reference's answer: None);
- `_Reachable.may_fit`: a try whose reachable jobs cannot free the job's nodes fails, without a
  walk (None);
- `_NodeFirstSearch`: try 3 of a one-node job finds where the walk would stop from a per-node
  index and prunes only the victims that can matter (the reference's victims, or gives up);
- `_Walk`: the greedy walk over candidate streams fed lazily from each share's first candidate,
  jumping straight to the share's own jobs when only they can make it fit, and pruning by
  bisection (always the reference's answer);

`KnownFailures` is kept here too, but it is no such shortcut: see its docstring.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from scheduler.engine.ledger import Ledger, Trial
from scheduler.engine.pool import NodePool
from scheduler.engine.snapshot import PlacedJob, RunnableJob
from scheduler.engine.victims import (
    TRY_BORROWERS,
    TRY_BOTH,
    TRY_OWN_SHARE,
    Candidates,
    NodeRoom,
)


class Shortcuts:
    """The fast victim search of one GPU type's plan, and the indexes it keeps between
    searches; the plan tells it of every change of a share's usage or a node's room."""

    def __init__(self, ledger: Ledger, pool: NodePool, candidates: Candidates) -> None:
        self.ledger = ledger
        self.pool = pool
        self.candidates = candidates
        self._room: _Reachable | None = None  # built by the first search that needs it
        # The first candidate of every share above its limit, in victim order: where the walks
        # of tries 1 and 3 start. Built by the first such search, then kept current.
        self._heads: list[tuple[tuple, str, int]] | None = None
        self._head_of: dict[str, tuple[tuple, str, int]] = {}

    def search(
        self,
        job: RunnableJob,
        attempt: str,
        promised: Sequence[PlacedJob],
        base_deltas: Mapping[str, int],
    ) -> list[PlacedJob] | None:
        """Returns what `victims.find_victims` would return for the same arguments."""
        within_limit = attempt != TRY_OWN_SHARE
        if attempt != TRY_BORROWERS and not self.own_victims_may_suffice(
            job, within_limit, base_deltas.get(job.share, 0)
        ):
            return None
        if (
            not promised
            and attempt != TRY_OWN_SHARE
            and not self.room().may_fit(job, attempt == TRY_BOTH)
        ):
            return None  # no victim set can give the job its nodes
        if attempt == TRY_OWN_SHARE and not self.own_victims_may_fit(job, promised):
            return None
        if attempt == TRY_BOTH and not promised and job.nodes == 1:
            quick = _NodeFirstSearch(self, job).victims()
            if quick is not _UNDECIDED:
                return quick
        walk = _Walk(self, job, within_limit, promised, base_deltas)
        if not walk.greedy(self._streams(job, attempt)):
            return None
        return walk.pruned()

    def own_victims_may_suffice(self, job: RunnableJob, within_limit: bool, delta: int) -> bool:
        """False when the share's usage cannot get within what the try allows (its limit, or its
        borrow cap) even with every lower-priority job of its own as a victim: then no victim
        set of the try works, whatever other shares give up, and `find_victims` returns None.
        True: undecided."""
        needed = own_victims_needed(self.ledger, job, within_limit, delta)
        if needed <= 0:
            return True
        if not self.candidates.has(job.share):
            return False
        return self.candidates.own_gpus_below(job) >= needed

    def own_victims_may_fit(self, job: RunnableJob, promised: Sequence[PlacedJob]) -> bool:
        """False when the job's nodes have no room even with every lower-priority job of its
        own share as a victim: try 2 takes those candidates only, so its walk would take them
        all and fail (`find_victims` returns None). True: undecided."""
        room = NodeRoom(self.pool, job.gpus // job.nodes, promised)
        if room.nodes >= job.nodes:
            return True
        for candidate in self.candidates.own_unordered(job):
            room.add_job(candidate, 1)
            if room.nodes >= job.nodes:
                return True
        return False

    def close(self) -> None:
        """Drop the indexes that refer back to this object (see `_TypePlan.run`)."""
        self._room = None

    def room(self) -> _Reachable:
        if self._room is None:
            self._room = _Reachable(self)
        return self._room

    def share_changed(self, name: str) -> None:
        """After the share's usage or victims changed."""
        if self._room is not None:
            self._room.refresh_share(name)
        if self._heads is not None:
            self._refresh_head(name)

    def node_changed(self, name: str) -> None:
        """After the node's free GPUs or GPUs being released changed."""
        if self._room is not None:
            self._room.refresh_node(name)

    def _streams(self, job: RunnableJob, attempt: str) -> _Candidates:
        """The candidates of the try in victim order: the shares above their limit when the
        search starts (tries 1 and 3), the job's own share (tries 2 and 3)."""
        heads = None
        if attempt in (TRY_BORROWERS, TRY_BOTH):
            if self._heads is None:
                self._heads = []
                for name in self.candidates.of:
                    self._refresh_head(name)
            heads = self._heads
        streams = _Candidates(job, heads)
        if attempt in (TRY_OWN_SHARE, TRY_BOTH) and job.share in self.candidates.of:
            self.push_next(streams.heap, job, job.share, 0)
        return streams

    def _refresh_head(self, name: str) -> None:
        assert self._heads is not None
        old = self._head_of.pop(name, None)
        if old is not None:
            del self._heads[bisect_left(self._heads, old)]
        candidates = self.candidates
        if name in candidates.of and self.ledger.above_limit(name):
            position = candidates.first_untaken(name)
            if position < len(candidates.of[name]):
                head = (candidates.keys(name, False)[position], name, position)
                insort(self._heads, head)
                self._head_of[name] = head

    def push_next(
        self, heap: list[tuple[tuple, str, int]], job: RunnableJob, name: str, position: int
    ) -> None:
        """Push the share's next candidate from `position` on, if the search may take it."""
        candidates = self.candidates
        queue = candidates.of[name]
        if position == 0:
            position = candidates.first_untaken(name)
        taken = candidates.taken
        while position < len(queue) and queue[position].id in taken:
            position += 1
        if position == len(queue):
            return
        candidate = queue[position]
        own = name == job.share
        if own and candidate.priority >= job.priority:
            return  # in-share preemption takes strictly lower priority only
        heapq.heappush(heap, (candidates.keys(name, own)[position], name, position))


def own_victims_needed(ledger: Ledger, job: RunnableJob, within_limit: bool, delta: int) -> int:
    """GPUs the job's share must give up of its own jobs before the try's quota rule can hold:
    its usage, now and as planned, plus `delta`, within its limit (or borrow cap)."""
    cap = ledger.usage_cap(job.share, within_limit)
    if cap is None:
        return 0
    return max(ledger.usage(job.share), ledger.held_usage(job.share)) + delta - cap


class KnownFailures:
    """Searches and waits for release that failed earlier in this plan: a later job of the
    same share and node count that asks for at least as many GPUs per node (and, for the
    in-share tries, has no higher priority) is not searched for again, and does not wait for
    release again.

    This is part of the plan's rule, applied in both modes of `plan`, not a shortcut that
    `victims.py` would agree with: a plan made without it differs on some clusters (a search it
    skips might have found victims), so it stays what it was when the modes were compared."""

    def __init__(self) -> None:
        # (share, try, nodes) → [(GPUs per node, priority)] of the searches that failed.
        self._searches: dict[tuple[str, str, int], list[tuple[int, int]]] = defaultdict(list)
        # nodes → the fewest GPUs per node for which a wait for release found no room.
        self._release_waits: dict[int, int] = {}

    def search_failed(self, job: RunnableJob, attempt: str) -> None:
        self._searches[(job.share, attempt, job.nodes)].append(
            (job.gpus // job.nodes, job.priority)
        )

    def search_fails(self, job: RunnableJob, attempt: str) -> bool:
        """True: the search fails (None). False: undecided."""
        per_node = job.gpus // job.nodes
        for failed_size, failed_priority in self._searches.get((job.share, attempt, job.nodes), ()):
            # Try 1 does not depend on priority; the in-share tries have fewer candidates for
            # a lower-priority job.
            if per_node >= failed_size and (
                attempt == TRY_BORROWERS or job.priority <= failed_priority
            ):
                return True
        return False

    def release_wait_failed(self, job: RunnableJob) -> None:
        per_node = job.gpus // job.nodes
        self._release_waits[job.nodes] = min(per_node, self._release_waits.get(job.nodes, per_node))

    def release_wait_fails(self, job: RunnableJob) -> bool:
        """True: waiting for GPUs being released finds no room. False: undecided."""
        failed = self._release_waits.get(job.nodes)
        return failed is not None and job.gpus // job.nodes >= failed


class _Candidates:
    """One search's candidates in victim order: a heap of the streams it has drawn from, fed
    lazily from the plan's sorted list of the shares' first candidates (a share enters only
    when its first candidate is next), so a search costs the candidates it looks at, not the
    number of shares."""

    def __init__(self, job: RunnableJob, heads: list[tuple[tuple, str, int]] | None) -> None:
        self.heap: list[tuple[tuple, str, int]] = []
        self._heads = heads or []
        self._next_head = 0
        self._own_share = job.share

    def pop(self) -> tuple[tuple, str, int] | None:
        heads = self._heads
        index = self._next_head
        while index < len(heads) and heads[index][1] == self._own_share:
            index += 1  # the job's own share is drawn from as its own stream, if at all
        if index < len(heads) and (not self.heap or heads[index] < self.heap[0]):
            self._next_head = index + 1
            return heads[index]
        self._next_head = index
        return heapq.heappop(self.heap) if self.heap else None


class _Reachable:
    """The GPUs each READY node would have if every job a reclaim can reach were stopped: its
    free GPUs, GPUs being released, and, of every share above its limit, the candidates a walk
    takes before the share is back within its limit. Kept current as the plan places jobs and
    takes victims, so a search learns in a few steps that no victim set gives the job its nodes
    (a whole node wanted, and none holds only reachable jobs) instead of walking every
    candidate to find out. It also keeps, for each node, its reachable jobs in victim order,
    and for each size of job asked for, the victim key at which each node first has room for
    it: where a walk would stop (`_NodeFirstSearch`)."""

    def __init__(self, shortcuts: Shortcuts) -> None:
        self.shortcuts = shortcuts
        pool = shortcuts.pool
        self.room: dict[str, int] = {}
        self.nodes_with = [0] * (pool.largest + 1)  # nodes by their room
        for name in pool.names:
            room = self.room[name] = pool.base_room(name)
            self.nodes_with[room] += 1
        self.reachable: dict[str, int] = defaultdict(int)  # by node
        self.reached: dict[str, list[PlacedJob]] = {}  # by share
        # Of each share with reached jobs, their victim keys and the GPUs given up up to each.
        self.reached_keys: dict[str, tuple[list[tuple], list[int]]] = {}
        # Every node's reached jobs in victim order: (victim key, GPUs on the node, job).
        self.on_node: dict[str, list[tuple[tuple, int, PlacedJob]]] = defaultdict(list)
        # For a part of g GPUs: the victim key at which each node's room reaches g when the
        # reached jobs are taken in victim order (`()`: it has room already), and a heap of
        # those keys, stale entries skipped; built for a size on its first search.
        self.first_room: dict[int, tuple[dict[str, tuple], list[tuple[tuple, str]]]] = {}
        for share in shortcuts.candidates.of:
            self.refresh_share(share)

    def may_fit(self, job: RunnableJob, with_own: bool) -> bool:
        """Whether the job could get its nodes from other shares' reachable jobs (and, with
        `with_own`, its own share's jobs of lower priority)."""
        need = job.gpus // job.nodes
        if need > len(self.nodes_with) - 1:
            return False
        nodes = sum(self.nodes_with[need:])
        change: dict[str, int] = defaultdict(int)
        for victim in self.reached.get(job.share, ()):
            _count_gpus(
                change, victim, self.shortcuts.pool, -1
            )  # its own share is no borrower here
        if with_own:
            for victim in self.shortcuts.candidates.own(job):
                _count_gpus(change, victim, self.shortcuts.pool, +1)
        for node, gpus in change.items():
            room = self.room[node]
            nodes += (room + gpus >= need) - (room >= need)
        return nodes >= job.nodes

    def refresh_share(self, share: str) -> None:
        """After the share's usage or victims changed."""
        shortcuts = self.shortcuts
        if share not in shortcuts.candidates.of:
            return
        reached = []
        keys = []
        given_up = []
        total = 0
        all_keys = shortcuts.candidates.keys(share, False)
        surplus = shortcuts.ledger.usage(share) - shortcuts.ledger.limit(share)
        queue = shortcuts.candidates.of[share]
        for position in range(shortcuts.candidates.first_untaken(share), len(queue)):
            if surplus <= 0:
                break
            candidate = queue[position]
            if candidate.id not in shortcuts.candidates.taken:
                reached.append(candidate)
                keys.append(all_keys[position])
                total += candidate.gpus
                given_up.append(total)
                surplus -= candidate.gpus
        before = self.reached.get(share, [])
        if [job.id for job in before] == [job.id for job in reached]:
            return
        self.reached[share] = reached
        if keys:
            self.reached_keys[share] = (keys, given_up)
        else:
            self.reached_keys.pop(share, None)
        # Only the jobs no longer reached, or newly reached, change the nodes' room.
        before_ids = {job.id for job in before}
        after_ids = {job.id for job in reached}
        ready = shortcuts.pool.ready
        change: dict[str, int] = defaultdict(int)
        touched = set()
        for job in before:
            if job.id not in after_ids:
                for allocation in job.allocations:
                    node = allocation.node
                    if node in ready:
                        change[node] -= len(allocation.gpu_indices)
                        entries = self.on_node[node]
                        entries[:] = [entry for entry in entries if entry[2] is not job]
                        touched.add(node)
        for key, job in zip(keys, reached, strict=True):
            if job.id not in before_ids:
                for allocation in job.allocations:
                    node = allocation.node
                    if node in ready:
                        change[node] += len(allocation.gpu_indices)
                        insort(self.on_node[node], (key, len(allocation.gpu_indices), job))
                        touched.add(node)
        for node, gpus in change.items():
            if gpus:
                self.reachable[node] += gpus
                self.refresh_node(node)
                touched.discard(node)
        for node in touched:
            self._retime(node)

    def refresh_node(self, node: str) -> None:
        """After the node's free GPUs, GPUs being released or reachable jobs changed."""
        shortcuts = self.shortcuts
        room = shortcuts.pool.base_room(node) + self.reachable.get(node, 0)
        self.nodes_with[self.room[node]] -= 1
        self.nodes_with[room] += 1
        self.room[node] = room
        self._retime(node)

    def _retime(self, node: str) -> None:
        base_room = self.shortcuts.pool.base_room(node)
        for gpus, (times, heap) in self.first_room.items():
            time = _first_room_key(base_room, self.on_node.get(node, ()), gpus)
            if times.get(node) != time:
                if time is None:
                    times.pop(node, None)
                else:
                    times[node] = time
                    heapq.heappush(heap, (time, node))

    def first_room_heap(self, gpus: int) -> tuple[dict[str, tuple], list[tuple[tuple, str]]]:
        entry = self.first_room.get(gpus)
        if entry is None:
            times: dict[str, tuple] = {}
            pool = self.shortcuts.pool
            for node in pool.names:
                time = _first_room_key(pool.base_room(node), self.on_node.get(node, ()), gpus)
                if time is not None:
                    times[node] = time
            heap = [(time, node) for node, time in times.items()]
            heapq.heapify(heap)
            entry = self.first_room[gpus] = (times, heap)
        return entry


def _first_room_key(
    room: int, entries: Sequence[tuple[tuple, int, PlacedJob]], gpus: int
) -> tuple | None:
    """The victim key of the entry with which `room` reaches `gpus` (`()`: already there), or
    None when it never does."""
    if room >= gpus:
        return ()
    for key, freed, _ in entries:
        room += freed
        if room >= gpus:
            return key
    return None


def _count_gpus(counts: dict[str, int], job: PlacedJob, pool: NodePool, sign: int) -> None:
    for allocation in job.allocations:
        if allocation.node in pool.ready:
            counts[allocation.node] += sign * len(allocation.gpu_indices)


_UNDECIDED = object()  # a shortcut that cannot tell: walk


class _NodeFirstSearch:
    """Try 3 for a one-node job when no node has room yet, without walking the candidates.

    The greedy walk would take every candidate, in victim order, up to the one with which some
    node first has room for the job (the "stop"), then the prune would drop nearly all of them
    again. Here the stop comes from the reachable room's per-node index, the shares' GPUs given
    up before it by bisection, and the prune is done on the few victims that can matter: those
    on the nodes that reach room and the job's own share's. The result is the walk's exactly
    when the quota holds with the victims kept (the kept set then fits, and each kept victim
    is needed for room or for the share's limit, which is what the backward walk decides);
    otherwise, or in a case the shortcut does not cover, the answer is `_UNDECIDED`.
    """

    def __init__(self, shortcuts: Shortcuts, job: RunnableJob) -> None:
        self.shortcuts = shortcuts
        self.job = job

    def victims(self) -> list[PlacedJob] | object:
        shortcuts = self.shortcuts
        job = self.job
        need = job.gpus
        share = job.share
        pool = shortcuts.pool
        if shortcuts.pool.count_room_at_least(need):
            return _UNDECIDED
        room = shortcuts.room()

        # The share's own jobs of lower priority are candidates with their own keys; its jobs
        # that other shares' reclaims could reach are not borrowers here.
        queue = shortcuts.candidates.of.get(share, [])
        own: list[tuple[tuple, PlacedJob]] = []
        if queue:
            keys = shortcuts.candidates.keys(share, True)
            for position, candidate in enumerate(queue):
                if candidate.priority >= job.priority:
                    break
                if candidate.id not in shortcuts.candidates.taken:
                    own.append((keys[position], candidate))
        own_on: dict[str, list[tuple[tuple, int, PlacedJob]]] = defaultdict(list)
        for key, candidate in own:
            for allocation in candidate.allocations:
                if allocation.node in pool.ready:
                    own_on[allocation.node].append((key, len(allocation.gpu_indices), candidate))
        touched = set(own_on)
        for victim in room.reached.get(share, ()):
            for allocation in victim.allocations:
                if allocation.node in pool.ready:
                    touched.add(allocation.node)

        def entries_on(node: str) -> list[tuple[tuple, int, PlacedJob]]:
            others = room.on_node.get(node, ())
            if node not in touched:
                return list(others)
            return sorted([e for e in others if e[2].share != share] + own_on.get(node, []))

        # The stop: the first key with which a node has room.
        times, heap = room.first_room_heap(need)
        best: tuple[tuple, str] | None = None
        aside = []
        while heap:
            key, node = heap[0]
            if times.get(node) != key:
                heapq.heappop(heap)
            elif node in touched:
                aside.append(heapq.heappop(heap))
            else:
                best = (key, node)
                break
        for entry in aside:
            heapq.heappush(heap, entry)
        for node in touched:
            time = _first_room_key(pool.base_room(node), entries_on(node), need)
            if time is not None and (best is None or time < best[0]):
                best = (time, node)
        if best is None or best[0] == ():
            return _UNDECIDED
        stop = best[0]

        own_needed = own_victims_needed(shortcuts.ledger, job, True, job.gpus)
        own_taken = sum(candidate.gpus for key, candidate in own if key <= stop)
        kept_own: list[PlacedJob] | None = []
        if own_taken < own_needed:  # as _Walk._jump_to_own_victims
            later = (candidate for key, candidate in own if key > stop)
            kept_own = _fewest_own_victims(later, own_taken, own_needed)
            if kept_own is None:
                return _UNDECIDED

        def given_up_by_others() -> Iterator[tuple[str, int]]:
            for name, (keys, totals) in room.reached_keys.items():
                if name != share:
                    count = bisect_right(keys, stop)
                    if count:
                        yield name, totals[count - 1]

        own_given_up = own_taken + sum(victim.gpus for victim in kept_own)
        if not self._quota_holds(own_given_up, given_up_by_others):
            return _UNDECIDED

        # The prune, over the victims that change room on the nodes that can reach it or the
        # share's own count.
        stop_victim = next(entry[2] for entry in entries_on(best[1]) if entry[0] == stop)
        relevant = {a.node for a in stop_victim.allocations if a.node in pool.ready}
        for victim in kept_own:
            relevant.update(a.node for a in victim.allocations if a.node in pool.ready)
        prefix_room = {node: pool.base_room(node) for node in relevant}
        kept_room = dict.fromkeys(relevant, 0)
        steps: dict[str, tuple[tuple, PlacedJob, dict[str, int]]] = {}
        for node in relevant:
            for key, gpus, victim in entries_on(node):
                if key > stop:
                    break
                prefix_room[node] += gpus
                steps.setdefault(victim.id, (key, victim, {}))[2][node] = gpus
        for key, candidate in own:
            if key > stop:
                break
            steps.setdefault(candidate.id, (key, candidate, {}))
        for victim in kept_own:
            for allocation in victim.allocations:
                if allocation.node in relevant:
                    kept_room[allocation.node] += len(allocation.gpu_indices)
        prefix_own = own_taken
        kept_own_gpus = sum(victim.gpus for victim in kept_own)
        kept: list[PlacedJob] = []
        for _, victim, gpus_on in sorted(steps.values(), key=_first, reverse=True):
            for node, gpus in gpus_on.items():
                prefix_room[node] -= gpus
            mine = victim.share == share
            if mine:
                prefix_own -= victim.gpus
            fits = prefix_own + kept_own_gpus >= own_needed and any(
                prefix_room[node] + kept_room[node] >= need for node in relevant
            )
            if not fits:
                kept.append(victim)
                for node, gpus in gpus_on.items():
                    kept_room[node] += gpus
                if mine:
                    kept_own_gpus += victim.gpus
        kept.reverse()
        victims = kept + kept_own
        freed: dict[str, int] = defaultdict(int)
        for victim in victims:
            freed[victim.share] += victim.gpus
        own_freed = freed.pop(share, 0)
        return victims if self._quota_holds(own_freed, freed.items) else _UNDECIDED

    def _quota_holds(
        self, own_given_up: int, others: Callable[[], Iterable[tuple[str, int]]]
    ) -> bool:
        """Whether the job may start, within its share's limit, once its share has given up
        `own_given_up` GPUs and the other shares the GPUs `others()` yields (share, GPUs).

        The other shares are looked at only when the job's share alone does not pass: giving up
        GPUs never raises a share's part of the borrowing rule (borrowed minus lendable grows
        with usage), and the rules of the job's share do not depend on the others. That check
        would otherwise cost every search a step for every share above its limit."""
        trial = self.shortcuts.ledger.trial(self.job.share, True)
        trial.change(self.job.share, self.job.gpus - own_given_up)
        if trial.reason() is None:
            return True
        for name, gpus in others():
            trial.change(name, -gpus)
        return trial.reason() is None


def _first(entry: tuple) -> tuple:
    return entry[0]


def _fewest_own_victims(
    candidates: Iterable[PlacedJob], taken: int, needed: int
) -> list[PlacedJob] | None:
    """The share's own jobs to stop, from `candidates` (in victim order), so that with the
    `taken` GPUs it has already given up it gives up `needed`: taken in order until it has,
    then walked backwards, each dropped when the rest are enough. In victim order; None when
    all of them are not enough."""
    chosen: list[PlacedJob] = []
    total = taken
    for candidate in candidates:
        if total >= needed:
            break
        chosen.append(candidate)
        total += candidate.gpus
    if total < needed:
        return None
    kept = []
    for victim in reversed(chosen):
        if total - victim.gpus >= needed:
            total -= victim.gpus
        else:
            kept.append(victim)
    kept.reverse()
    return kept


class _Walk:
    """One victim search: the greedy walk over candidates in victim order, then the backward
    prune (DESIGN §2, "Which victims").

    The walk records, for every prefix of the chosen list, how many nodes could host the job and
    how many GPUs each node and each share gave up. The prune then does not step back over every
    chosen victim: victim i is kept exactly when the job does not fit with the victims before i
    plus those kept after i, and that fit only grows with i, so a binary search finds the next
    victim kept, and every victim between two kept ones is dropped at once. Long walks (a
    high-priority job whose own share's victims come after many borrowers') cost the walk only.
    """

    def __init__(
        self,
        shortcuts: Shortcuts,
        job: RunnableJob,
        within_limit: bool,
        promised: Sequence[PlacedJob],
        base_deltas: Mapping[str, int],
    ) -> None:
        self.shortcuts = shortcuts
        self.job = job
        self.within_limit = within_limit
        self.base_deltas = base_deltas
        self.need = job.gpus // job.nodes
        self.capacity = NodeRoom(shortcuts.pool, self.need, promised)
        # GPUs stopping for the job, by node: there before any victim is chosen.
        self.promised_gpus = dict(self.capacity.extra)
        self.own_needed = own_victims_needed(
            shortcuts.ledger, job, within_limit, base_deltas.get(job.share, 0)
        )
        self.chosen: list[PlacedJob] = []
        self.node_counts = [self.capacity.nodes]  # nodes able to host after the first k victims
        self.node_steps: dict[str, tuple[list[int], list[int]]] = {}  # victim k, GPUs so far
        self.share_steps: dict[str, tuple[list[int], list[int]]] = {}
        # Chosen victims kept without the backward walk, last first (see _jump_to_own_victims).
        self.decided: list[int] = []

    def greedy(self, stream: _Candidates) -> bool:
        """Take candidates in victim order until the job fits; False if it never does."""
        shortcuts = self.shortcuts
        job = self.job
        candidates = shortcuts.candidates.of
        limits = shortcuts.ledger.limit
        pool = shortcuts.pool
        capacity = self.capacity
        trial = self._trial()
        # Victims' GPUs per share not yet told to the trial: the quota is looked at only once
        # the nodes have room and the job's share has given up enough of its own jobs to be
        # within what the try allows, so a long walk over candidates costs dictionary updates.
        pending: dict[str, int] = defaultdict(int)
        given_up: dict[str, int] = defaultdict(int)
        freed: dict[str, int] = defaultdict(int)
        own_taken = 0
        jumped = False
        while True:
            entry = stream.pop()
            if entry is None:
                return False
            _, name, position = entry
            candidate = candidates[name][position]
            if name != job.share and trial.usage(name) - pending[name] <= limits(name):
                continue  # victims only while their share is above its limit
            shortcuts.push_next(stream.heap, job, name, position + 1)
            index = len(self.chosen)
            self.chosen.append(candidate)
            pending[name] += candidate.gpus
            given_up[name] += candidate.gpus
            _step(self.share_steps, name, index, given_up[name])
            if name == job.share:
                own_taken += candidate.gpus
            for allocation in candidate.allocations:
                node = allocation.node
                if node in pool.ready:
                    gpus = len(allocation.gpu_indices)
                    capacity.add(node, gpus)
                    freed[node] += gpus
                    _step(self.node_steps, node, index, freed[node])
            self.node_counts.append(capacity.nodes)
            if capacity.nodes < job.nodes:
                continue
            if own_taken < self.own_needed:
                if not jumped:
                    jumped = True
                    outcome = self._jump_to_own_victims(stream.heap, own_taken, given_up)
                    if outcome is not None:
                        return outcome
                continue
            for share_name, gpus in pending.items():
                trial.change(share_name, -gpus)
            pending.clear()
            if trial.reason() is None:
                return True
        return False

    def _jump_to_own_victims(
        self, heap: list[tuple[tuple, str, int]], own_taken: int, given_up: Mapping[str, int]
    ) -> bool | None:
        """The nodes have room, but the job's share has not yet given up enough of its own jobs.
        The walk cannot stop before it has, so it would take every candidate up to the own job
        that makes the share fit, and the prune would drop every other share's one among them
        again, provided the quota holds without them. When it does, take the share's own jobs
        straight away: True. False: the share's own jobs can never be enough. None: decide by
        walking on."""
        shortcuts = self.shortcuts
        job = self.job
        queue = shortcuts.candidates.of.get(job.share, [])
        position = next((entry[2] for entry in heap if entry[1] == job.share), len(queue))
        kept = _fewest_own_victims(
            shortcuts.candidates.own(job, position), own_taken, self.own_needed
        )
        if kept is None:
            return False
        trial = self._trial()
        for name, gpus in given_up.items():
            trial.change(name, -gpus)
        trial.change(job.share, -sum(victim.gpus for victim in kept))
        if trial.reason() is not None:
            return None
        first = len(self.chosen)
        self.chosen.extend(kept)
        self.decided = list(range(len(self.chosen) - 1, first - 1, -1))
        return True

    def pruned(self) -> list[PlacedJob]:
        """Walk the chosen list backwards, dropping every victim the job can do without."""
        kept = list(self.decided)
        end = len(self.node_counts) - 1  # victims from `end` on are decided
        while end > 0 and not self._fits(0, kept):
            # The last victim before `end` that the job cannot do without.
            low, high = 0, end - 1
            while low < high:
                middle = (low + high + 1) // 2
                if self._fits(middle, kept):
                    high = middle - 1
                else:
                    low = middle
            kept.append(low)
            end = low
        return [self.chosen[index] for index in reversed(kept)]

    def _trial(self) -> Trial:
        trial = self.shortcuts.ledger.trial(self.job.share, self.within_limit)
        for name, delta in self.base_deltas.items():
            trial.change(name, delta)
        return trial

    def _fits(self, count: int, kept: Sequence[int]) -> bool:
        """Whether the job fits with the first `count` chosen victims plus the `kept` ones."""
        job = self.job
        extra_nodes: dict[str, int] = defaultdict(int)
        extra_shares: dict[str, int] = defaultdict(int)
        for index in kept:
            victim = self.chosen[index]
            extra_shares[victim.share] += victim.gpus
            for allocation in victim.allocations:
                if allocation.node in self.shortcuts.pool.ready:
                    extra_nodes[allocation.node] += len(allocation.gpu_indices)
        nodes = self.node_counts[count]
        shortcuts = self.shortcuts
        for node, extra in extra_nodes.items():
            gpus = (
                shortcuts.pool.base_room(node)
                + self.promised_gpus.get(node, 0)
                + _so_far(self.node_steps.get(node), count)
            )
            nodes += (gpus + extra >= self.need) - (gpus >= self.need)
        if nodes < job.nodes:
            return False
        own = _so_far(self.share_steps.get(job.share), count) + extra_shares.get(job.share, 0)
        if own < self.own_needed:
            return False
        # The job's share first: when it passes alone, the other shares' victims can only help
        # (see _NodeFirstSearch._quota_holds).
        trial = self._trial()
        trial.change(job.share, -own)
        if trial.reason() is None:
            return True
        for name in self.share_steps.keys() | extra_shares.keys():
            if name != job.share:
                given_up = _so_far(self.share_steps.get(name), count) + extra_shares[name]
                trial.change(name, -given_up)
        return trial.reason() is None


def _step(steps: dict[str, tuple[list[int], list[int]]], key: str, index: int, total: int) -> None:
    entry = steps.get(key)
    if entry is None:
        steps[key] = ([index], [total])
    else:
        entry[0].append(index)
        entry[1].append(total)


def _so_far(steps: tuple[list[int], list[int]] | None, count: int) -> int:
    """The running total recorded in `steps` after the first `count` victims."""
    if steps is None:
        return 0
    position = bisect_left(steps[0], count)
    return steps[1][position - 1] if position else 0
