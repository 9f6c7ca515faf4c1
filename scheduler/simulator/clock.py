"""Replay a scenario through the engine on a simulated clock.

One heap of timed events. At each instant: finishes and releases first, then share changes, then
submits, then one engine cycle (DESIGN §4). With `grace_seconds: 0` the victims' GPUs are free at
the same instant, so a second cycle runs at once and the reclaiming job starts without waiting.
With a `resolution` (the estimates, which must see far ahead within a time budget), the instants
within that part of the clock's time after the first share one cycle, at the last of them.

What makes 100,000 jobs fast is calling the engine only when it could decide something, with only
the jobs it could decide about, for a result equal to sending every job to every cycle (the
`full_snapshots` mode, which tests compare against):

- placed and runnable jobs are kept as ready-made engine views, updated only when a job moves;
- a GPU type where nothing happened since its last cycle (no GPUs freed, no change, no new job,
  and that cycle decided nothing) is left out: the same snapshot gives the same plan;
- of the others, a waiting job the engine could only leave waiting, whatever the jobs before it
  do in this cycle, is left out (`_may_be_decided`); a cycle with no job left is not run;
- at the end, one full cycle gives the jobs still waiting their reasons.

And what a cycle costs the engine, whatever its size, is cut: it gets the GPUs held on each
node as kept here, and the same tuple of nodes every time, so it keeps what it derives from
them (`full_snapshots` sends neither: the engine works everything out, as in production).
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from itertools import compress
from typing import Any

from scheduler.engine import accounting, churn, outcomes
from scheduler.engine import plan as engine_plan
from scheduler.engine.collector import collector_paused
from scheduler.engine.ledger import Ledger
from scheduler.engine.planner import NodeSizes, rejection_reason
from scheduler.engine.snapshot import (
    DISABLED,
    FAIR,
    READY,
    Allocation,
    NodeView,
    PlacedJob,
    Plan,
    RunnableJob,
    ShareView,
    Snapshot,
)
from scheduler.engine.victims import victim_from
from scheduler.simulator.scenario import JobSpec, Scenario, ShareChange, share_with

# Job states as in DESIGN §2 (the simulator skips SCHEDULED/STARTING: a placed job runs at once).
SUBMITTED = "SUBMITTED"
RUNNABLE = "RUNNABLE"
RUNNING = "RUNNING"
PREEMPTING = "PREEMPTING"
SUCCEEDED = "SUCCEEDED"
FAILED = "FAILED"

# Event kinds, in the order they are handled within one instant.
_RELEASE = 0  # a finish, or the end of a preempted job's grace period
_CHANGE = 1
_SUBMIT = 2
_WAKE = 3  # a time a rule of time may decide otherwise in a GPU type (`Simulation._wake_at`)

# A cycle whose plan frees GPUs at once (grace 0) is followed by another at the same instant;
# an engine that kept doing that would never let the clock move.
MAX_CYCLES_PER_INSTANT = 1000

SHARE_DISABLED = "share {share} is DISABLED: it accepts no new jobs"
NOT_DIVISIBLE = "{gpus} GPUs cannot be spread evenly over {nodes} nodes"

Engine = Callable[[Snapshot], Plan]


class EngineContractError(RuntimeError):
    """The engine returned a plan that cannot be applied (e.g. a GPU given twice)."""


class SkippedDecisionError(RuntimeError):
    """A cycle the simulator left out (or a job it left out of one) would have decided
    something: the fast path no longer gives the result of full snapshots."""


@dataclass(slots=True)
class SimJob:
    """A job's life in the simulation."""

    spec: JobSpec
    state: str = SUBMITTED
    work_done: float = 0.0  # checkpointed work, in seconds
    run_start: float = 0.0
    attempt: int = 0  # bumps at each preemption, so a stale finish event is ignored
    started: float | None = None
    finished: float | None = None
    preemptions: int = 0
    reason: str | None = None
    borrowed: int = 0
    node_names: tuple[str, ...] = ()
    fail_on_release: bool = False
    preempted_at: tuple[float, ...] = ()  # when it was preempted, for the churn breaker


class _Kinds:
    """The waiting jobs of one GPU type by kind, (share, GPUs, nodes, priority): what
    `Simulation._hopeless` judges. Each job's kind number sits in `of`, in the queue's order,
    so a filter by kind costs no Python step per job. Kind ALWAYS: sent to every cycle (jobs
    promised GPUs, victims back in the queue)."""

    ALWAYS = 0

    def __init__(self) -> None:
        self.of: dict[str, int] = {}  # job id -> kind, in queue order
        self.queued: Counter[int] = Counter()  # kind -> jobs of that kind waiting

    def add(self, job_id: str, kind: int) -> None:
        self.of[job_id] = kind
        self.queued[kind] += 1

    def remove(self, job_id: str) -> None:
        kind = self.of.pop(job_id)
        self.queued[kind] -= 1
        if not self.queued[kind]:
            del self.queued[kind]

    def change(self, job_id: str, kind: int) -> None:
        """The job's kind changes; it keeps its place in the queue."""
        old = self.of[job_id]
        if old != kind:
            self.queued[old] -= 1
            if not self.queued[old]:
                del self.queued[old]
            self.of[job_id] = kind
            self.queued[kind] += 1


@dataclass
class _Verdicts:
    """Which kinds of waiting jobs of one GPU type are hopeless (`Simulation._hopeless`), by
    (share, GPUs, nodes, priority), worked out as needed; valid while `moves` is the type's."""

    moves: int
    ledger: Ledger | None = None
    room: list[int] | None = None  # room[g]: nodes with g GPUs free or being released
    hopeless: dict[tuple[str, int, int, int], bool] = field(default_factory=dict)


@dataclass
class SimulationResult:
    """The result JSON of DESIGN §4 (`data`) and, when asked for, GPU use over time."""

    data: dict[str, Any]
    share_names: tuple[str, ...]
    # (t, own GPUs per share, borrowed GPUs per share, lent GPUs per share), from t onwards.
    series: list[tuple[float, tuple[float, ...], tuple[float, ...], tuple[float, ...]]] = field(
        default_factory=list
    )


class Simulation:
    """One run of one scenario. `run()` once, then read the result."""

    def __init__(
        self,
        scenario: Scenario,
        *,
        engine: Engine | None = None,
        record_series: bool = False,
        full_snapshots: bool = False,
        resolution: float = 0.0,
    ) -> None:
        self.engine = engine_plan if engine is None else engine
        # 0: a cycle at every instant something happens. Above 0 (the estimates), the instants
        # up to `resolution` × the clock's time after the first one share one cycle, at the last
        # of them: the further ahead, the coarser the replay (`run`).
        self.resolution = resolution
        self.scenario = scenario
        self.record_series = record_series
        # Set to a dictionary, it gets each job's first start: when, and on which GPUs (the
        # estimates).
        self.first_starts: dict[str, tuple[float, tuple[Allocation, ...]]] | None = None
        self.full_snapshots = full_snapshots
        self.nodes = scenario.nodes
        self.node_gpus = {n.name: n.gpus for n in scenario.nodes}
        self.shares: dict[str, ShareView] = {s.name: s for s in scenario.shares}
        self.share_names = tuple(self.shares)
        self.share_index = {name: i for i, name in enumerate(self.share_names)}
        self.gpu_types = tuple(sorted({n.gpu_type for n in scenario.nodes}))
        self.cluster_gpus = {t: 0 for t in self.gpu_types}
        for node in scenario.nodes:
            self.cluster_gpus[node.gpu_type] += node.gpus
        self.total_gpus = sum(self.cluster_gpus.values())
        self.ready_gpus = {t: 0 for t in self.gpu_types}  # the engine's capacity of each type
        for node in scenario.nodes:
            if node.state == READY:
                self.ready_gpus[node.gpu_type] += node.gpus

        self.jobs: dict[str, SimJob] = {spec.id: SimJob(spec) for spec in scenario.jobs}
        self.events: list[dict[str, Any]] = []
        self.placed: dict[str, PlacedJob] = {}
        self.placed_by_type: dict[str, dict[str, PlacedJob]] = {t: {} for t in self.gpu_types}
        self.nodes_by_type: dict[str, tuple[NodeView, ...]] = {
            t: tuple(n for n in scenario.nodes if n.gpu_type == t) for t in self.gpu_types
        }
        self.node_sizes = {t: NodeSizes(nodes) for t, nodes in self.nodes_by_type.items()}
        self._nodes_of_types: dict[tuple[str, ...], tuple[NodeView, ...]] = {}
        self.ready_nodes = {
            t: [(n.name, n.gpus) for n in nodes if n.state == READY]
            for t, nodes in self.nodes_by_type.items()
        }
        self.stopping: dict[str, dict[str, PlacedJob]] = {t: {} for t in self.gpu_types}
        # GPUs of the running (not stopping) jobs of each (share, GPU type) by priority: what
        # in-share preemption could take for a job of higher priority.
        self.running_gpus: dict[tuple[str, str], dict[int, int]] = {}
        self.runnable: dict[str, dict[str, RunnableJob]] = {}  # by GPU type
        self.kinds: dict[str, _Kinds] = {t: _Kinds() for t in self.gpu_types}
        # (GPU type, share, GPUs, nodes, priority) -> kind number, and a job of each kind.
        self._kind_numbers: dict[tuple[str, str, int, int, int], int] = {}
        self._kind_examples: list[RunnableJob | None] = [None]
        self.used_gpus: dict[str, int] = {n.name: 0 for n in scenario.nodes}  # bit mask per node
        self.usage: dict[tuple[str, str], int] = {}  # (share, GPU type) -> GPUs held
        self.promised: dict[str, int] = {}  # reclaiming job -> victims still stopping
        # Reclaiming job -> its victims back in the queue, until it starts: their views carry
        # `preempted_for` so the engine keeps the GPUs they released for it.
        self.claims: dict[str, set[str]] = {}
        self.unsettled: set[str] = set(self.gpu_types)
        # Bumped for a GPU type whenever a job starts, stops, ends or is rejected there, or a
        # share changes: the verdicts of `_hopeless` hold while it stays the same.
        self.moves: dict[str, int] = dict.fromkeys(self.gpu_types, 0)
        self._verdicts: dict[str, _Verdicts] = {}
        # Whether the engine would reject a job of this (share, GPU type, GPUs, nodes), until a
        # share changes.
        self._rejected: dict[tuple[str, str, int, int], bool] = {}

        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self._now = 0.0
        self.replayed = math.inf  # how far `run` took the clock, when it stopped early
        self._wakes: set[tuple[float, str]] = set()  # the _WAKE events in the heap
        # (time, job id, attempt) of each running job's next checkpoint, for the work a
        # preemption loses (PlacedJob.checkpointed), brought up to date as snapshots are made.
        self._checkpoints: list[tuple[float, str, int]] = []
        self._used_rate = [0.0] * len(self.share_names)
        self._borrowed_rate = [0.0] * len(self.share_names)
        self._lent_rate = [0.0] * len(self.share_names)
        self._used_seconds = [0.0] * len(self.share_names)
        self._borrowed_seconds = [0.0] * len(self.share_names)
        self._lent_seconds = [0.0] * len(self.share_names)
        self._share_preemptions = [0] * len(self.share_names)
        # Whether usage or a share changed since the rates were last worked out.
        self._rates_stale = True
        self._last_release: float | None = None
        self.series: list[
            tuple[float, tuple[float, ...], tuple[float, ...], tuple[float, ...]]
        ] = []

        for spec in scenario.jobs:
            self._push(spec.submit, _SUBMIT, spec.id)
        for change in scenario.changes:
            self._push(change.at, _CHANGE, change)
        self._refresh_snapshot_parts()

    # ---- the clock -------------------------------------------------------------------------

    def run(self, *, until: float | None = None, deadline: float | None = None) -> SimulationResult:
        """Replay everything, or only the instants up to `until`, or those replayed before
        `deadline` (a `time.perf_counter()` value): then the jobs still waiting keep the
        reasons of their last cycle, and `replayed` says how far the clock got."""
        heap = self._heap
        while heap:
            now = heap[0][0]
            if (until is not None and now > until) or (
                deadline is not None and time.perf_counter() > deadline
            ):
                self.replayed = self._now
                return self._result()
            # The instants whose events the next cycle plans on: `now`'s alone, or with a
            # `resolution`, those up to the window's end (and the cycle runs at the last).
            last = now + self.resolution * now if self.resolution > 0 else now
            if until is not None:
                last = min(last, until)
            dirty: set[str] = set(self.unsettled)
            while heap and heap[0][0] <= last:
                if heap[0][0] != now and self._rates_stale:
                    self._update_rates(now)  # what the instant before changed
                now = heap[0][0]
                self._integrate_to(now)
                while heap and heap[0][0] == now:
                    self._happen(now, *heapq.heappop(heap)[1::2], dirty)
            self._cycles(now, dirty)
            if self._rates_stale:
                self._update_rates(now)
        if not self.full_snapshots:
            self._final_reasons()
        return self._result()

    def _happen(self, now: float, kind: int, payload: Any, dirty: set[str]) -> None:
        """One event of the instant `now`; the GPU types it touched join `dirty`."""
        if kind == _RELEASE:
            job_id, attempt = payload
            gpu_type = self._release(now, job_id, attempt)
            if gpu_type is not None:
                dirty.add(gpu_type)
        elif kind == _CHANGE:
            self._apply_change(payload)
            dirty.update(self.gpu_types)
        elif kind == _WAKE:
            self._wakes.discard((now, payload))
            dirty.add(payload)
        else:
            gpu_type = self._submit(now, payload)
            if gpu_type is not None:
                dirty.add(gpu_type)

    def seed_placed(self, view: PlacedJob, spec: JobSpec, remaining: float) -> None:
        """Before `run`: the job `spec` (not among the scenario's jobs) already holds its GPUs
        when the clock starts, as `view` says (times on the simulated clock, so its start may
        be before 0): a running job finishes after `remaining` seconds, a stopping one (its
        preemption ordered) releases its GPUs then and returns to the queue with `spec`'s
        duration as its work."""
        job = self.jobs[spec.id] = SimJob(spec, started=view.started)
        job.node_names = tuple(a.node for a in view.allocations)
        job.borrowed = view.borrowed
        self.placed[spec.id] = self.placed_by_type[spec.gpu_type][spec.id] = view
        for allocation in view.allocations:
            for index in allocation.gpu_indices:
                self.used_gpus[allocation.node] |= 1 << index
        key = (spec.share, spec.gpu_type)
        self.usage[key] = self.usage.get(key, 0) + spec.gpus
        if view.stopping:
            job.state = PREEMPTING
            self.stopping[spec.gpu_type][spec.id] = view
            if view.preempted_for is not None:
                self.promised[view.preempted_for] = self.promised.get(view.preempted_for, 0) + 1
        else:
            job.state = RUNNING
            job.work_done = max(0.0, spec.duration - remaining)
            self._count_running(view, +1)
            self._victim_from(view)
        self._rates_stale = True
        self._push(remaining, _RELEASE, (spec.id, job.attempt))

    def preempted_before(self, job_id: str, times: tuple[float, ...]) -> None:
        """Before `run`: the waiting job `job_id` was preempted at `times` (on the simulated
        clock, before 0), which the churn breaker counts."""
        job = self.jobs[job_id]
        job.preempted_at = times
        self._hold_ends(job)

    def _wake_at(self, t: float, gpu_type: str) -> None:
        """A cycle of `gpu_type` at `t`, when a rule of time lets the engine decide otherwise
        there: a running job reaches its share's minimum runtime (it may be a victim from then
        on), or a job's churn hold ends. Every such time is an instant, whichever jobs the
        cycles before it were sent, not only the earliest one a plan names (`Plan.wake_at`,
        which depends on the jobs it was given): so the fast path and full snapshots plan at
        the same instants."""
        if t > self._now and (t, gpu_type) not in self._wakes:
            self._wakes.add((t, gpu_type))
            self._push(t, _WAKE, gpu_type)

    def _victim_from(self, view: PlacedJob) -> None:
        """A wake when the running job reaches its share's minimum runtime."""
        minimum = self.shares[view.share].min_runtime_seconds
        if minimum and view.preemptible:
            self._wake_at(victim_from(view, minimum), view.gpu_type)

    def _hold_ends(self, job: SimJob) -> None:
        """A wake when the job's churn hold ends, if it is held off now."""
        scenario = self.scenario
        until = churn.held_off_until(
            job.preempted_at, self._now, scenario.churn_preemptions,
            scenario.churn_window_seconds,
        )  # fmt: skip
        if until is not None:
            self._wake_at(until, job.spec.gpu_type)

    def _push(self, t: float, kind: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, kind, self._seq, payload))

    # ---- what happens to jobs ---------------------------------------------------------------

    def _submit(self, now: float, job_id: str) -> str | None:
        """The job joins its GPU type's queue (the type it returns), or is refused at once."""
        job = self.jobs[job_id]
        spec = job.spec
        # The portal refuses these at submission, before any cycle sees the job.
        if self.shares[spec.share].state == DISABLED:
            self._reject(now, job, SHARE_DISABLED.format(share=spec.share))
            return None
        if spec.gpus % spec.nodes:
            self._reject(now, job, NOT_DIVISIBLE.format(gpus=spec.gpus, nodes=spec.nodes))
            return None
        if spec.gpu_type not in self.node_sizes:
            # No node of the type: the engine would reject it (DESIGN §2), but the cycles here
            # are per GPU type of the nodes, so none would see it. Same reason as the engine's.
            reason = rejection_reason(self._view(job), self.shares, None)
            assert reason is not None  # with no node sizes, every job has a reason
            self._reject(now, job, reason)
            return None
        job.state = RUNNABLE
        self._enqueue(job)
        return spec.gpu_type

    def _enqueue(self, job: SimJob, preempted_for: str | None = None) -> None:
        spec = job.spec
        view = self._view(job, preempted_for)
        self.runnable.setdefault(spec.gpu_type, {})[spec.id] = view
        kinds = self.kinds.setdefault(spec.gpu_type, _Kinds())
        if preempted_for is not None:
            self.claims.setdefault(preempted_for, set()).add(spec.id)
            kinds.add(spec.id, _Kinds.ALWAYS)
        else:
            kinds.add(spec.id, self._kind(view))

    def _view(self, job: SimJob, preempted_for: str | None = None) -> RunnableJob:
        """The job as the engine takes a runnable job."""
        spec = job.spec
        return RunnableJob(
            id=spec.id,
            share=spec.share,
            gpu_type=spec.gpu_type,
            gpus=spec.gpus,
            nodes=spec.nodes,
            priority=spec.priority,
            submitted=spec.submit,
            preempted_for=preempted_for,
            preemptible=spec.preemptible,
            preempted_at=job.preempted_at[-self.scenario.churn_preemptions :]
            if self.scenario.churn_preemptions
            else (),
        )

    def _kind(self, view: RunnableJob) -> int:
        key = (view.gpu_type, view.share, view.gpus, view.nodes, view.priority)
        kind = self._kind_numbers.get(key)
        if kind is None:
            kind = self._kind_numbers[key] = len(self._kind_examples)
            self._kind_examples.append(view)
        return kind

    def _dequeue(self, job: SimJob) -> None:
        view = self.runnable[job.spec.gpu_type].pop(job.spec.id)
        self.kinds[job.spec.gpu_type].remove(job.spec.id)
        if view.preempted_for is not None:
            victims = self.claims[view.preempted_for]
            victims.discard(view.id)
            if not victims:
                del self.claims[view.preempted_for]

    def _drop_claim(self, job_id: str) -> None:
        """The job started: the GPUs its victims released are no longer promised to it."""
        for victim_id in self.claims.pop(job_id, ()):
            victim = self.jobs[victim_id]
            queue = self.runnable[victim.spec.gpu_type]
            view = queue[victim_id] = replace(queue[victim_id], preempted_for=None)
            if victim_id not in self.promised:
                self.kinds[victim.spec.gpu_type].change(victim_id, self._kind(view))

    def _reject(self, now: float, job: SimJob, reason: str) -> None:
        job.state = FAILED
        job.finished = now
        job.reason = reason
        self._event(now, job, "reject", (), 0)

    def _release(self, now: float, job_id: str, attempt: int) -> str | None:
        """A job's GPUs come free: it finished, or its grace period after a preemption ended."""
        job = self.jobs[job_id]
        if job.attempt != attempt:
            return None  # the finish of a run that was preempted
        spec = job.spec
        placed = self.placed.pop(job_id)
        del self.placed_by_type[spec.gpu_type][job_id]
        self.moves[spec.gpu_type] += 1
        if placed.stopping:
            del self.stopping[spec.gpu_type][job_id]
        else:
            self._count_running(placed, -1)
        for allocation in placed.allocations:
            mask = 0
            for index in allocation.gpu_indices:
                mask |= 1 << index
            self.used_gpus[allocation.node] &= ~mask
        self.usage[spec.share, spec.gpu_type] -= spec.gpus
        self._rates_stale = True
        self._last_release = now
        if job.state == RUNNING:
            job.state = SUCCEEDED
            job.finished = now
            job.reason = None
            self._event(now, job, "finish", job.node_names, job.borrowed)
        else:  # PREEMPTING: its grace period is over
            if placed.preempted_for is not None:
                left = self.promised[placed.preempted_for] - 1
                if left:
                    self.promised[placed.preempted_for] = left
                else:
                    del self.promised[placed.preempted_for]
            job.attempt += 1
            if job.fail_on_release:
                job.state = FAILED
                job.finished = now
                self._event(now, job, "fail", job.node_names, job.borrowed)
            else:
                job.state = RUNNABLE
                # Its GPUs stay promised to the job it was preempted for (DESIGN §2).
                self._enqueue(job, placed.preempted_for)
        return spec.gpu_type

    def _apply_change(self, change: ShareChange) -> None:
        self.shares[change.share] = share_with(self.shares[change.share], change.fields)
        if "min_runtime_seconds" in change.fields:
            for view in self.placed.values():
                if view.share == change.share and not view.stopping:
                    self._victim_from(view)
        self._refresh_snapshot_parts()
        self._rates_stale = True  # what is borrowed and lent
        self._rejected.clear()
        for gpu_type in self.gpu_types:
            self.moves[gpu_type] += 1

    def _refresh_snapshot_parts(self) -> None:
        self._share_views = tuple(self.shares.values())
        # Per GPU type, each share's (limit, most idle GPUs it lends): what the rates read.
        self._lending_terms = {
            gpu_type: [
                (share.capacity_limits.get(gpu_type, 0), accounting.lend_cap(share, gpu_type))
                for share in self._share_views
            ]
            for gpu_type in self.gpu_types
        }

    # ---- cycles -----------------------------------------------------------------------------

    def _cycles(self, now: float, dirty: set[str]) -> None:
        """The engine cycles of one instant, for the GPU types in `dirty` (something happened
        there since their last cycle, or that cycle decided something)."""
        for _ in range(MAX_CYCLES_PER_INSTANT):
            snapshot = self._snapshot(dirty)
            if snapshot is None:
                acted: set[str] = set()
                break
            plan = self.engine(snapshot)
            acted, freed = self._apply(now, plan)
            acted |= self._searching(snapshot, plan)
            if not freed:
                break
            # Grace 0: the victims' GPUs are free now, so the reclaimer can start at this instant,
            # and what else the last plan did is planned on at once, as a full snapshot would.
            dirty = freed | acted
        else:
            raise EngineContractError(
                f"t={now}: more than {MAX_CYCLES_PER_INSTANT} cycles at one instant "
                "(the engine keeps preempting with grace 0)"
            )
        self.unsettled = acted

    def _searching(self, snapshot: Snapshot, plan: Plan) -> set[str]:
        """The GPU types where a job left waiting may have searched for victims among running
        jobs: the victim order changes as time passes (the work each would lose grows at the
        rate of its GPUs), so the next instant's plan may find what this one did not, and
        those types are planned again, as full snapshots would."""
        if self.full_snapshots or not plan.waiting:
            return set()
        searching: set[str] = set()
        for view in snapshot.runnable:
            gpu_type = view.gpu_type
            if gpu_type in searching or view.id not in plan.waiting:
                continue
            if len(self.placed_by_type[gpu_type]) == len(self.stopping[gpu_type]):
                continue  # no running job to choose from
            share = self.shares[view.share]
            limit = share.capacity_limits.get(gpu_type, 0)
            if share.in_share_preemption or (
                self.usage.get((view.share, gpu_type), 0) + view.gpus <= limit
            ):
                searching.add(gpu_type)
        return searching

    def _snapshot(self, dirty: set[str]) -> Snapshot | None:
        """What the engine must see to plan the GPU types in `dirty`; None when it could decide
        nothing there. In `full_snapshots` mode: everything, every time."""
        if self.full_snapshots:
            gpu_types = [t for t in self.gpu_types if self.runnable.get(t)]
            runnable = [view for t in gpu_types for view in self.runnable[t].values()]
            gpu_types = list(self.gpu_types) if runnable else []
        else:
            gpu_types = []
            runnable = []
            for gpu_type in sorted(dirty):
                jobs = self._may_be_decided(gpu_type)
                if jobs:
                    gpu_types.append(gpu_type)
                    runnable.extend(jobs)
        if not runnable:
            return None
        self._note_checkpoints()
        placed: list[PlacedJob] = []
        for gpu_type in gpu_types:
            placed.extend(self.placed_by_type[gpu_type].values())
        scenario = self.scenario
        if self.full_snapshots:
            # Built afresh, and without the GPUs held: the engine works out everything itself.
            return Snapshot(
                nodes=tuple(node for t in gpu_types for node in self.nodes_by_type[t]),
                shares=self._share_views,
                placed=tuple(placed),
                runnable=tuple(runnable),
                borrow_order=scenario.borrow_order,
                now=self._now,
                churn_preemptions=scenario.churn_preemptions,
                churn_window_seconds=scenario.churn_window_seconds,
            )
        # The same tuple of nodes for the same GPU types, so that the engine keeps what it
        # derives from them; the GPUs held, as kept here, so that it need not work them out.
        key = tuple(gpu_types)
        nodes = self._nodes_of_types.get(key)
        if nodes is None:
            nodes = self._nodes_of_types[key] = tuple(
                node for t in gpu_types for node in self.nodes_by_type[t]
            )
        return Snapshot(
            nodes=nodes,
            shares=self._share_views,
            placed=tuple(placed),
            runnable=tuple(runnable),
            borrow_order=scenario.borrow_order,
            held_gpus=dict(self.used_gpus),
            now=self._now,
            churn_preemptions=scenario.churn_preemptions,
            churn_window_seconds=scenario.churn_window_seconds,
        )

    def _note_checkpoints(self) -> None:
        """Give the running jobs whose checkpoint time has come their latest checkpoint."""
        heap = self._checkpoints
        now = self._now
        while heap and heap[0][0] <= now:
            _, job_id, attempt = heapq.heappop(heap)
            job = self.jobs[job_id]
            placed = self.placed.get(job_id)
            if job.attempt != attempt or placed is None or placed.stopping:
                continue
            interval = job.spec.checkpoint_interval
            progress = job.work_done + (now - job.run_start)
            saved = job.run_start + (progress // interval) * interval - job.work_done
            view = replace(placed, checkpointed=saved)
            self.placed[job_id] = self.placed_by_type[job.spec.gpu_type][job_id] = view
            self._next_checkpoint(job, saved + interval)

    def _next_checkpoint(self, job: SimJob, at: float) -> None:
        """The job's next checkpoint is at `at`, unless it has finished by then."""
        if at < job.run_start + job.spec.duration - job.work_done:
            heapq.heappush(self._checkpoints, (at, job.spec.id, job.attempt))

    def _may_be_decided(self, gpu_type: str) -> list[RunnableJob]:
        """The waiting jobs of `gpu_type`, in queue order, less those the engine could only
        leave waiting with nothing reserved, whatever the jobs planned before them do: leaving
        those out changes no decision (DESIGN §2).

        Within one cycle, what jobs already hold only grows (placements add to it, victims
        stopping still count), free GPUs and GPUs being released only shrink, and so do the
        candidate victims. So a job stays hopeless all cycle when, at its start, it needs to
        borrow (more than its share's limit) and either the quota rules already refuse it
        (its share cannot borrow, its borrow cap, or nothing lendable: all of them only get
        worse as jobs are placed), or no set of nodes has room for it in free GPUs and GPUs
        being released -- provided it cannot preempt in its own share (even with every running
        job of its share of lower priority as a victim, the quota rules would refuse it). A job
        within its limit may reclaim and is always sent, as are jobs promised GPUs (their
        victims stopping or back in the queue), the victims back in the queue, every job of a
        strict-FIFO share, and a job the engine would reject.
        """
        queue = self.runnable.get(gpu_type)
        if not queue:
            return []
        if self.scenario.borrow_order == FAIR:
            # The fair pass orders borrowers by how much their shares borrow as the cycle goes,
            # and where a share's next job stands in that order depends on the jobs before it.
            return list(queue.values())
        verdicts = self._verdicts.get(gpu_type)
        if verdicts is None or verdicts.moves != self.moves[gpu_type]:
            verdicts = self._verdicts[gpu_type] = _Verdicts(self.moves[gpu_type])
        known = verdicts.hopeless
        kinds = self.kinds[gpu_type]
        # A job promised GPUs is sent from now on (its place in the queue stays).
        for job_id in self.claims.keys() | self.promised.keys():
            if kinds.of.get(job_id, _Kinds.ALWAYS) != _Kinds.ALWAYS:
                kinds.change(job_id, _Kinds.ALWAYS)
        send = [True] * len(self._kind_examples)
        everything = True
        for kind in kinds.queued:
            if kind == _Kinds.ALWAYS:
                continue
            example = self._kind_examples[kind]
            key = (example.share, example.gpus, example.nodes, example.priority)
            hopeless = known.get(key)
            if hopeless is None:
                hopeless = known[key] = self._hopeless(example, verdicts)
            if hopeless:
                send[kind] = everything = False
        if everything:
            return list(queue.values())
        return list(compress(queue.values(), map(send.__getitem__, kinds.of.values())))

    def _hopeless(self, view: RunnableJob, verdicts: _Verdicts) -> bool:
        """Whether the job can only wait all cycle (see `_may_be_decided`)."""
        gpu_type = view.gpu_type
        share = self.shares[view.share]
        if share.strict_fifo:
            return False
        limit = share.capacity_limits.get(gpu_type)
        if limit is None or self.usage.get((view.share, gpu_type), 0) + view.gpus <= limit:
            return False  # to be rejected, or within its limit: it may reclaim
        shape = (view.share, gpu_type, view.gpus, view.nodes)
        rejected = self._rejected.get(shape)
        if rejected is None:
            reason = rejection_reason(view, self.shares, self.node_sizes[gpu_type])
            rejected = self._rejected[shape] = reason is not None
        if rejected:
            return False
        if verdicts.ledger is None:
            usage = {name: self.usage.get((name, gpu_type), 0) for name in self.shares}
            verdicts.ledger = Ledger(gpu_type, self.shares, usage, self.ready_gpus[gpu_type])
        ledger = verdicts.ledger
        if share.in_share_preemption:
            by_priority = self.running_gpus.get((view.share, view.gpu_type), {})
            lower = sum(gpus for priority, gpus in by_priority.items() if priority < view.priority)
            # With every lower-priority job of its share as a victim: within its limit (tries 2
            # and 3), or allowed to borrow what it still needs (try 2)?
            if lower and (
                ledger.held_usage(view.share) + view.gpus - lower <= limit
                or ledger.check(view.share, {view.share: view.gpus - lower}, within_limit=False)
                is None
            ):
                return False
        if ledger.admission_reason(view.share, view.gpus) is not None:
            return True
        # The quota allows it: it waits only if no set of nodes has room for it.
        if verdicts.room is None:
            verdicts.room = self._room(gpu_type)
        per_node = view.gpus // view.nodes
        return per_node >= len(verdicts.room) or verdicts.room[per_node] < view.nodes

    def _room(self, gpu_type: str) -> list[int]:
        """For g = 0 .. GPUs of the largest node: how many READY nodes of the type have g GPUs
        free or being released (by stopping jobs whose GPUs are promised to no waiting job)."""
        used = self.used_gpus
        spare = {name: gpus - used[name].bit_count() for name, gpus in self.ready_nodes[gpu_type]}
        for stopping in self.stopping[gpu_type].values():
            promised_to = stopping.preempted_for
            if promised_to is not None and promised_to in self.runnable.get(gpu_type, {}):
                continue
            for allocation in stopping.allocations:
                if allocation.node in spare:
                    spare[allocation.node] += len(allocation.gpu_indices)
        largest = self.node_sizes[gpu_type].largest
        room = [0] * (largest + 2)
        for gpus, nodes in Counter(spare.values()).items():
            room[min(gpus, largest + 1)] += nodes
        for gpus in range(largest, -1, -1):
            room[gpus] += room[gpus + 1]
        return room

    def _final_reasons(self) -> None:
        """Why each job still waiting at the end waits, from one cycle over everything (the
        reasons the last full snapshot would have given). That cycle must decide nothing."""
        self.full_snapshots = True
        try:
            snapshot = self._snapshot(set(self.gpu_types))
        finally:
            self.full_snapshots = False
        if snapshot is None:
            return
        plan = self.engine(snapshot)
        if plan.placements or plan.preemptions or plan.rejections:
            raise SkippedDecisionError(
                f"t={self._now}: a cycle was left out that would have decided something"
            )
        for job_id, reason in plan.waiting.items():
            self.jobs[job_id].reason = reason

    def _apply(self, now: float, plan: Plan) -> tuple[set[str], set[str]]:
        """Carry out a plan; return the GPU types it acted on and those whose GPUs came free."""
        acted: set[str] = set()
        for rejection in plan.rejections:
            job = self._runnable_job(rejection.job_id, "rejected")
            self._dequeue(job)
            self._reject(now, job, rejection.reason)
            acted.add(job.spec.gpu_type)
            self.moves[job.spec.gpu_type] += 1
        for placement in plan.placements:
            self._start(now, placement)
            acted.add(self.jobs[placement.job_id].spec.gpu_type)
        grace_over: list[SimJob] = []
        for preemption in plan.preemptions:
            job = self._preempt(now, preemption.job_id, preemption.for_job_id)
            acted.add(job.spec.gpu_type)
            if self.shares[job.spec.share].grace_seconds == 0:
                grace_over.append(job)
        for job_id, reason in plan.waiting.items():
            self.jobs[job_id].reason = reason
        freed: set[str] = set()
        for job in grace_over:
            gpu_type = self._release(now, job.spec.id, job.attempt)
            if gpu_type is not None:
                freed.add(gpu_type)
        return acted, freed

    def _runnable_job(self, job_id: str, what: str) -> SimJob:
        job = self.jobs.get(job_id)
        if job is None or job.state != RUNNABLE:
            state = job.state if job else "unknown"
            raise EngineContractError(f"the engine {what} job {job_id}, which is {state}")
        return job

    def _start(self, now: float, placement: Any) -> None:
        job = self._runnable_job(placement.job_id, "placed")
        spec = job.spec
        if len({a.node for a in placement.allocations}) != spec.nodes:
            raise EngineContractError(f"job {spec.id} wants {spec.nodes} distinct nodes")
        per_node = spec.gpus // spec.nodes
        for allocation in placement.allocations:
            indices = allocation.gpu_indices
            mask = 0
            for index in indices:
                mask |= 1 << index
            node_gpus = self.node_gpus.get(allocation.node)
            if (
                node_gpus is None
                or len(indices) != per_node
                or mask.bit_count() != per_node
                or mask >> node_gpus
                or self.used_gpus[allocation.node] & mask
            ):
                raise EngineContractError(
                    f"t={now}: job {spec.id} placed on {allocation.node} GPUs {indices}, "
                    "which are not free (or not there)"
                )
            self.used_gpus[allocation.node] |= mask
        self._dequeue(job)
        self._drop_claim(spec.id)
        self.moves[spec.gpu_type] += 1
        self.placed[spec.id] = self.placed_by_type[spec.gpu_type][spec.id] = PlacedJob(
            id=spec.id,
            share=spec.share,
            gpu_type=spec.gpu_type,
            gpus=spec.gpus,
            priority=spec.priority,
            submitted=spec.submit,
            started=now,
            allocations=placement.allocations,
            borrowed=placement.borrowed,
            preemptible=spec.preemptible,
        )
        key = (spec.share, spec.gpu_type)
        self.usage[key] = self.usage.get(key, 0) + spec.gpus
        self._rates_stale = True
        self._count_running(self.placed[spec.id], +1)
        self._victim_from(self.placed[spec.id])
        job.state = RUNNING
        job.run_start = now
        job.reason = None
        job.borrowed = placement.borrowed
        job.node_names = tuple(a.node for a in placement.allocations)
        if job.started is None:
            job.started = now
            if self.first_starts is not None:
                self.first_starts[spec.id] = (now, placement.allocations)
        self._event(now, job, "start", job.node_names, job.borrowed)
        self._push(now + spec.duration - job.work_done, _RELEASE, (spec.id, job.attempt))
        if spec.checkpoint_interval:
            interval = spec.checkpoint_interval
            done = job.work_done
            self._next_checkpoint(job, now + (done // interval + 1) * interval - done)

    def _preempt(self, now: float, job_id: str, for_job_id: str) -> SimJob:
        job = self.jobs.get(job_id)
        placed = self.placed.get(job_id)
        if job is None or placed is None or placed.stopping:
            raise EngineContractError(
                f"t={now}: the engine preempted {job_id}, which is not running"
            )
        spec = job.spec
        # Work after the last checkpoint is lost; without checkpoints the job starts over.
        progress = job.work_done + (now - job.run_start)
        if spec.checkpoint_interval:
            job.work_done = min(
                spec.duration, (progress // spec.checkpoint_interval) * spec.checkpoint_interval
            )
        else:
            job.work_done = 0.0
        job.attempt += 1  # its pending finish is void: it cannot finish during its grace period
        self.moves[spec.gpu_type] += 1
        job.state = PREEMPTING
        step = outcomes.after_preemption(
            preemptions=job.preemptions, max_preemptions=spec.max_preemptions
        )
        job.preemptions += 1
        job.preempted_at = (*job.preempted_at, now)
        self._hold_ends(job)
        self._share_preemptions[self.share_index[spec.share]] += 1
        if step.state == FAILED:
            job.fail_on_release = True
            job.reason = step.reason
        self._count_running(placed, -1)
        self.placed[job_id] = self.placed_by_type[spec.gpu_type][job_id] = PlacedJob(
            id=placed.id,
            share=placed.share,
            gpu_type=placed.gpu_type,
            gpus=placed.gpus,
            priority=placed.priority,
            submitted=placed.submitted,
            started=placed.started,
            allocations=placed.allocations,
            stopping=True,
            preempted_for=for_job_id,
            borrowed=placed.borrowed,
            preemptible=placed.preemptible,
        )
        self.stopping[spec.gpu_type][job_id] = self.placed[job_id]
        self.promised[for_job_id] = self.promised.get(for_job_id, 0) + 1
        self._event(now, job, "preempt", job.node_names, job.borrowed)
        grace = self.shares[spec.share].grace_seconds
        if grace > 0:
            self._push(now + grace, _RELEASE, (job_id, job.attempt))
        return job

    def _count_running(self, placed: PlacedJob, sign: int) -> None:
        by_priority = self.running_gpus.setdefault((placed.share, placed.gpu_type), {})
        left = by_priority.get(placed.priority, 0) + sign * placed.gpus
        if left:
            by_priority[placed.priority] = left
        else:
            del by_priority[placed.priority]

    def _event(
        self, now: float, job: SimJob, kind: str, nodes: Iterable[str], borrowed: int
    ) -> None:
        self.events.append(
            {
                "t": _num(now),
                "job": job.spec.id,
                "type": kind,
                "nodes": list(nodes),
                "borrowed": borrowed,
            }
        )

    # ---- accounting -------------------------------------------------------------------------

    def _integrate_to(self, now: float) -> None:
        elapsed = now - self._now
        if elapsed > 0:
            for i in range(len(self.share_names)):
                self._used_seconds[i] += self._used_rate[i] * elapsed
                self._borrowed_seconds[i] += self._borrowed_rate[i] * elapsed
                self._lent_seconds[i] += self._lent_rate[i] * elapsed
        self._now = now

    def _update_rates(self, now: float) -> None:
        """GPUs each share uses, borrows and lends from now until the next instant.

        What is borrowed is drawn first on the free pool (GPUs no share's limit covers), then on
        the lenders in proportion to what each can lend (DESIGN §2, "lent").
        """
        n = len(self.share_names)
        used = [0.0] * n
        borrowed = [0.0] * n
        lent = [0.0] * n
        usage = self.usage
        names = self.share_names
        for gpu_type in self.gpu_types:
            covered = 0
            borrowed_total = 0
            can_lend: dict[int, int] = {}
            for i, (limit, cap) in enumerate(self._lending_terms[gpu_type]):
                covered += limit
                held = usage.get((names[i], gpu_type), 0)
                used[i] += held
                if held > limit:
                    borrowed[i] += held - limit
                    borrowed_total += held - limit
                elif held < limit and cap:
                    can_lend[i] = accounting.lendable(limit, held, cap)
            free_pool = max(0, self.cluster_gpus[gpu_type] - covered)
            for i, gpus in accounting.split_lent(borrowed_total, free_pool, can_lend).items():
                lent[i] += gpus
        self._used_rate, self._borrowed_rate, self._lent_rate = used, borrowed, lent
        self._rates_stale = False
        if self.record_series:
            own = tuple(u - b for u, b in zip(used, borrowed, strict=True))
            point = (now, own, tuple(borrowed), tuple(lent))
            if not self.series or self.series[-1][1:] != point[1:]:
                self.series.append(point)

    # ---- the result -------------------------------------------------------------------------

    def _result(self) -> SimulationResult:
        jobs_out = []
        waits: dict[str, list[float]] = {name: [] for name in self.share_names}
        for job in self.jobs.values():
            spec = job.spec
            wait = None if job.started is None else job.started - spec.submit
            if wait is not None:
                waits[spec.share].append(wait)
            jobs_out.append(
                {
                    "id": spec.id,
                    "share": spec.share,
                    "state": job.state,
                    "submitted": _num(spec.submit),
                    "started": _num(job.started),
                    "finished": _num(job.finished),
                    "wait_seconds": _num(wait),
                    "preemptions": job.preemptions,
                    "reason": job.reason if job.state in (RUNNABLE, FAILED) else None,
                }
            )
        shares_out = {}
        for i, name in enumerate(self.share_names):
            share_waits = sorted(waits[name])
            shares_out[name] = {
                "gpu_hours_used": _hours(self._used_seconds[i]),
                "gpu_hours_borrowed": _hours(self._borrowed_seconds[i]),
                "gpu_hours_lent": _hours(self._lent_seconds[i]),
                "mean_wait": _num(sum(share_waits) / len(share_waits)) if share_waits else 0,
                "p95_wait": _num(percentile(share_waits, 95)) if share_waits else 0,
                "preemptions": self._share_preemptions[i],
            }
        first_submit = min((job.spec.submit for job in self.jobs.values()), default=0.0)
        last_release = self._last_release if self._last_release is not None else first_submit
        makespan = max(0.0, last_release - first_submit)
        capacity_seconds = self.total_gpus * makespan
        used_seconds = sum(self._used_seconds)
        cluster = {
            "gpu_hours_capacity": _hours(capacity_seconds),
            "gpu_hours_used": _hours(used_seconds),
            "utilization": round(used_seconds / capacity_seconds, 6) if capacity_seconds else 0,
            "makespan": _num(makespan),
        }
        data = {"events": self.events, "jobs": jobs_out, "shares": shares_out, "cluster": cluster}
        return SimulationResult(data=data, share_names=self.share_names, series=self.series)


def simulate(
    scenario: Scenario,
    *,
    engine: Engine | None = None,
    record_series: bool = False,
    full_snapshots: bool = False,
) -> SimulationResult:
    """Replay `scenario` through the engine and return the result of DESIGN §4.

    `full_snapshots=True` runs a cycle at every instant with every node, placed and waiting job
    in its snapshot; the result is the same (tests check it), only slower.
    """
    with collector_paused():
        return Simulation(
            scenario, engine=engine, record_series=record_series, full_snapshots=full_snapshots
        ).run()


def percentile(sorted_values: list[float], pct: float) -> float:
    """The `pct` percentile, interpolating between ranks (as numpy's default does)."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    rank = (len(sorted_values) - 1) * pct / 100
    low = int(rank)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)


def _num(value: float | None) -> float | int | None:
    """Whole seconds print as integers; the rest is rounded to the millisecond."""
    if value is None:
        return None
    if float(value).is_integer():
        return int(value)
    return round(value, 3)


def _hours(gpu_seconds: float) -> float:
    return round(gpu_seconds / 3600, 6)
