"""The victim search of DESIGN §2 ("Which victims"), written to be read.

For one runnable job that cannot be placed on free GPUs, `find_victims` answers one try:

1. TRY_BORROWERS: victims only from borrowing shares; the job's share within its limit after;
2. TRY_OWN_SHARE: victims only from the job's own share, of strictly lower priority (when the
   share has in-share preemption);
3. TRY_BOTH: both together; the job's share within its limit after.

Within a try the candidates are taken in victim order (`victim_key`), greedily, until the job
fits; then the chosen list is walked backwards, and every victim whose removal still lets the
job fit is dropped. A borrowing share gives up jobs only while it is above its limit.

"The job fits" means: enough nodes have room for one gang part each (free GPUs, GPUs being
released for anyone, GPUs stopping for the job, and the victims' GPUs), and the quota rules hold
once the victims have stopped and the job runs.

This is what `plan(snapshot, exhaustive=True)` runs. `shortcuts` gives the same answers faster.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import cached_property
from itertools import accumulate
from operator import attrgetter

from scheduler.engine.ledger import Ledger, Trial
from scheduler.engine.pool import NodePool
from scheduler.engine.snapshot import PlacedJob, RunnableJob

# The three tries of victim choice, in the order they are tried.
TRY_BORROWERS = "borrowers"
TRY_OWN_SHARE = "own_share"
TRY_BOTH = "both"


def tries(job: RunnableJob, ledger: Ledger, in_share_preemption: bool) -> list[str]:
    """The tries open to the job, in order: try 1 only if the job keeps its share within its
    limit, tries 2 and 3 only with in-share preemption."""
    open_tries = []
    if ledger.fits_limit(job.share, job.gpus):
        open_tries.append(TRY_BORROWERS)
    if in_share_preemption:
        open_tries += [TRY_OWN_SHARE, TRY_BOTH]
    return open_tries


def work_lost(job: PlacedJob, now: float) -> float:
    """GPU-seconds a preemption at `now` throws away: the job's GPUs times the time since the
    later of its start and its last checkpoint."""
    since = job.started
    if job.checkpointed is not None and job.checkpointed > since:
        since = job.checkpointed
    return job.gpus * max(0.0, now - since)


def victim_key(job: PlacedJob, own: bool, now: float) -> tuple:
    """Victim order: lowest priority first, then least work lost (`work_lost`), then jobs on
    borrowed GPUs before jobs on their share's own quota, then most recently started, then
    (try 3) other shares' jobs before the job's own share's (`own`), then later submission;
    the id makes it total."""
    return (
        job.priority,
        work_lost(job, now),
        job.borrowed == 0,
        -job.started,
        own,
        -job.submitted,
        job.id,
    )


def victim_from(job: PlacedJob, min_runtime_seconds: float) -> float:
    """When the job may first be a victim, of a reclaim or of in-share preemption: once it has
    run its share's minimum runtime."""
    return job.started + min_runtime_seconds


class Candidates:
    """The running jobs of one GPU type that a victim search may choose, by share in victim
    order, and which of them this plan has already taken as victims."""

    def __init__(self, by_share: Mapping[str, list[PlacedJob]], now: Callable[[], float]) -> None:
        self._unsorted = by_share
        self._now = now  # asked only when victims are searched for
        self.taken: set[str] = set()  # ids of this plan's victims
        # Victim keys of each share's jobs, as another share's (filled when sorting) and as the
        # job's own share's (filled on first use).
        self._keys: dict[tuple[str, bool], list[tuple]] = {}
        self._first_untaken: dict[str, int] = {}
        # Of each share's jobs by priority: their priorities, their GPUs so far (filled on
        # first use); and the GPUs taken as victims by priority.
        self._priorities: dict[str, list[int]] = {}
        self._gpus_so_far: dict[str, list[int]] = {}
        self._taken_gpus: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))

    @cached_property
    def now(self) -> float:
        return self._now()

    @cached_property
    def of(self) -> dict[str, list[PlacedJob]]:
        """Each share's running jobs in victim order, victims included; sorted on the first
        victim search only, as most plans of a busy queue search for none."""
        by_share = {}
        now = self.now
        for name, share_jobs in self._unsorted.items():
            keyed = sorted([(victim_key(job, False, now), job) for job in share_jobs])  # ids differ
            by_share[name] = [job for _, job in keyed]
            self._keys[name, False] = [key for key, _ in keyed]
        return by_share

    def has(self, share: str) -> bool:
        """Whether the share has candidates (`share in of`, without sorting them)."""
        return share in self._unsorted

    def keys(self, share: str, own: bool) -> list[tuple]:
        """The victim keys of `of[share]`, as the job's own share's jobs (`own`) or not."""
        keys = self._keys.get((share, own))
        if keys is None:
            keys = self._keys[share, own] = [
                victim_key(job, own, self.now) for job in self.of[share]
            ]
        return keys

    def first_untaken(self, share: str) -> int:
        """The position in `of[share]` of its first job not yet a victim."""
        # Victims taken by earlier searches of this plan mostly sit at the front.
        queue = self.of[share]
        position = start = self._first_untaken.get(share, 0)
        while position < len(queue) and queue[position].id in self.taken:
            position += 1
        if position != start:
            self._first_untaken[share] = position
        return position

    def own(self, job: RunnableJob, position: int = 0) -> Iterator[PlacedJob]:
        """The job's own share's jobs it may preempt in its share (strictly lower priority, not
        yet a victim), in victim order, from `position` in the share's list."""
        for candidate in self.of.get(job.share, ())[position:]:
            if candidate.priority >= job.priority:
                return  # lowest priority first
            if candidate.id not in self.taken:
                yield candidate

    def own_unordered(self, job: RunnableJob) -> Iterator[PlacedJob]:
        """The jobs of `own(job)`, in no particular order: for what does not depend on it,
        without sorting the candidates."""
        taken = self.taken
        for candidate in self._unsorted.get(job.share, ()):
            if candidate.priority < job.priority and candidate.id not in taken:
                yield candidate

    def own_gpus_below(self, job: RunnableJob) -> int:
        """The GPUs of `own(job)`, counted without walking them."""
        share = job.share
        priorities = self._priorities.get(share)
        if priorities is None:
            # By priority alone (victim order's first key), without sorting by victim order.
            by_priority = sorted(self._unsorted.get(share, ()), key=attrgetter("priority"))
            priorities = self._priorities[share] = [job.priority for job in by_priority]
            self._gpus_so_far[share] = list(accumulate(job.gpus for job in by_priority))
        lower = bisect_left(priorities, job.priority)  # lowest priority first
        gpus = self._gpus_so_far[share][lower - 1] if lower else 0
        for priority, taken in self._taken_gpus.get(share, {}).items():
            if priority < job.priority:
                gpus -= taken
        return gpus

    def take(self, victim: PlacedJob) -> None:
        self.taken.add(victim.id)
        self._taken_gpus[victim.share][victim.priority] += victim.gpus


class NodeRoom:
    """How many nodes have room for one gang part (`gpus_per_node`), counting each node's base
    room (free GPUs and GPUs being released for anyone) plus GPUs added on it (stopping for the
    job, or victims'); `add` takes negative counts to take GPUs away again."""

    def __init__(self, pool: NodePool, gpus_per_node: int, promised: Sequence[PlacedJob] = ()):
        self._pool = pool
        self._need = gpus_per_node
        self.extra: dict[str, int] = {}
        self.nodes = pool.count_room_at_least(gpus_per_node)
        for stopping in promised:
            self.add_job(stopping, 1)

    def add(self, name: str, gpus: int) -> None:
        base = self._pool.base_room(name)
        before = base + self.extra.get(name, 0)
        after = before + gpus
        self.extra[name] = after - base
        self.nodes += (after >= self._need) - (before >= self._need)

    def add_job(self, job: PlacedJob, sign: int) -> None:
        """Add (sign 1) or take away (sign -1) the job's GPUs on READY nodes."""
        for allocation in job.allocations:
            if allocation.node in self._pool.ready:
                self.add(allocation.node, sign * len(allocation.gpu_indices))


def find_victims(
    job: RunnableJob,
    attempt: str,
    ledger: Ledger,
    pool: NodePool,
    candidates: Candidates,
    promised: Sequence[PlacedJob] = (),
    base_deltas: Mapping[str, int] | None = None,
) -> list[PlacedJob] | None:
    """The victims of one try, in victim order, or None when the try cannot make the job fit.

    `promised`: jobs already stopping for this job; `base_deltas`: usage changes by share before
    any victim (the job's GPUs for its share, minus what is stopping for it)."""
    if base_deltas is None:
        base_deltas = {job.share: job.gpus}
    fit = _Fit(job, attempt != TRY_OWN_SHARE, ledger, pool, promised, base_deltas)
    chosen: list[PlacedJob] = []
    for candidate in _in_victim_order(job, attempt, candidates):
        name = candidate.share
        if name != job.share and fit.usage_after(name) <= ledger.limit(name):
            continue  # a borrowing share gives up jobs only while above its limit
        chosen.append(candidate)
        fit.change(candidate, -1)
        if fit.fits():
            break
    else:
        return None
    kept = []
    for victim in reversed(chosen):
        fit.change(victim, 1)
        if not fit.fits():
            fit.change(victim, -1)
            kept.append(victim)
    kept.reverse()
    return kept


def _in_victim_order(job: RunnableJob, attempt: str, candidates: Candidates) -> list[PlacedJob]:
    """The try's candidates not yet victims: other shares' jobs (tries 1 and 3), the job's own
    share's jobs of lower priority (tries 2 and 3)."""
    keyed: list[tuple[tuple, PlacedJob]] = []
    if attempt != TRY_OWN_SHARE:
        for name, queue in candidates.of.items():
            if name != job.share:
                keys = candidates.keys(name, False)
                keyed += [(keys[i], c) for i, c in enumerate(queue) if c.id not in candidates.taken]
    if attempt != TRY_BORROWERS and job.share in candidates.of:
        keys = candidates.keys(job.share, True)
        queue = candidates.of[job.share]
        for position, candidate in enumerate(queue):
            if candidate.priority >= job.priority:
                break  # in-share preemption takes strictly lower priority only
            if candidate.id not in candidates.taken:
                keyed.append((keys[position], candidate))
    keyed.sort(key=_first)
    return [candidate for _, candidate in keyed]


def _first(entry: tuple) -> tuple:
    return entry[0]


class _Fit:
    """Whether the job fits with the victims chosen so far (`change(victim, -1)` chooses one,
    `change(victim, 1)` gives it back)."""

    def __init__(
        self,
        job: RunnableJob,
        within_limit: bool,
        ledger: Ledger,
        pool: NodePool,
        promised: Sequence[PlacedJob],
        base_deltas: Mapping[str, int],
    ) -> None:
        self.job = job
        self.within_limit = within_limit
        self.ledger = ledger
        self.base_deltas = base_deltas
        self.room = NodeRoom(pool, job.gpus // job.nodes, promised)
        self.deltas: dict[str, int] = defaultdict(int)  # usage changes by share from victims

    def change(self, victim: PlacedJob, sign: int) -> None:
        self.deltas[victim.share] += sign * victim.gpus
        self.room.add_job(victim, -sign)

    def usage_after(self, share: str) -> int:
        """The share's planned usage once the victims so far have stopped."""
        return self.ledger.usage(share) + self.base_deltas.get(share, 0) + self.deltas[share]

    def fits(self) -> bool:
        if self.room.nodes < self.job.nodes:
            return False
        trial: Trial = self.ledger.trial(self.job.share, self.within_limit)
        for name, delta in self.base_deltas.items():
            trial.change(name, delta)
        for name, delta in self.deltas.items():
            trial.change(name, delta)
        return trial.reason() is None
