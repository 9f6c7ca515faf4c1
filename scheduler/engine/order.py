"""The queue order of DESIGN §2: which runnable job the engine considers next.

Per GPU type, in three passes:

1. jobs promised GPUs (victims were preempted for them, and are stopping or back in the
   queue): they go first, so nothing takes what was freed for them;
2. the within-limit pass: every job that fits within its share's limit when its turn comes;
3. the borrowers' pass: the rest, FIFO (as they came) or fair (the share with the lowest
   borrowed/weight first).

Each pass goes by priority (higher first), then submission time, then place in the snapshot.
A strict-FIFO share's job that goes to the borrowers' pass takes every later job of its share
with it, so none of them is ever considered ahead of it.

The planner draws its passes from these generators as it plans, so "fits within its limit" and
"borrowed/weight" are judged against the usage as planned so far. `queue_order` draws the same
passes for people (the API's queue, the dashboards' queue page) as if each job ahead were
admitted in turn: it is the engine's order whenever the jobs ahead do start.
"""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from operator import attrgetter

from scheduler.engine.snapshot import FAIR, RunnableJob, ShareView, Snapshot

PROMISED = "promised"
WITHIN_LIMIT = "within_limit"
BORROWING = "borrowing"
PASSES = (PROMISED, WITHIN_LIMIT, BORROWING)


def claimants(jobs: Sequence[RunnableJob], asked_for: set[str | None]) -> dict[str, int]:
    """The jobs promised GPUs among `jobs` (one GPU type's queue, in snapshot order): those whose
    id is in `asked_for` (the `preempted_for` of stopping jobs and of requeued victims), with
    their places in `jobs`. One pass over the queue, made only when some job is asked for."""
    asked_for = asked_for - {None}
    if not asked_for:
        return {}
    ids = list(map(attrgetter("id"), jobs))
    return {
        ids[place]: place
        for place in itertools.compress(itertools.count(), map(asked_for.__contains__, ids))
    }


def promised_first(jobs: Sequence[RunnableJob], claimed: Mapping[str, int]) -> list[RunnableJob]:
    """Pass 1: the jobs promised GPUs, by priority (higher first), submission, then place."""
    places = sorted(
        claimed.values(), key=lambda place: (-jobs[place].priority, jobs[place].submitted, place)
    )
    return [jobs[place] for place in places]


def by_priority(jobs: Sequence[RunnableJob], claimed: Mapping[str, int]) -> list[RunnableJob]:
    """The queue without the jobs promised GPUs, by priority (higher first), then submission,
    then place: two stable sorts on plain numbers, much cheaper than one sort on tuples. Jobs
    promised GPUs are left out by place, not by id, so the pass reads no job's id."""
    queue: Iterable[RunnableJob] = jobs
    if claimed:
        kept = bytearray(b"\x01") * len(jobs)
        for place in claimed.values():
            kept[place] = 0
        queue = itertools.compress(jobs, kept)
    ordered = sorted(queue, key=attrgetter("submitted"))
    ordered.sort(key=attrgetter("priority"), reverse=True)
    return ordered


def within_limit_first(
    queue: Iterable[RunnableJob],
    shares: Mapping[str, ShareView],
    limits: Mapping[str, int],
    planned: Mapping[str, int],
    held: Mapping[str, int],
    borrowers: list[RunnableJob],
) -> Iterator[RunnableJob]:
    """Pass 2: the jobs of `queue` that fit their share's limit when their turn comes (usage
    both `planned`, once victims have stopped, and `held` now), in queue order; the others,
    the borrowers, are appended to `borrowers` for pass 3, in queue order. The caller keeps
    `planned` and `held` current between two jobs."""
    strict_deferred: set[str] = set()
    for job in queue:
        name = job.share
        share = shares[name]
        if share.strict_fifo and name in strict_deferred:
            borrowers.append(job)  # strict FIFO: never ahead of an earlier job of its share
            continue
        limit = limits[name]
        if planned[name] + job.gpus <= limit and held[name] + job.gpus <= limit:
            yield job
        else:
            borrowers.append(job)
            if share.strict_fifo:
                strict_deferred.add(name)


def borrow_ratio(usage: int, limit: int, weight: float) -> float:
    """What the fair order compares: GPUs borrowed per unit of weight (no weight: last)."""
    if weight <= 0:
        return float("inf")
    borrowed = usage - limit
    return borrowed / weight if borrowed > 0 else 0.0


def fair_order(
    borrowers: Sequence[RunnableJob],
    shares: Mapping[str, ShareView],
    limits: Mapping[str, int],
    usage: Mapping[str, int],
    changes: Mapping[str, int],
) -> Iterator[RunnableJob]:
    """Pass 3 with borrow_order `fair`: borrowers in turn of their share's borrowed/weight,
    lowest first, as it is when each turn comes (`usage`, which the caller keeps current, and
    `changes`, a count per share that the caller bumps whenever the share's usage changes);
    ties by place in `borrowers`, which is already in priority then submission order."""
    queues: dict[str, list[tuple[int, RunnableJob]]] = defaultdict(list)
    for position, job in enumerate(borrowers):
        queues[job.share].append((position, job))
    limit_of = {name: limits[name] for name in queues}
    weights = {name: shares[name].weight for name in queues}

    def ratio(name: str) -> float:
        return borrow_ratio(usage[name], limit_of[name], weights[name])

    heads = dict.fromkeys(queues, 0)
    heap = [(ratio(name), queue[0][0], name) for name, queue in queues.items()]
    heapq.heapify(heap)
    turn = heapq.heappop(heap) if heap else None
    while turn is not None:
        key, position, name = turn
        current = ratio(name)
        if current != key:  # the share's borrowing changed since it was queued
            turn = heapq.heappushpop(heap, (current, position, name))
            continue
        queue = queues[name]
        head = heads[name]
        turn = None
        seen = changes[name]
        while True:
            yield queue[head][1]
            head += 1
            if head == len(queue):
                break
            if changes[name] != seen:  # its usage changed: so may its ratio
                seen = changes[name]
                current = ratio(name)
            position = queue[head][0]
            if heap:
                # Whether (current, position, name) comes after the first of the others;
                # positions differ, so names never decide.
                top_ratio, top_position, _ = heap[0]
                if top_ratio < current or (top_ratio == current and top_position < position):
                    # Another share's turn: one sift, not two.
                    turn = heapq.heapreplace(heap, (current, position, name))
                    break
        heads[name] = head
        if turn is None and heap:
            turn = heapq.heappop(heap)


@dataclass(frozen=True, slots=True)
class QueuePosition:
    """A runnable job's place in the engine's order: its pass, and its position (1 = next)
    across every GPU type."""

    position: int
    job: RunnableJob
    pass_: str


def queue_order(snapshot: Snapshot) -> list[QueuePosition]:
    """Every runnable job of `snapshot` in the order the engine considers it, as if each job
    ahead were admitted in turn. GPU types are planned apart; here they are merged pass by pass
    (promised, within limit, borrowers), each pass by its own order: priority then submission,
    or, for fair borrowers, borrowed/weight when their turn comes (it never falls: admitting a
    borrower only raises its share's)."""
    shares = {share.name: share for share in snapshot.shares}
    by_type: dict[str, list[RunnableJob]] = defaultdict(list)
    for job in snapshot.runnable:
        if job.share in shares:
            by_type[job.gpu_type].append(job)
    usage: dict[str, dict[str, int]] = {gpu_type: defaultdict(int) for gpu_type in by_type}
    asked_for: dict[str, set[str | None]] = defaultdict(set)
    for placed in snapshot.placed:
        if placed.gpu_type in usage:
            usage[placed.gpu_type][placed.share] += placed.gpus
            if placed.stopping:
                asked_for[placed.gpu_type].add(placed.preempted_for)
    for jobs in by_type.values():
        for job in jobs:
            asked_for[job.gpu_type].add(job.preempted_for)

    passes: dict[str, list[list[tuple[tuple, RunnableJob]]]] = {name: [] for name in PASSES}
    for gpu_type, jobs in sorted(by_type.items()):
        used = usage[gpu_type]
        limits = {name: share.capacity_limits.get(gpu_type, 0) for name, share in shares.items()}
        claimed = claimants(jobs, asked_for[gpu_type])
        promised = promised_first(jobs, claimed)
        for job in promised:
            used[job.share] += job.gpus
        place = {id(job): n for n, job in enumerate(jobs)}

        def fifo_key(job: RunnableJob, place=place) -> tuple:
            return (-job.priority, job.submitted, place[id(job)])

        passes[PROMISED].append([(fifo_key(job), job) for job in promised])
        within: list[tuple[tuple, RunnableJob]] = []
        borrowers: list[RunnableJob] = []
        for job in within_limit_first(
            by_priority(jobs, claimed), shares, limits, used, used, borrowers
        ):
            used[job.share] += job.gpus
            within.append((fifo_key(job), job))
        passes[WITHIN_LIMIT].append(within)
        if snapshot.borrow_order == FAIR:
            changes: dict[str, int] = defaultdict(int)
            turns = []
            for job in fair_order(borrowers, shares, limits, used, changes):
                ratio = borrow_ratio(used[job.share], limits[job.share], shares[job.share].weight)
                turns.append(((ratio, *fifo_key(job)), job))
                used[job.share] += job.gpus
                changes[job.share] += 1
            passes[BORROWING].append(turns)
        else:
            passes[BORROWING].append([(fifo_key(job), job) for job in borrowers])

    order: list[QueuePosition] = []
    for name in PASSES:
        for _key, job in heapq.merge(*passes[name], key=lambda entry: entry[0]):
            order.append(QueuePosition(len(order) + 1, job, name))
    return order
