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

import gc
import heapq
import threading
from bisect import bisect_left, bisect_right, insort
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import cached_property
from itertools import accumulate

from scheduler.engine import order, reasons
from scheduler.engine.ledger import Ledger, Trial
from scheduler.engine.pool import NodeLayout, NodePool
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

# What scheduling one job came to.
PLACED = "placed"
WAITS = "waits"
WAITS_ON_SHARE = "waits on its share"  # for a reason that only its share's usage can change


def plan(snapshot: Snapshot, *, exhaustive: bool = False) -> Plan:
    """Decide one cycle: which runnable jobs start where, which placed jobs are preempted, which
    runnable jobs are rejected, and why every other runnable job waits.

    Deterministic: the same snapshot always gives an equal plan. `exhaustive` makes victim
    searches walk and prune every candidate one at a time, as DESIGN §2 words the rule, without
    the shortcuts that give the same victims faster; tests compare the two.
    """
    # A plan allocates many small objects and frees them all; none forms a reference cycle,
    # yet on a large snapshot Python's cycle collector would rescan everything alive many times
    # over (about a quarter of the time of a 100,000-job plan).
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _plan(snapshot, exhaustive)
    finally:
        if collecting:
            gc.enable()


def _plan(snapshot: Snapshot, exhaustive: bool) -> Plan:
    shares = {share.name: share for share in snapshot.shares}
    nodes = _nodes_of(snapshot.nodes)
    sizes = nodes.sizes
    rejections: list[Rejection] = []
    jobs_by_type: dict[str, list[RunnableJob]] = defaultdict(list)
    # The jobs that runnable victims were preempted for, by type (in the same pass: few jobs
    # are such victims, and a pass of their own over a long queue would cost more).
    preempted_for: dict[str, list[str]] = defaultdict(list)
    # Long queues repeat a few shapes (share, type, size): each is judged once.
    judged: dict[tuple[str, str, int, int], str | None] = {}
    for job in snapshot.runnable:
        shape = (job.share, job.gpu_type, job.gpus, job.nodes)
        if shape in judged:
            reason = judged[shape]
        else:
            reason = judged[shape] = rejection_reason(job, shares, sizes.get(job.gpu_type))
        if reason is not None:
            rejections.append(Rejection(job.id, reason))
        else:
            jobs_by_type[job.gpu_type].append(job)
            if job.preempted_for is not None:
                preempted_for[job.gpu_type].append(job.preempted_for)

    # Only the GPU types with jobs to plan need their placed jobs and held GPUs.
    placed_by_type: dict[str, list[PlacedJob]] = {gpu_type: [] for gpu_type in jobs_by_type}
    for placed in snapshot.placed:
        same_type = placed_by_type.get(placed.gpu_type)
        if same_type is not None:
            same_type.append(placed)
    held = snapshot.held_gpus
    if held is None:
        held = held_gpus(job for jobs in placed_by_type.values() for job in jobs)

    placements: list[Placement] = []
    preemptions: list[Preemption] = []
    waiting: dict[str, str] = {}  # every type's cycle adds its own jobs
    for gpu_type in sorted(jobs_by_type):
        cycle = _TypeCycle(
            gpu_type,
            shares,
            nodes.ready[gpu_type],
            held,
            placed_by_type.get(gpu_type, []),
            jobs_by_type[gpu_type],
            preempted_for.get(gpu_type, ()),
            snapshot.borrow_order,
            waiting,
            exhaustive,
        )
        cycle.run()
        placements.extend(cycle.placements)
        preemptions.extend(cycle.preemptions)
    return Plan(tuple(placements), tuple(preemptions), tuple(rejections), waiting)


def held_gpus(placed: Iterable[PlacedJob]) -> dict[str, int]:
    """The GPU indices the jobs hold on each node, as bit masks (bit i: GPU i)."""
    held: dict[str, int] = defaultdict(int)
    for job in placed:
        for allocation in job.allocations:
            mask = 0
            for index in allocation.gpu_indices:
                mask |= 1 << index
            held[allocation.node] |= mask
    return held


class _Nodes:
    """What a plan derives from the snapshot's nodes alone, by GPU type: how many nodes have at
    least g GPUs, and the READY nodes' layout."""

    def __init__(self, nodes: Sequence[NodeView]) -> None:
        by_type: dict[str, list[NodeView]] = defaultdict(list)
        for node in nodes:
            by_type[node.gpu_type].append(node)
        self.sizes = {gpu_type: NodeSizes(same) for gpu_type, same in by_type.items()}
        self.ready = {
            gpu_type: NodeLayout([node for node in same if node.state == READY])
            for gpu_type, same in by_type.items()
        }


# A caller that plans cycle after cycle (the simulator) sends the same tuple of nodes each time:
# what is derived from it is kept for the last few tuples, found by identity (a tuple of frozen
# NodeViews cannot change while it is kept alive here).
_RECENT_NODES = 4
_recent_nodes: dict[int, tuple[tuple[NodeView, ...], _Nodes]] = {}
_recent_nodes_lock = threading.Lock()


def _nodes_of(nodes: Sequence[NodeView]) -> _Nodes:
    if type(nodes) is not tuple:  # a list may change under the same identity
        return _Nodes(nodes)
    with _recent_nodes_lock:
        kept = _recent_nodes.get(id(nodes))
        if kept is not None and kept[0] is nodes:
            return kept[1]
        derived = _Nodes(nodes)
        if len(_recent_nodes) >= _RECENT_NODES:
            del _recent_nodes[next(iter(_recent_nodes))]
        _recent_nodes[id(nodes)] = (nodes, derived)
        return derived


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


def _victim_key(job: PlacedJob, own: bool) -> tuple:
    """Victim order: lowest priority first, then jobs on borrowed GPUs before jobs on their
    share's own quota, then most recently started (least work lost), then (try 3) other shares'
    jobs before the job's own share's (`own`), then later submission; the id makes it total."""
    return (job.priority, job.borrowed == 0, -job.started, own, -job.submitted, job.id)


class _Capacity:
    """Nodes that could host one gang part (`gpus_per_node`) counting their base room (free
    GPUs and GPUs being released for anyone) and GPUs added on top (stopping for the job, or
    victims'); kept up to date as victims are added and dropped."""

    def __init__(self, pool: NodePool, gpus_per_node: int) -> None:
        self._pool = pool
        self._need = gpus_per_node
        self.extra: dict[str, int] = {}
        self.nodes = pool.count_room_at_least(gpus_per_node)

    def add(self, name: str, gpus: int) -> None:
        base = self._pool.base_room(name)
        before = base + self.extra.get(name, 0)
        after = before + gpus
        self.extra[name] = after - base
        self.nodes += (after >= self._need) - (before >= self._need)


class _TypeCycle:
    """One cycle for one GPU type; results in `placements`, `preemptions` and `waiting` (a
    dictionary shared by the plan's cycles). `preempted_for`: for each runnable job of this
    type that is a victim back in the queue, the job it was preempted for."""

    def __init__(
        self,
        gpu_type: str,
        shares: Mapping[str, ShareView],
        nodes: NodeLayout,
        held: Mapping[str, int],
        placed: Sequence[PlacedJob],
        jobs: Sequence[RunnableJob],
        preempted_for: Iterable[str],
        borrow_order: str,
        waiting: dict[str, str],
        exhaustive: bool = False,
    ) -> None:
        self.gpu_type = gpu_type
        self.exhaustive = exhaustive
        self.shares = shares
        self.borrow_order = borrow_order
        usage: dict[str, int] = defaultdict(int)
        for job in placed:
            usage[job.share] += job.gpus
        self.ledger = Ledger(gpu_type, shares, usage, nodes.capacity)

        self._snapshot_jobs = jobs
        stopping: list[PlacedJob] = []
        candidates: dict[str, list[PlacedJob]] = defaultdict(list)
        for job in placed:
            if job.stopping:
                stopping.append(job)
            elif job.share in shares:
                candidates[job.share].append(job)
        self._unsorted_candidates = candidates
        # Jobs promised GPUs: the runnable jobs of this type that victims were preempted for,
        # stopping or already stopped and back in the queue (the GPUs they released stay
        # promised until the job starts). By id, with their places in the snapshot (the queue
        # order's last tie break): one pass over the queue finds the few asked for, and none is
        # made when no job is asked for.
        self.claimants = order.claimants(
            jobs, {job.preempted_for for job in stopping}.union(preempted_for)
        )
        # GPUs being released: promised to the runnable job they were preempted for, or free
        # for any job's reclaim to count on once they are released.
        self.promised: dict[str, list[PlacedJob]] = defaultdict(list)
        releasing: dict[str, list[int]] = defaultdict(list)
        ready = nodes.ordinal
        for job in stopping:
            if job.preempted_for in self.claimants:
                self.promised[job.preempted_for].append(job)
            else:
                for allocation in job.allocations:
                    if allocation.node in ready:
                        releasing[allocation.node].extend(allocation.gpu_indices)
        # Of each share's candidates in victim order: their priorities, and their GPUs so far.
        self._priorities: dict[str, list[int]] = {}
        self._gpus_so_far: dict[str, list[int]] = {}
        # Victim keys of each share's candidates, as another share's jobs (filled with the
        # candidates) and as the job's own share's (filled on first use).
        self._victim_keys: dict[tuple[str, bool], list[tuple]] = {}
        self._room: _Reachable | None = None  # built by the first victim search
        # The first candidate of every share above its limit, in victim order: where the walks
        # of tries 1 and 3 start. Built by the first such search, then kept current.
        self._heads: list[tuple[tuple, str, int]] | None = None
        self._head_of: dict[str, tuple[tuple, str, int]] = {}
        # The queue without the jobs promised GPUs (they go first, see `run`).
        self.jobs = order.by_priority(jobs, self.claimants)
        self.releasing = {name: sorted(indices) for name, indices in releasing.items()}
        self.pool = NodePool(
            nodes, held, {name: len(indices) for name, indices in self.releasing.items()}
        )
        self.victims: set[str] = set()
        # GPUs of each share's victims so far, by the victims' priority.
        self._victim_gpus: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        self._first_untaken: dict[str, int] = {}

        self.placements: list[Placement] = []
        self.preemptions: list[Preemption] = []
        self.waiting = waiting
        # A strict-FIFO share whose first job was left waiting: why its later jobs wait.
        self._strict_blocked: dict[str, str] = {}
        # Searches that failed, to answer later jobs of the same share that can only do worse
        # (within one plan, capacity and candidates only shrink): (share, try, nodes) → list
        # of (gpus per node, priority).
        self._failed_searches: dict[tuple[str, str, int], list[tuple[int, int]]] = defaultdict(list)
        self._failed_release_waits: dict[int, int] = {}
        # Bumped whenever the plan places a job or commits a wait: until then, a job of the same
        # share, size and priority as one left waiting is left waiting for the same reason (a
        # long queue repeats a few shapes, and most of its jobs only wait).
        self._changes = 0
        self._last_wait: dict[tuple[str, int, int, int], tuple[int, str]] = {}
        # The same for a reason that only the share's usage can change (WAITS_ON_SHARE): kept
        # until the share's usage changes, counted by `_share_changes`.
        self._share_changes: dict[str, int] = defaultdict(int)
        self._last_share_wait: dict[tuple[str, int, int, int], tuple[int, str]] = {}

    @cached_property
    def candidates(self) -> dict[str, list[PlacedJob]]:
        """Each share's running jobs in victim order; sorted on the first victim search only,
        as most cycles of a busy queue search for none."""
        candidates = {}
        for name, share_jobs in self._unsorted_candidates.items():
            keyed = sorted([(_victim_key(job, False), job) for job in share_jobs])  # ids differ
            queue = candidates[name] = [job for _, job in keyed]
            self._victim_keys[name, False] = [key for key, _ in keyed]
            self._priorities[name] = [job.priority for job in queue]
            self._gpus_so_far[name] = list(accumulate(job.gpus for job in queue))
        return candidates

    # --- the passes ----------------------------------------------------------------------

    def run(self) -> None:
        """The three passes of `order`, each job decided before the next is drawn, so the
        passes see the usage as planned so far."""
        self._consider_each(order.promised_first(self._snapshot_jobs, self.claimants))
        ledger = self.ledger
        borrowers: list[RunnableJob] = []
        self._consider_each(
            order.within_limit_first(
                self.jobs, self.shares, ledger.limits, ledger.planned.usage, ledger.held.usage,
                borrowers,
            )
        )  # fmt: skip
        if self.borrow_order == FAIR:
            self._consider_each(
                order.fair_order(
                    borrowers, self.shares, ledger.limits, ledger.planned.usage,
                    self._share_changes,
                )
            )  # fmt: skip
        else:
            self._consider_each(borrowers)
        # The victim searches' structures refer back to this cycle. Dropped, the cycle's are
        # freed as soon as its plan is made, not at the first collection after the plan (which
        # runs with the cycle collector off), so the next GPU type's cycle reuses their memory.
        self._room = None

    def _consider_each(self, jobs: Iterable[RunnableJob]) -> None:
        """Schedule each job in turn (the next one is drawn only once this one is decided), or
        leave it waiting. A job of the same share, size, node count and priority as one just
        left waiting waits for the same reason, as long as the plan has placed or committed
        nothing since: a long queue repeats a few shapes, and most of its jobs only wait."""
        waiting = self.waiting
        promised = self.promised
        last_wait = self._last_wait
        last_share_wait = self._last_share_wait
        share_changes = self._share_changes
        strict_blocked = self._strict_blocked
        shares = self.shares
        for job in jobs:
            name = job.share
            blocked = strict_blocked.get(name)
            if blocked is not None:
                waiting[job.id] = blocked
                continue
            shape = (name, job.gpus, job.nodes, job.priority)
            last = last_share_wait.get(shape)
            if last is None or last[0] != share_changes[name] or job.id in promised:
                last = last_wait.get(shape)
                if last is not None and (last[0] != self._changes or job.id in promised):
                    last = None
            if last is not None:
                waiting[job.id] = last[1]
            else:
                before = self._changes
                outcome = self._schedule(job)
                if outcome is PLACED:
                    continue
                if not self.exhaustive and job.id not in promised:
                    if outcome is WAITS_ON_SHARE:
                        # Until the share's usage changes, its shape waits for this reason.
                        last_share_wait[shape] = (share_changes[name], waiting[job.id])
                    elif self._changes == before:
                        # It changed nothing: until something does, its shape waits for this
                        # reason.
                        last_wait[shape] = (before, waiting[job.id])
            if shares[name].strict_fifo:
                strict_blocked[name] = reasons.strict_fifo(job.id)

    # --- one job ---------------------------------------------------------------------------

    def _schedule(self, job: RunnableJob) -> str:
        """Place the job (PLACED), or reserve GPUs for it (waiting for releases or victims), or
        record why it waits (WAITS; WAITS_ON_SHARE: for a reason only its share's usage can
        change)."""
        share = self.shares[job.share]
        limit = self.ledger.limit(job.share)
        if job.gpus > limit and share.strategy != LEND_AND_BORROW:
            # It stays RUNNABLE (an admin may raise the limit), but say plainly why it waits.
            self.waiting[job.id] = reasons.larger_than_limit(
                job.gpus, self.gpu_type, job.share, limit, share.strategy
            )
            return WAITS_ON_SHARE
        per_node = job.gpus // job.nodes
        reason = self.ledger.admission_reason(job.share, job.gpus)
        quota_allows = reason is None
        if (
            not quota_allows
            and share.strategy != LEND_AND_BORROW
            and not share.in_share_preemption
            and self.ledger.usage(job.share) + job.gpus > limit
            and job.id not in self.promised
        ):
            # Over its share's limit as planned, and no try may take victims for it: only the
            # share's own usage decides.
            self.waiting[job.id] = reason
            return WAITS_ON_SHARE
        if quota_allows:
            used = self.ledger.held_usage(job.share)
            allocations = self.pool.take(per_node, job.nodes)
            if allocations is not None:
                borrowed = max(0, used + job.gpus - limit) - max(0, used - limit)
                self.ledger.admit({job.share: job.gpus})
                self._changes += 1
                self.placements.append(Placement(job.id, allocations, borrowed))
                self._share_changed(job.share)
                for allocation in allocations:
                    self._node_changed(allocation.node)
                return PLACED
            reason = reasons.no_node(per_node, job.nodes, self.gpu_type)

        # GPUs already stopping for this job are its own: count them as released, both on the
        # nodes and in the quota, so the same need never triggers a second reclaim.
        promised = self.promised.get(job.id, [])
        deltas = {job.share: job.gpus}
        for stopping in promised:
            deltas[stopping.share] = deltas.get(stopping.share, 0) - stopping.gpus

        if promised:
            quota_allows = self.ledger.check(job.share, deltas, within_limit=False) is None
        if (
            quota_allows
            and (promised or self.releasing)
            and self._may_wait_for_release(job, per_node, promised)
        ):
            capacity = self._capacity(per_node, promised)
            if capacity.nodes >= job.nodes:
                self._commit(job, promised, [], deltas)
                return WAITS
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
                return WAITS
            if not promised:
                self._failed_searches[(job.share, attempt, job.nodes)].append(
                    (per_node, job.priority)
                )
        self.waiting[job.id] = reason
        return WAITS

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
        capacity = _Capacity(self.pool, per_node)
        for stopping in promised:
            for allocation in stopping.allocations:
                if allocation.node in self.pool.ready:
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

    def _candidate_streams(self, job: RunnableJob, attempt: str) -> _Candidates:
        """The candidates of the try in victim order: the shares above their limit when the
        search starts (tries 1 and 3), the job's own share (tries 2 and 3)."""
        heads = None
        if attempt in (TRY_BORROWERS, TRY_BOTH):
            if self._heads is None:
                self._heads = []
                for name in self.candidates:
                    self._refresh_head(name)
            heads = self._heads
        candidates = _Candidates(job, heads)
        if attempt in (TRY_OWN_SHARE, TRY_BOTH) and job.share in self.candidates:
            self._push_next(candidates.heap, job, job.share, 0)
        return candidates

    def _refresh_head(self, name: str) -> None:
        assert self._heads is not None
        old = self._head_of.pop(name, None)
        if old is not None:
            del self._heads[bisect_left(self._heads, old)]
        if name in self.candidates and self.ledger.above_limit(name):
            position = self._first_untaken_position(name)
            if position < len(self.candidates[name]):
                head = (self._victim_keys[name, False][position], name, position)
                insort(self._heads, head)
                self._head_of[name] = head

    def _first_untaken_position(self, name: str) -> int:
        # Victims taken by earlier reclaims of this plan mostly sit at the front.
        queue = self.candidates[name]
        position = start = self._first_untaken.get(name, 0)
        while position < len(queue) and queue[position].id in self.victims:
            position += 1
        if position != start:
            self._first_untaken[name] = position
        return position

    def _push_next(
        self, heap: list[tuple[tuple, str, int]], job: RunnableJob, name: str, position: int
    ) -> None:
        queue = self.candidates[name]
        if position == 0:
            position = self._first_untaken_position(name)
        while position < len(queue) and queue[position].id in self.victims:
            position += 1
        if position == len(queue):
            return
        candidate = queue[position]
        own = name == job.share
        if own and candidate.priority >= job.priority:
            return  # in-share preemption takes strictly lower priority only
        keys = self._victim_keys.get((name, own))
        if keys is None:
            keys = self._victim_keys[name, own] = [_victim_key(job, own) for job in queue]
        heapq.heappush(heap, (keys[position], name, position))

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
        if (
            not promised
            and attempt != TRY_OWN_SHARE
            and not self.exhaustive
            and not self._reachable().may_fit(job, attempt == TRY_BOTH)
        ):
            return None  # no victim set can give the job its nodes
        if attempt == TRY_BOTH and not promised and job.nodes == 1 and not self.exhaustive:
            quick = _NodeFirstSearch(self, job).victims()
            if quick is not _UNDECIDED:
                return quick
        candidates = self._candidate_streams(job, attempt)
        walk = _Walk(self, job, within_limit, promised, base_deltas)
        if not walk.greedy(candidates):
            return None
        return walk.pruned()

    def _own_victims_needed(self, job: RunnableJob, within_limit: bool, delta: int) -> int:
        """GPUs the job's share must give up of its own jobs before the try's quota rule can
        hold: its usage, now and as planned, plus `delta`, within its limit (or borrow cap)."""
        cap = self.ledger.usage_cap(job.share, within_limit)
        if cap is None:
            return 0
        ledger = self.ledger
        return max(ledger.usage(job.share), ledger.held_usage(job.share)) + delta - cap

    def _own_victims_may_suffice(self, job: RunnableJob, within_limit: bool, delta: int) -> bool:
        """Whether the share's usage could get within what the try allows (its limit, or its
        borrow cap) with every lower-priority job of its own as a victim. When it cannot, no
        victim set of the try works, whatever other shares give up: the search may stop before
        walking the candidates."""
        needed = self._own_victims_needed(job, within_limit, delta)
        if needed <= 0:
            return True
        if job.share not in self.candidates:
            return False
        lower = bisect_left(self._priorities[job.share], job.priority)  # lowest priority first
        gpus = self._gpus_so_far[job.share][lower - 1] if lower else 0
        for priority, taken in self._victim_gpus.get(job.share, {}).items():
            if priority < job.priority:
                gpus -= taken
        return gpus >= needed

    def own_candidates(self, job: RunnableJob, position: int = 0) -> Iterator[PlacedJob]:
        """The job's own share's jobs it may preempt in its share (strictly lower priority, not
        yet a victim), in victim order, from `position` in the share's candidates."""
        queue = self.candidates.get(job.share, ())
        for candidate in queue[position:]:
            if candidate.priority >= job.priority:
                return  # lowest priority first
            if candidate.id not in self.victims:
                yield candidate

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
        self._changes += 1
        per_node = job.gpus // job.nodes
        mine: dict[str, int] = defaultdict(int)
        for stopping in [*promised, *victims]:
            for allocation in stopping.allocations:
                if allocation.node in self.pool.ready:
                    mine[allocation.node] += len(allocation.gpu_indices)
        nodes = self.pool.tightest_with(per_node, job.nodes, mine)
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
            self._node_changed(name)

        final = dict(deltas)
        for victim in victims:
            final[victim.share] = final.get(victim.share, 0) - victim.gpus
            self.victims.add(victim.id)
            self._victim_gpus[victim.share][victim.priority] += victim.gpus
            if victim.share == job.share:
                kind, why = IN_SHARE, reasons.preempted_in_share(job.share, job.id)
            else:
                kind, why = RECLAIM, reasons.reclaimed_by(job.share, job.id)
            self.preemptions.append(Preemption(victim.id, job.id, kind, why))
        self.ledger.promise(final)
        for name in final:
            self._share_changed(name)
        self.waiting[job.id] = self._wait_reason(job, [*promised, *victims])

    def _share_changed(self, name: str) -> None:
        """After the share's usage or victims changed."""
        self._share_changes[name] += 1
        if self._room is not None:
            self._room.refresh_share(name)
        if self._heads is not None:
            self._refresh_head(name)

    def _node_changed(self, name: str) -> None:
        """After the node's free GPUs or GPUs being released changed."""
        if self._room is not None:
            self._room.refresh_node(name)

    def _reachable(self) -> _Reachable:
        if self._room is None:
            self._room = _Reachable(self)
        return self._room

    def _claim_released(self, name: str, count: int) -> None:
        rest = self.releasing[name][count:]
        if rest:
            self.releasing[name] = rest
        else:
            del self.releasing[name]
        self.pool.claim_released(name, count)

    def _wait_reason(self, job: RunnableJob, stopping: Sequence[PlacedJob]) -> str:
        if not stopping:
            return reasons.waiting_for_release(job.gpus, self.gpu_type)
        gpus = sum(victim.gpus for victim in stopping)
        others = {victim.share for victim in stopping if victim.share != job.share}
        if others:
            return reasons.reclaiming(gpus, self.gpu_type, others, len(stopping))
        return reasons.preempting_in_share(gpus, self.gpu_type, job.share, len(stopping))


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

    def __init__(self, cycle: _TypeCycle) -> None:
        self.cycle = cycle
        pool = cycle.pool
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
        for share in cycle.candidates:
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
            _count_gpus(change, victim, self.cycle.pool, -1)  # its own share is no borrower here
        if with_own:
            for victim in self.cycle.own_candidates(job):
                _count_gpus(change, victim, self.cycle.pool, +1)
        for node, gpus in change.items():
            room = self.room[node]
            nodes += (room + gpus >= need) - (room >= need)
        return nodes >= job.nodes

    def refresh_share(self, share: str) -> None:
        """After the share's usage or victims changed."""
        cycle = self.cycle
        if share not in cycle.candidates:
            return
        reached = []
        keys = []
        given_up = []
        total = 0
        all_keys = cycle._victim_keys[share, False]
        surplus = cycle.ledger.usage(share) - cycle.ledger.limit(share)
        queue = cycle.candidates[share]
        for position in range(cycle._first_untaken_position(share), len(queue)):
            if surplus <= 0:
                break
            candidate = queue[position]
            if candidate.id not in cycle.victims:
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
        ready = cycle.pool.ready
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
        cycle = self.cycle
        room = cycle.pool.base_room(node) + self.reachable.get(node, 0)
        self.nodes_with[self.room[node]] -= 1
        self.nodes_with[room] += 1
        self.room[node] = room
        self._retime(node)

    def _retime(self, node: str) -> None:
        base_room = self.cycle.pool.base_room(node)
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
            pool = self.cycle.pool
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

    def __init__(self, cycle: _TypeCycle, job: RunnableJob) -> None:
        self.cycle = cycle
        self.job = job

    def victims(self) -> list[PlacedJob] | object:
        cycle = self.cycle
        job = self.job
        need = job.gpus
        share = job.share
        pool = cycle.pool
        if cycle._capacity(need, ()).nodes:
            return _UNDECIDED
        room = cycle._reachable()

        # The share's own jobs of lower priority are candidates with their own keys; its jobs
        # that other shares' reclaims could reach are not borrowers here.
        queue = cycle.candidates.get(share, [])
        own: list[tuple[tuple, PlacedJob]] = []
        if queue:
            keys = cycle._victim_keys.get((share, True))
            if keys is None:
                keys = cycle._victim_keys[share, True] = [_victim_key(c, True) for c in queue]
            for position, candidate in enumerate(queue):
                if candidate.priority >= job.priority:
                    break
                if candidate.id not in cycle.victims:
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

        own_needed = cycle._own_victims_needed(job, True, job.gpus)
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
        trial = self.cycle.ledger.trial(self.job.share, True)
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
        cycle: _TypeCycle,
        job: RunnableJob,
        within_limit: bool,
        promised: Sequence[PlacedJob],
        base_deltas: Mapping[str, int],
    ) -> None:
        self.cycle = cycle
        self.job = job
        self.within_limit = within_limit
        self.base_deltas = base_deltas
        self.need = job.gpus // job.nodes
        self.capacity = cycle._capacity(self.need, promised)
        # GPUs stopping for the job, by node: there before any victim is chosen.
        self.promised_gpus = dict(self.capacity.extra)
        self.own_needed = cycle._own_victims_needed(
            job, within_limit, base_deltas.get(job.share, 0)
        )
        self.chosen: list[PlacedJob] = []
        self.node_counts = [self.capacity.nodes]  # nodes able to host after the first k victims
        self.node_steps: dict[str, tuple[list[int], list[int]]] = {}  # victim k, GPUs so far
        self.share_steps: dict[str, tuple[list[int], list[int]]] = {}
        # Chosen victims kept without the backward walk, last first (see _jump_to_own_victims).
        self.decided: list[int] = []

    def greedy(self, stream: _Candidates) -> bool:
        """Take candidates in victim order until the job fits; False if it never does."""
        cycle = self.cycle
        job = self.job
        candidates = cycle.candidates
        limits = cycle.ledger.limit
        pool = cycle.pool
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
            cycle._push_next(stream.heap, job, name, position + 1)
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
                if not jumped and not cycle.exhaustive:
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
        cycle = self.cycle
        job = self.job
        queue = cycle.candidates.get(job.share, [])
        position = next((entry[2] for entry in heap if entry[1] == job.share), len(queue))
        kept = _fewest_own_victims(cycle.own_candidates(job, position), own_taken, self.own_needed)
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
        if self.cycle.exhaustive:
            for index in range(end - 1, -1, -1):
                if not self._fits(index, kept):
                    kept.append(index)
            return [self.chosen[index] for index in reversed(kept)]
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
        trial = self.cycle.ledger.trial(self.job.share, self.within_limit)
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
                if allocation.node in self.cycle.pool.ready:
                    extra_nodes[allocation.node] += len(allocation.gpu_indices)
        nodes = self.node_counts[count]
        cycle = self.cycle
        for node, extra in extra_nodes.items():
            gpus = (
                cycle.pool.base_room(node)
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
