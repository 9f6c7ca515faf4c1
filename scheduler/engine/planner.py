"""`plan(snapshot)`: one scheduling cycle, DESIGN §2 as pure Python.

Each GPU type is planned on its own (quotas, nodes and victims never cross types). Per type:

1. jobs that were promised GPUs go first, so nothing takes them: jobs with victims still
   stopping for them, and jobs whose victims have just stopped (a runnable job was preempted
   for them), so the victims, back in the queue, do not take their GPUs back;
2. the within-limit pass: every job that fits within its share's limit, by priority then
   submission;
3. the borrowers' pass: the rest, FIFO or fair (lowest borrowed/weight first).

A job is placed on free GPUs if the quota rules allow it; otherwise it may wait for GPUs being
released, or search for victims (reclaim, in-share preemption) in the three tries of §2: the rule
is `victims.find_victims`, and `shortcuts` finds the same victims faster. Victims keep their GPUs
within this plan: the job waits, and the GPUs are reserved for it.

Capacity of DRAINING and DOWN nodes is not cluster capacity: it is neither in the free pool nor
placeable. Jobs still running there keep counting in their share's usage until they end.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cached_property
from operator import attrgetter

from scheduler.engine import churn, order, reasons
from scheduler.engine.collector import collector_paused
from scheduler.engine.ledger import Ledger
from scheduler.engine.pool import NodeLayout, NodePool
from scheduler.engine.shortcuts import KnownFailures, Shortcuts
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
from scheduler.engine.victims import TRY_BORROWERS as TRY_BORROWERS
from scheduler.engine.victims import TRY_BOTH as TRY_BOTH
from scheduler.engine.victims import TRY_OWN_SHARE as TRY_OWN_SHARE
from scheduler.engine.victims import Candidates, NodeRoom, find_victims, tries, victim_from

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
    with collector_paused():
        return _plan(snapshot, exhaustive)


def _plan(snapshot: Snapshot, exhaustive: bool) -> Plan:
    shares = {share.name: share for share in snapshot.shares}
    rules = _TimeRules(snapshot)
    nodes = _nodes_of(snapshot.nodes)
    sizes = nodes.sizes
    rejections: list[Rejection] = []
    jobs_by_type: dict[str, list[RunnableJob]] = defaultdict(list)
    # The jobs that runnable victims were preempted for, by type (in the same pass: few jobs
    # are such victims, and a pass of their own over a long queue would cost more).
    preempted_for: dict[str, list[str]] = defaultdict(list)
    # Long queues repeat a few shapes (share, type, size): each is judged once, to the list of
    # its type's jobs to plan (`adds`, by the list's append) or to a rejection (`rejected`).
    adds: dict[tuple[str, str, int, int], Callable[[RunnableJob], None]] = {}
    rejected: dict[tuple[str, str, int, int], str] = {}
    for job in snapshot.runnable:
        shape = _judged_shape(job)
        add = adds.get(shape)
        if add is None:
            reason = rejected.get(shape)
            if reason is None:
                reason = rejection_reason(job, shares, sizes.get(job.gpu_type))
                if reason is None:
                    add = adds[shape] = jobs_by_type[job.gpu_type].append
                else:
                    rejected[shape] = reason
            if add is None:
                rejections.append(Rejection(job.id, reason))
                continue
        add(job)
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
    waiting: dict[str, str] = {}  # every type's plan adds its own jobs
    for gpu_type in sorted(jobs_by_type):
        type_plan = _TypePlan(
            gpu_type,
            shares,
            nodes.ready[gpu_type],
            held,
            placed_by_type.get(gpu_type, []),
            jobs_by_type[gpu_type],
            preempted_for.get(gpu_type, ()),
            snapshot.borrow_order,
            waiting,
            rules,
            exhaustive,
        )
        type_plan.run()
        placements.extend(type_plan.placements)
        preemptions.extend(type_plan.preemptions)
    wake_at = min(rules.wakes) if rules.wakes else None
    return Plan(tuple(placements), tuple(preemptions), tuple(rejections), waiting, wake_at)


def latest_time(snapshot: Snapshot) -> float:
    """The latest time a snapshot holds: its `now` when it gives none."""
    placed, runnable = snapshot.placed, snapshot.runnable
    times = [
        max(map(attrgetter("started"), placed), default=0.0),
        max(map(attrgetter("submitted"), runnable), default=0.0),
    ]
    times += [job.checkpointed for job in placed if job.checkpointed is not None]
    for preempted_at in map(attrgetter("preempted_at"), runnable):
        if preempted_at:
            times.append(max(preempted_at))
    return max(times)


class _TimeRules:
    """The rules that depend on the time (victims by work lost, minimum runtime, the churn
    breaker), and the times after `now` at which they would let the plan decide otherwise
    (`Plan.wake_at`). A snapshot without its time is read for it only if a rule asks."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot
        self.churn_preemptions = snapshot.churn_preemptions
        self.churn_window = snapshot.churn_window_seconds
        self.wakes: list[float] = []

    @cached_property
    def now(self) -> float:
        snapshot = self._snapshot
        return snapshot.now if snapshot.now is not None else latest_time(snapshot)

    def clock(self) -> float:
        return self.now

    def held_off_until(self, job: RunnableJob) -> float | None:
        return churn.held_off_until(
            job.preempted_at, self.now, self.churn_preemptions, self.churn_window
        )


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


class _TypePlan:
    """The plan of one GPU type; results in `placements`, `preemptions` and `waiting` (a
    dictionary shared by the plan's GPU types). `preempted_for`: for each runnable job of this
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
        rules: _TimeRules,
        exhaustive: bool = False,
    ) -> None:
        self.gpu_type = gpu_type
        self.rules = rules
        self.exhaustive = exhaustive
        self.shares = shares
        self.borrow_order = borrow_order
        usage: dict[str, int] = defaultdict(int)
        for job in placed:
            usage[job.share] += job.gpus
        self.ledger = Ledger(gpu_type, shares, usage, nodes.capacity)

        self._snapshot_jobs = jobs
        stopping: list[PlacedJob] = []
        by_share: dict[str, list[PlacedJob]] = defaultdict(list)
        # Jobs that have not yet run their share's minimum runtime: victims from that time on.
        self.young: list[tuple[float, PlacedJob]] = []
        for job in placed:
            if job.stopping:
                stopping.append(job)
            elif job.share in shares and job.preemptible:
                # A job that is not preemptible is never a candidate victim.
                minimum = shares[job.share].min_runtime_seconds
                if minimum and victim_from(job, minimum) > rules.now:
                    self.young.append((victim_from(job, minimum), job))
                else:
                    by_share[job.share].append(job)
        self.candidates = Candidates(by_share, rules.clock)
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
        # The queue without the jobs promised GPUs (they go first, see `run`).
        self.jobs = order.by_priority(jobs, self.claimants)
        self.releasing = {name: sorted(indices) for name, indices in releasing.items()}
        self.pool = NodePool(
            nodes, held, {name: len(indices) for name, indices in self.releasing.items()}
        )
        self.shortcuts = Shortcuts(self.ledger, self.pool, self.candidates)
        self.known_failures = KnownFailures()

        self.placements: list[Placement] = []
        self.preemptions: list[Preemption] = []
        self.waiting = waiting
        # A strict-FIFO share whose first job was left waiting: why its later jobs wait.
        self._strict_shares = {name for name, share in shares.items() if share.strict_fifo}
        self._strict_blocked: dict[str, str] = {}
        self.repeats = _RepeatedWaits()

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
                    self.repeats.share_changes,
                )
            )  # fmt: skip
        else:
            self._consider_each(borrowers)
        # The shortcuts' indexes refer back to them. Dropped, this type's are freed as soon as
        # its plan is made, not at the first collection after the plan (which runs with the
        # cycle collector off), so the next GPU type's plan reuses their memory.
        self.shortcuts.close()

    def _consider_each(self, jobs: Iterable[RunnableJob]) -> None:
        """Schedule each job in turn (the next one is drawn only once this one is decided), or
        leave it waiting, for the same reason as a job of its shape when `_RepeatedWaits`
        knows it. Long queues are mostly such jobs: their step is kept to a few lookups."""
        waiting = self.waiting
        promised = self.promised
        repeats = self.repeats
        waits = repeats.waits
        share_waits = repeats.share_waits
        strict = self._strict_shares
        strict_blocked = self._strict_blocked
        rules = self.rules
        for job in jobs:
            name = job.share
            if strict:
                blocked = strict_blocked.get(name)
                if blocked is not None:
                    waiting[job.id] = blocked
                    continue
            shape = _shape(job)
            held_off = None
            if job.preempted_at:
                held_off = rules.held_off_until(job)
                if held_off is not None:
                    shape = (*shape, held_off)
            if promised and job.id in promised:
                reason = None  # always scheduled: what is stopping for it is its own
            else:
                reason = waits.get(shape)
                if reason is None and share_waits:
                    reason = share_waits.get(shape)
            if reason is not None:
                waiting[job.id] = reason
            else:
                before = repeats.changes
                outcome = self._schedule(job, held_off)
                if outcome is PLACED:
                    continue
                if not self.exhaustive and job.id not in promised:
                    if outcome is WAITS_ON_SHARE:
                        # Until the share's usage changes, its shape waits for this reason.
                        repeats.share_wait(shape, name, waiting[job.id])
                    elif repeats.changes == before:
                        # It changed nothing: until something does, its shape waits for this
                        # reason.
                        waits[shape] = waiting[job.id]
            if strict and name in strict:
                strict_blocked[name] = reasons.strict_fifo(job.id)

    # --- one job ---------------------------------------------------------------------------

    def _schedule(self, job: RunnableJob, held_off: float | None = None) -> str:
        """Place the job (PLACED), or reserve GPUs for it (waiting for releases or victims), or
        record why it waits (WAITS; WAITS_ON_SHARE: for a reason only its share's usage can
        change). `held_off`: until when the churn breaker keeps it off borrowed GPUs."""
        share = self.shares[job.share]
        limit = self.ledger.limit(job.share)
        if job.gpus > limit:
            most = self.ledger.usage_cap(job.share, within_limit=False)
            if most is not None and job.gpus > most:
                # More than its share may ever use (its limit, plus its borrow limit if it
                # borrows). It stays RUNNABLE (an admin may raise either), but say plainly why
                # it waits.
                self.waiting[job.id] = (
                    reasons.larger_than_limit(
                        job.gpus, self.gpu_type, job.share, limit, share.strategy
                    )
                    if share.strategy != LEND_AND_BORROW
                    else reasons.larger_than_borrow_limit(
                        job.gpus, self.gpu_type, job.share, limit, most - limit
                    )
                )
                return WAITS_ON_SHARE
        if not job.preemptible and not self.ledger.fits_limit(job.share, job.gpus):
            # It never borrows: it waits for its share's own GPUs.
            self.waiting[job.id] = reasons.not_preemptible(
                job.share, self.ledger.usage(job.share), limit, self.gpu_type, job.gpus
            )
            return WAITS_ON_SHARE
        if held_off is not None and not self.ledger.fits_limit(job.share, job.gpus):
            # The churn breaker: within its share's limit only, until the window has passed.
            rules = self.rules
            self.waiting[job.id] = reasons.held_off(
                churn.preemptions_within(job.preempted_at, rules.now, rules.churn_window),
                rules.churn_window,
                held_off - rules.now,
            )
            self.rules.wakes.append(held_off)
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
                self.repeats.changed()
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
            and (promised or not self.known_failures.release_wait_fails(job))
        ):
            if NodeRoom(self.pool, per_node, promised).nodes >= job.nodes:
                self._commit(job, promised, [], deltas)
                return WAITS
            if not promised:
                self.known_failures.release_wait_failed(job)

        for attempt in tries(job, self.ledger, share.in_share_preemption):
            if not promised and self.known_failures.search_fails(job, attempt):
                continue
            victims = self._search(job, attempt, promised, deltas)
            if victims is not None:
                self._commit(job, promised, victims, deltas)
                return WAITS
            if not promised:
                self.known_failures.search_failed(job, attempt)
        if self.young and self._reclaim_later(job, share.in_share_preemption, promised, deltas):
            return WAITS
        self.waiting[job.id] = reason
        return WAITS

    def _reclaim_later(
        self,
        job: RunnableJob,
        in_share_preemption: bool,
        promised: Sequence[PlacedJob],
        deltas: Mapping[str, int],
    ) -> bool:
        """No try finds victims among the jobs that have run their minimum runtime: find the
        earliest time at which one would, the younger jobs counted from the time each may be
        a victim, and reserve for the job what it will then use (its quota, so no new borrower
        takes it meanwhile, and the GPUs it will need beside its victims'). False: no time."""
        taken = self.candidates.taken
        times = sorted({at for at, young in self.young if young.id not in taken})

        def victims_at(index: int) -> list[PlacedJob] | None:
            by_share = {name: list(jobs) for name, jobs in self.candidates._unsorted.items()}
            for at, young in self.young:
                if at <= times[index] and young.id not in taken:
                    by_share.setdefault(young.share, []).append(young)
            candidates = Candidates(by_share, self.rules.clock)
            candidates.taken = taken
            for attempt in tries(job, self.ledger, in_share_preemption):
                victims = find_victims(
                    job, attempt, self.ledger, self.pool, candidates, promised, deltas
                )
                if victims is not None:
                    return victims
            return None

        if not times or victims_at(len(times) - 1) is None:
            return False
        # More jobs that may be victims never make a try fail that worked with fewer.
        low, high = 0, len(times) - 1
        while low < high:
            middle = (low + high) // 2
            if victims_at(middle) is None:
                low = middle + 1
            else:
                high = middle
        victims = victims_at(low)
        assert victims is not None
        at = max(times[low], self.rules.now)
        self.repeats.changed()
        self._reserve_nodes(job, [*promised, *victims])
        self.ledger.promise(deltas)
        for name in deltas:
            self._share_changed(name)
        gpus = sum(victim.gpus for victim in victims)
        others = {victim.share for victim in victims if victim.share != job.share}
        seconds = at - self.rules.now
        if others:
            self.waiting[job.id] = reasons.reclaiming_in(gpus, self.gpu_type, others, seconds)
        else:
            self.waiting[job.id] = reasons.preempting_in_share_in(
                gpus, self.gpu_type, job.share, seconds
            )
        self.rules.wakes.append(at)
        return True

    def _search(
        self,
        job: RunnableJob,
        attempt: str,
        promised: Sequence[PlacedJob],
        base_deltas: Mapping[str, int],
    ) -> list[PlacedJob] | None:
        """The victims of this try (`victims.find_victims`), or None when it cannot make the
        job fit; without `exhaustive`, found by the shortcuts."""
        if self.exhaustive:
            return find_victims(
                job, attempt, self.ledger, self.pool, self.candidates, promised, base_deltas
            )
        return self.shortcuts.search(job, attempt, promised, base_deltas)

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
        self.repeats.changed()
        self._reserve_nodes(job, [*promised, *victims])
        final = dict(deltas)
        for victim in victims:
            final[victim.share] = final.get(victim.share, 0) - victim.gpus
            self.candidates.take(victim)
            if victim.share == job.share:
                kind, why = IN_SHARE, reasons.preempted_in_share(job.share, job.id)
            else:
                kind, why = RECLAIM, reasons.reclaimed_by(job.share, job.id)
            self.preemptions.append(Preemption(victim.id, job.id, kind, why))
        self.ledger.promise(final)
        for name in final:
            self._share_changed(name)
        self.waiting[job.id] = self._wait_reason(job, [*promised, *victims])

    def _reserve_nodes(self, job: RunnableJob, stopping: Sequence[PlacedJob]) -> None:
        """Reserve the GPUs the job will use once `stopping` (its victims, and jobs already
        stopping for it) have stopped: theirs, then GPUs released for anyone, then free ones."""
        per_node = job.gpus // job.nodes
        mine: dict[str, int] = defaultdict(int)
        for stopping_job in stopping:
            for allocation in stopping_job.allocations:
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

    def _share_changed(self, name: str) -> None:
        """After the share's usage or victims changed."""
        self.repeats.share_changed(name)
        self.shortcuts.share_changed(name)

    def _node_changed(self, name: str) -> None:
        """After the node's free GPUs or GPUs being released changed."""
        self.shortcuts.node_changed(name)

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


class _RepeatedWaits:
    """What lets a long queue's repeated shapes (share, size, node count, priority, whether
    preemptible, and a churn hold's end) wait without being scheduled again: a job of the same
    shape as one left waiting waits for the same reason while the plan has placed or committed
    nothing since (`waits`, emptied by `changed`), or, for a reason only its share's usage can
    change (WAITS_ON_SHARE), while that share's usage has not changed (`share_waits`, a
    share's emptied by `share_changed`). A shape is in at most one of the two: it is scheduled
    again only when neither knows it."""

    def __init__(self) -> None:
        self.changes = 0  # bumped whenever the plan places a job or commits a wait
        self.share_changes: dict[str, int] = defaultdict(int)  # the fair order reads these
        self.waits: dict[tuple, str] = {}
        self.share_waits: dict[tuple, str] = {}
        self._share_waits_of: dict[str, list[tuple]] = defaultdict(list)

    def changed(self) -> None:
        """The plan placed a job or committed a wait."""
        self.changes += 1
        self.waits.clear()  # in place: `_consider_each` holds the dictionary

    def share_changed(self, name: str) -> None:
        """The share's usage or victims changed (always with `changed`)."""
        self.share_changes[name] += 1
        for shape in self._share_waits_of.pop(name, ()):
            self.share_waits.pop(shape, None)

    def share_wait(self, shape: tuple, share: str, reason: str) -> None:
        self.share_waits[shape] = reason
        self._share_waits_of[share].append(shape)


# What decides whether a job is rejected (`rejection_reason`), besides the shares and nodes.
_judged_shape = attrgetter("share", "gpu_type", "gpus", "nodes")
# A waiting job's shape for `_RepeatedWaits` (with its churn hold's end, if it has one).
_shape = attrgetter("share", "gpus", "nodes", "priority", "preemptible")
