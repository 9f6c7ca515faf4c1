"""`plan(snapshot)`: one scheduling cycle, DESIGN §2 as pure Python.

Each GPU type is planned on its own (quotas, nodes and victims never cross types). Per type:

1. jobs that were promised GPUs go first, so nothing takes them: jobs with victims still
   stopping for them, and jobs whose victims have just stopped (a runnable job was preempted
   for them), so the victims, back in the queue, do not take their GPUs back;
2. the within-limit pass: every job that fits within its share's limit, by priority then
   submission;
3. the borrowers' pass: the rest, FIFO or fair (lowest borrowed/weight first).

A job is placed on free GPUs if the quota rules allow it; otherwise it may wait for GPUs being
released, or search for victims (reclaim, in-share preemption) in the three tries of §2. Victims
keep their GPUs within this plan: the job waits, and the GPUs are reserved for it.

Capacity of DRAINING and DOWN nodes is not cluster capacity: it is neither in the free pool nor
placeable. Jobs still running there keep counting in their share's usage until they end.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Mapping, Sequence

from scheduler.engine import reasons
from scheduler.engine.ledger import Ledger, Trial
from scheduler.engine.pool import NodePool
from scheduler.engine.snapshot import (
    FAIR,
    IN_SHARE,
    LEND_AND_BORROW,
    READY,
    RECLAIM,
    NodeView,
    PlacedJob,
    Placement,
    Plan,
    Preemption,
    Rejection,
    RunnableJob,
    ShareView,
    Snapshot,
)

# The three tries of victim choice (DESIGN §2, "Which victims"), in the order they are tried.
TRY_BORROWERS = "borrowers"  # (1) victims only from borrowing shares; share within its limit after
TRY_OWN_SHARE = "own_share"  # (2) victims only from the job's own share (in-share preemption)
TRY_BOTH = "both"  # (3) both together; share within its limit after


def plan(snapshot: Snapshot) -> Plan:
    """Decide one cycle: which runnable jobs start where, which placed jobs are preempted, which
    runnable jobs are rejected, and why every other runnable job waits.

    Deterministic: the same snapshot always gives an equal plan.
    """
    shares = {share.name: share for share in snapshot.shares}
    nodes_by_type: dict[str, list[NodeView]] = defaultdict(list)
    for node in snapshot.nodes:
        nodes_by_type[node.gpu_type].append(node)

    sizes = {gpu_type: NodeSizes(nodes) for gpu_type, nodes in nodes_by_type.items()}
    rejections: list[Rejection] = []
    jobs_by_type: dict[str, list[tuple[int, RunnableJob]]] = defaultdict(list)
    for position, job in enumerate(snapshot.runnable):
        reason = rejection_reason(job, shares, sizes.get(job.gpu_type))
        if reason is not None:
            rejections.append(Rejection(job.id, reason))
        else:
            jobs_by_type[job.gpu_type].append((position, job))

    # Only the GPU types with jobs to plan need their placed jobs and held GPUs.
    placed_by_type: dict[str, list[PlacedJob]] = {gpu_type: [] for gpu_type in jobs_by_type}
    held: dict[str, set[int]] = defaultdict(set)
    for placed in snapshot.placed:
        same_type = placed_by_type.get(placed.gpu_type)
        if same_type is None:
            continue
        same_type.append(placed)
        for allocation in placed.allocations:
            held[allocation.node].update(allocation.gpu_indices)

    placements: list[Placement] = []
    preemptions: list[Preemption] = []
    waiting: dict[str, str] = {}
    for gpu_type in sorted(jobs_by_type):
        cycle = _TypeCycle(
            gpu_type,
            shares,
            nodes_by_type[gpu_type],
            held,
            placed_by_type.get(gpu_type, []),
            jobs_by_type[gpu_type],
            snapshot.borrow_order,
        )
        cycle.run()
        placements.extend(cycle.placements)
        preemptions.extend(cycle.preemptions)
        waiting.update(cycle.waiting)
    return Plan(tuple(placements), tuple(preemptions), tuple(rejections), waiting)


class NodeSizes:
    """How many nodes of one GPU type have at least g GPUs, for every g; node states ignored."""

    def __init__(self, nodes: Sequence[NodeView]) -> None:
        self.largest = max((node.gpus for node in nodes), default=0)
        at_least = [0] * (self.largest + 2)
        for node in nodes:
            at_least[node.gpus] += 1
        for gpus in range(self.largest - 1, -1, -1):
            at_least[gpus] += at_least[gpus + 1]
        self._at_least = at_least

    def count_at_least(self, gpus: int) -> int:
        return self._at_least[gpus] if gpus <= self.largest else 0


def rejection_reason(
    job: RunnableJob, shares: Mapping[str, ShareView], sizes: NodeSizes | None
) -> str | None:
    """Why the job can never run (it is FAILED), or None.

    Node states do not matter here: a DOWN node may come back, so only the nodes' sizes count.
    A DISABLED share's queued jobs are not rejected: only new submissions are refused, and that
    happens in the service layer.
    """
    share = shares.get(job.share)
    if share is None:
        return reasons.unknown_share(job.share)
    if job.gpu_type not in share.capacity_limits:
        return reasons.no_limit_for_type(job.share, job.gpu_type)
    if job.gpus < 1 or job.nodes < 1:
        return reasons.bad_size(job.gpus, job.nodes)
    if job.gpus % job.nodes:
        return reasons.not_divisible(job.gpus, job.nodes)
    if sizes is None:
        return reasons.no_nodes_of_type(job.gpu_type)
    per_node = job.gpus // job.nodes
    if per_node > sizes.largest:
        return reasons.node_too_small(per_node, job.gpu_type, sizes.largest)
    big_enough = sizes.count_at_least(per_node)
    if job.nodes > big_enough:
        return reasons.too_few_nodes(job.nodes, per_node, job.gpu_type, big_enough)
    return None


def _victim_order(job: PlacedJob) -> tuple:
    # Lowest priority first, then jobs on borrowed GPUs before jobs on their share's own quota,
    # then most recently started (least work lost), then later submission; the id only makes
    # the order total.
    return (job.priority, job.borrowed == 0, -job.started, -job.submitted, job.id)


class _Capacity:
    """Nodes that could host one gang part (`gpus_per_node`) counting free GPUs, GPUs being
    released for anyone, and GPUs added on top (stopping for the job, or victims'); kept up to
    date as victims are added and dropped."""

    def __init__(
        self,
        pool: NodePool,
        gpus_per_node: int,
        releasing: Mapping[str, int],
        boosted_nodes: int,
    ) -> None:
        self._pool = pool
        self._need = gpus_per_node
        self._releasing = releasing
        self.extra: dict[str, int] = {}
        self.nodes = pool.count_at_least(gpus_per_node) + boosted_nodes

    def add(self, name: str, gpus: int) -> None:
        base = self._pool.free_count(name) + self._releasing.get(name, 0)
        before = base + self.extra.get(name, 0)
        after = before + gpus
        self.extra[name] = after - base
        self.nodes += (after >= self._need) - (before >= self._need)


class _TypeCycle:
    """One cycle for one GPU type; results in `placements`, `preemptions` and `waiting`."""

    def __init__(
        self,
        gpu_type: str,
        shares: Mapping[str, ShareView],
        nodes: Sequence[NodeView],
        held: Mapping[str, set[int]],
        placed: Sequence[PlacedJob],
        jobs: Sequence[tuple[int, RunnableJob]],
        borrow_order: str,
    ) -> None:
        self.gpu_type = gpu_type
        self.shares = shares
        self.borrow_order = borrow_order
        ready = [node for node in nodes if node.state == READY]
        self.pool = NodePool(ready, held)
        usage: dict[str, int] = defaultdict(int)
        for job in placed:
            usage[job.share] += job.gpus
        self.ledger = Ledger(gpu_type, shares, usage, sum(node.gpus for node in ready))

        self.jobs = sorted(jobs, key=lambda item: (-item[1].priority, item[1].submitted, item[0]))
        waiting_ids = {job.id for _, job in jobs}
        # GPUs being released: promised to the runnable job they were preempted for, or free
        # for any job's reclaim to count on once they are released.
        self.promised: dict[str, list[PlacedJob]] = defaultdict(list)
        releasing: dict[str, list[int]] = defaultdict(list)
        candidates: dict[str, list[PlacedJob]] = defaultdict(list)
        for job in placed:
            if job.stopping:
                if job.preempted_for in waiting_ids:
                    self.promised[job.preempted_for].append(job)
                else:
                    for allocation in job.allocations:
                        if allocation.node in self.pool:
                            releasing[allocation.node].extend(allocation.gpu_indices)
            elif job.share in shares:
                candidates[job.share].append(job)
        self.candidates = {
            name: sorted(share_jobs, key=_victim_order) for name, share_jobs in candidates.items()
        }
        # Jobs promised GPUs: victims stopping for them, or victims already stopped and back in
        # the queue (the GPUs they released stay promised until the job starts).
        self.claimants = set(self.promised)
        for _, job in jobs:
            if job.preempted_for in waiting_ids:
                self.claimants.add(job.preempted_for)
        self.releasing = {name: sorted(indices) for name, indices in releasing.items()}
        self.releasing_counts = {name: len(indices) for name, indices in self.releasing.items()}
        # Bumped whenever free or released GPUs change on a node with GPUs being released.
        self._releasing_version = 0
        self._boost_cache: dict[int, tuple[int, int]] = {}
        self.victims: set[str] = set()
        self._first_untaken: dict[str, int] = {}

        self.placements: list[Placement] = []
        self.preemptions: list[Preemption] = []
        self.waiting: dict[str, str] = {}
        self._strict_blocker: dict[str, str] = {}
        # Searches that failed, to answer later jobs of the same share that can only do worse
        # (within one plan, capacity and candidates only shrink): (share, try, nodes) → list
        # of (gpus per node, priority).
        self._failed_searches: dict[tuple[str, str, int], list[tuple[int, int]]] = defaultdict(list)
        self._failed_release_waits: dict[int, int] = {}

    # --- the passes ----------------------------------------------------------------------

    def run(self) -> None:
        first = [job for _, job in self.jobs if job.id in self.claimants]
        rest = [job for _, job in self.jobs if job.id not in self.claimants]
        for job in first:
            self._consider(job)
        borrowers: list[RunnableJob] = []
        strict_deferred: set[str] = set()
        for job in rest:
            share = self.shares[job.share]
            if share.strict_fifo and job.share in strict_deferred:
                borrowers.append(job)  # strict FIFO: never ahead of an earlier job of its share
            elif self.ledger.fits_limit(job.share, job.gpus):
                self._consider(job)
            else:
                borrowers.append(job)
                if share.strict_fifo:
                    strict_deferred.add(job.share)
        if self.borrow_order == FAIR:
            self._fair_pass(borrowers)
        else:
            for job in borrowers:
                self._consider(job)

    def _fair_pass(self, borrowers: Sequence[RunnableJob]) -> None:
        """Borrowers in turn of their share's borrowed/weight, lowest first; ties by priority
        then submission (the order they already have within each share)."""
        queues: dict[str, list[RunnableJob]] = defaultdict(list)
        for job in borrowers:
            queues[job.share].append(job)
        heads = {name: 0 for name in queues}
        order = {job.id: position for position, job in enumerate(borrowers)}
        heap = [(self._fair_key(queue[0], order), name) for name, queue in queues.items()]
        heapq.heapify(heap)
        while heap:
            key, name = heapq.heappop(heap)
            job = queues[name][heads[name]]
            current = self._fair_key(job, order)
            if current != key:  # the share's borrowing changed since it was queued
                heapq.heappush(heap, (current, name))
                continue
            self._consider(job)
            heads[name] += 1
            if heads[name] < len(queues[name]):
                heapq.heappush(heap, (self._fair_key(queues[name][heads[name]], order), name))

    def _fair_key(self, job: RunnableJob, order: Mapping[str, int]) -> tuple:
        weight = self.shares[job.share].weight
        borrowed = self.ledger.borrowed(job.share)
        ratio = borrowed / weight if weight > 0 else float("inf")
        return (ratio, -job.priority, job.submitted, order[job.id])

    def _consider(self, job: RunnableJob) -> None:
        blocker = self._strict_blocker.get(job.share)
        if blocker is not None:
            self.waiting[job.id] = reasons.strict_fifo(blocker)
            return
        if not self._schedule(job) and self.shares[job.share].strict_fifo:
            self._strict_blocker[job.share] = job.id

    # --- one job ---------------------------------------------------------------------------

    def _schedule(self, job: RunnableJob) -> bool:
        """Place the job, or reserve GPUs for it (waiting for releases or victims), or record
        why it waits. True only when it is placed."""
        share = self.shares[job.share]
        limit = self.ledger.limit(job.share)
        if job.gpus > limit and share.strategy != LEND_AND_BORROW:
            # It stays RUNNABLE (an admin may raise the limit), but say plainly why it waits.
            self.waiting[job.id] = reasons.larger_than_limit(
                job.gpus, self.gpu_type, job.share, limit, share.strategy
            )
            return False
        per_node = job.gpus // job.nodes
        own = {job.share: job.gpus}
        reason = self.ledger.check(job.share, own, within_limit=False)
        if reason is None:
            used = self.ledger.held_usage(job.share)
            allocations = self.pool.take(per_node, job.nodes)
            if allocations is not None:
                borrowed = max(0, used + job.gpus - limit) - max(0, used - limit)
                self.ledger.admit(own)
                self.placements.append(Placement(job.id, allocations, borrowed))
                if any(a.node in self.releasing for a in allocations):
                    self._releasing_version += 1
                return True
            reason = reasons.no_node(per_node, job.nodes, self.gpu_type)

        # GPUs already stopping for this job are its own: count them as released, both on the
        # nodes and in the quota, so the same need never triggers a second reclaim.
        promised = self.promised.get(job.id, [])
        deltas = dict(own)
        for stopping in promised:
            deltas[stopping.share] = deltas.get(stopping.share, 0) - stopping.gpus

        may_wait = (promised or self.releasing) and self._may_wait_for_release(
            job, per_node, promised
        )
        if may_wait and self.ledger.check(job.share, deltas, within_limit=False) is None:
            capacity = self._capacity(per_node, promised)
            if capacity.nodes >= job.nodes:
                self._commit(job, promised, [], deltas)
                return False
            if not promised:
                self._failed_release_waits[job.nodes] = min(
                    per_node, self._failed_release_waits.get(job.nodes, per_node)
                )

        for attempt in self._tries(job):
            if not promised and self._known_failure(job, attempt, per_node):
                continue
            victims = self._search(job, attempt, promised, deltas)
            if victims is not None:
                self._commit(job, promised, victims, deltas)
                return False
            if not promised:
                self._failed_searches[(job.share, attempt, job.nodes)].append(
                    (per_node, job.priority)
                )
        self.waiting[job.id] = reason
        return False

    def _may_wait_for_release(
        self, job: RunnableJob, per_node: int, promised: Sequence[PlacedJob]
    ) -> bool:
        if promised:
            return True
        failed = self._failed_release_waits.get(job.nodes)
        return failed is None or per_node < failed

    def _capacity(self, per_node: int, promised: Sequence[PlacedJob]) -> _Capacity:
        """Nodes able to host one gang part: free GPUs, GPUs released for anyone, and the GPUs
        stopping for this job."""
        cached = self._boost_cache.get(per_node)
        if cached is None or cached[0] != self._releasing_version:
            boosted = 0
            for name, count in self.releasing_counts.items():
                free = self.pool.free_count(name)
                boosted += free < per_node <= free + count
            cached = (self._releasing_version, boosted)
            self._boost_cache[per_node] = cached
        capacity = _Capacity(self.pool, per_node, self.releasing_counts, cached[1])
        for stopping in promised:
            for allocation in stopping.allocations:
                if allocation.node in self.pool:
                    capacity.add(allocation.node, len(allocation.gpu_indices))
        return capacity

    def _tries(self, job: RunnableJob) -> list[str]:
        tries = []
        if self.ledger.fits_limit(job.share, job.gpus):
            tries.append(TRY_BORROWERS)
        if self.shares[job.share].in_share_preemption:
            tries += [TRY_OWN_SHARE, TRY_BOTH]
        return tries

    def _known_failure(self, job: RunnableJob, attempt: str, per_node: int) -> bool:
        for failed_size, failed_priority in self._failed_searches.get(
            (job.share, attempt, job.nodes), ()
        ):
            # Try 1 does not depend on priority; the in-share tries have fewer candidates for
            # a lower-priority job.
            if per_node >= failed_size and (
                attempt == TRY_BORROWERS or job.priority <= failed_priority
            ):
                return True
        return False

    # --- victims -------------------------------------------------------------------------------

    def _candidate_streams(self, job: RunnableJob, attempt: str) -> list[tuple[tuple, str, int]]:
        """Heap entries (order key, share, position) of each candidate share's first victim."""
        heap: list[tuple[tuple, str, int]] = []
        if attempt in (TRY_BORROWERS, TRY_BOTH):
            # Only shares above their limit when the search starts are candidates.
            for name in self.candidates:
                if name != job.share and self.ledger.above_limit(name):
                    self._push_next(heap, job, name, 0)
        if attempt in (TRY_OWN_SHARE, TRY_BOTH) and job.share in self.candidates:
            self._push_next(heap, job, job.share, 0)
        return heap

    def _push_next(
        self, heap: list[tuple[tuple, str, int]], job: RunnableJob, name: str, position: int
    ) -> None:
        queue = self.candidates[name]
        if position == 0:
            # Victims taken by earlier reclaims of this plan mostly sit at the front.
            position = self._first_untaken.get(name, 0)
            start = position
            while position < len(queue) and queue[position].id in self.victims:
                position += 1
            if position != start:
                self._first_untaken[name] = position
        while position < len(queue) and queue[position].id in self.victims:
            position += 1
        if position == len(queue):
            return
        candidate = queue[position]
        own = name == job.share
        if own and candidate.priority >= job.priority:
            return  # in-share preemption takes strictly lower priority only
        # Ties: jobs on borrowed GPUs before jobs on own quota, then later start, then (try 3)
        # other shares' jobs before the job's own share's, then later submission.
        key = (
            candidate.priority,
            candidate.borrowed == 0,
            -candidate.started,
            own,
            -candidate.submitted,
            candidate.id,
        )
        heapq.heappush(heap, (key, name, position))

    def _search(
        self,
        job: RunnableJob,
        attempt: str,
        promised: Sequence[PlacedJob],
        base_deltas: Mapping[str, int],
    ) -> list[PlacedJob] | None:
        """The minimal victim set of this try (greedy in victim order, then pruned backwards),
        or None when the try cannot make the job fit."""
        within_limit = attempt != TRY_OWN_SHARE
        if attempt != TRY_BORROWERS and not self._own_victims_may_suffice(
            job, within_limit, base_deltas.get(job.share, 0)
        ):
            return None
        heap = self._candidate_streams(job, attempt)
        if not heap:
            return None
        capacity = self._capacity(job.gpus // job.nodes, promised)
        trial = self.ledger.trial(job.share, within_limit)
        for name, delta in base_deltas.items():
            trial.change(name, delta)

        # Victims' GPUs per share not yet told to the trial: the quota is looked at only once
        # the nodes have room, so a long walk over candidates costs dictionary updates only.
        pending: dict[str, int] = defaultdict(int)
        limits = self.ledger.limit
        chosen: list[PlacedJob | None] = []
        found = False
        while heap:
            _, name, position = heapq.heappop(heap)
            candidate = self.candidates[name][position]
            if name != job.share and trial.usage(name) - pending[name] <= limits(name):
                continue  # victims only while their share is above its limit
            self._push_next(heap, job, name, position + 1)
            chosen.append(candidate)
            pending[candidate.share] += candidate.gpus
            self._add_victim_gpus(candidate, capacity, +1)
            if capacity.nodes >= job.nodes:
                for share_name, gpus in pending.items():
                    trial.change(share_name, -gpus)
                pending.clear()
                if trial.reason() is None:
                    found = True
                    break
        if not found:
            return None
        # Walk back and drop every victim the job can do without. The nodes are checked first:
        # a victim the nodes need stays without a look at the quota.
        for index in range(len(chosen) - 1, -1, -1):
            victim = chosen[index]
            assert victim is not None
            self._add_victim_gpus(victim, capacity, -1)
            if capacity.nodes < job.nodes:
                self._add_victim_gpus(victim, capacity, +1)
                continue
            trial.change(victim.share, victim.gpus)
            if trial.reason() is None:
                chosen[index] = None
            else:
                self._add_victim(victim, capacity, trial, +1)
        return [victim for victim in chosen if victim is not None]

    def _own_victims_may_suffice(self, job: RunnableJob, within_limit: bool, delta: int) -> bool:
        """Whether the share's usage could get within what the try allows (its limit, or its
        borrow cap) with every lower-priority job of its own as a victim. When it cannot, no
        victim set of the try works, whatever other shares give up: the search may stop before
        walking the candidates."""
        cap = self.ledger.usage_cap(job.share, within_limit)
        if cap is None:
            return True
        ledger = self.ledger
        after = max(ledger.usage(job.share), ledger.held_usage(job.share)) + delta
        if after <= cap:
            return True
        for candidate in self.candidates.get(job.share, ()):
            if candidate.priority >= job.priority:
                break  # sorted lowest priority first
            if candidate.id not in self.victims:
                after -= candidate.gpus
                if after <= cap:
                    return True
        return False

    def _add_victim(self, victim: PlacedJob, capacity: _Capacity, trial: Trial, sign: int) -> None:
        trial.change(victim.share, -sign * victim.gpus)
        self._add_victim_gpus(victim, capacity, sign)

    def _add_victim_gpus(self, victim: PlacedJob, capacity: _Capacity, sign: int) -> None:
        for allocation in victim.allocations:
            if allocation.node in self.pool:
                capacity.add(allocation.node, sign * len(allocation.gpu_indices))

    def _commit(
        self,
        job: RunnableJob,
        promised: Sequence[PlacedJob],
        victims: Sequence[PlacedJob],
        deltas: Mapping[str, int],
    ) -> None:
        """The job waits for GPUs being released (its victims', maybe others'): reserve the GPUs
        it will use so no other job of this plan takes them, and count the quota as if the
        victims had stopped and the job were running."""
        per_node = job.gpus // job.nodes
        mine: dict[str, int] = defaultdict(int)
        for stopping in [*promised, *victims]:
            for allocation in stopping.allocations:
                if allocation.node in self.pool:
                    mine[allocation.node] += len(allocation.gpu_indices)
        counts = dict(self.releasing_counts)
        for name, count in mine.items():
            counts[name] = counts.get(name, 0) + count
        nodes = self.pool.tightest_with(per_node, job.nodes, counts)
        assert nodes is not None, "a committed wait always has room"
        for name in nodes:
            # GPUs stopping for this job first, then GPUs released for anyone, then free ones.
            need = per_node - mine.get(name, 0)
            released = self.releasing.get(name)
            if need > 0 and released:
                claimed = released[:need]
                self._claim_released(name, len(claimed))
                need -= len(claimed)
            if need > 0:
                self.pool.reserve(name, self.pool.free_indices(name)[:need])
                if name in self.releasing:
                    self._releasing_version += 1

        final = dict(deltas)
        for victim in victims:
            final[victim.share] = final.get(victim.share, 0) - victim.gpus
            self.victims.add(victim.id)
            if victim.share == job.share:
                kind, why = IN_SHARE, reasons.preempted_in_share(job.share, job.id)
            else:
                kind, why = RECLAIM, reasons.reclaimed_by(job.share, job.id)
            self.preemptions.append(Preemption(victim.id, job.id, kind, why))
        self.ledger.promise(final)
        self.waiting[job.id] = self._wait_reason(job, [*promised, *victims])

    def _claim_released(self, name: str, count: int) -> None:
        rest = self.releasing[name][count:]
        if rest:
            self.releasing[name] = rest
            self.releasing_counts[name] = len(rest)
        else:
            del self.releasing[name]
            del self.releasing_counts[name]
        self._releasing_version += 1

    def _wait_reason(self, job: RunnableJob, stopping: Sequence[PlacedJob]) -> str:
        if not stopping:
            return reasons.waiting_for_release(job.gpus, self.gpu_type)
        gpus = sum(victim.gpus for victim in stopping)
        others = {victim.share for victim in stopping if victim.share != job.share}
        if others:
            return reasons.reclaiming(gpus, self.gpu_type, others, len(stopping))
        return reasons.preempting_in_share(gpus, self.gpu_type, job.share, len(stopping))
