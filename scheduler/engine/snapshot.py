"""What the engine sees (a snapshot) and what it decides (a plan).

Pure dataclasses, no Django: the production cycle, the simulator and the tests build a
`Snapshot`, call `scheduler.engine.plan(snapshot)` and apply the returned `Plan`.
Job ids are strings; the database layer passes `str(pk)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

RESERVE = "RESERVE"
LEND = "LEND"
LEND_AND_BORROW = "LEND_AND_BORROW"
STRATEGIES = (RESERVE, LEND, LEND_AND_BORROW)

ENABLED = "ENABLED"
DISABLED = "DISABLED"

READY = "READY"
DRAINING = "DRAINING"
DOWN = "DOWN"

FIFO = "fifo"
FAIR = "fair"

RECLAIM = "reclaim"
IN_SHARE = "in_share"

UNLIMITED = -1

# The churn breaker's defaults (docs/semantics.md): a job preempted 3 times within an hour
# borrows no more until that hour has passed.
CHURN_PREEMPTIONS = 3
CHURN_WINDOW_SECONDS = 3600.0


@dataclass(frozen=True, slots=True)
class NodeView:
    """A GPU node. Only READY nodes receive new jobs; jobs already on others keep their GPUs.
    `outside_gpus`: GPUs that work the portal did not place holds (a cluster manager's own
    jobs, on a node the portal shares with it): never planned on, and not cluster capacity."""

    name: str
    gpu_type: str
    gpus: int
    state: str = READY
    outside_gpus: int = 0


@dataclass(frozen=True, slots=True)
class ShareView:
    """A quota share as DESIGN §2 defines it."""

    name: str
    capacity_limits: Mapping[str, int]
    strategy: str
    borrow_limit: int = UNLIMITED  # percent of the limit; -1: no cap beyond the cluster
    lend_limit: Mapping[str, int] | None = None  # per GPU type; a missing type: all idle lendable
    in_share_preemption: bool = False
    grace_seconds: int = 120
    state: str = ENABLED
    weight: float = 1.0
    strict_fifo: bool = False
    # A job of this share that has run for less than this (seconds since its attempt started)
    # is not yet a victim of any preemption, reclaim or in-share (docs/semantics.md).
    min_runtime_seconds: float = 0


@dataclass(frozen=True, slots=True)
class Allocation:
    """GPUs on one node: the indices that become CUDA_VISIBLE_DEVICES."""

    node: str
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PlacedJob:
    """A job holding GPUs: scheduled, starting, running, or still stopping (PREEMPTING)."""

    id: str
    share: str
    gpu_type: str
    gpus: int
    priority: int
    submitted: float
    started: float
    allocations: tuple[Allocation, ...]
    stopping: bool = False
    # The runnable job whose reclaim (or in-share preemption) stops this one: the GPUs it
    # releases are promised to that job, so the reclaim is not repeated while it stops.
    preempted_for: str | None = None
    # GPUs of this job above its share's limit when it started (Placement.borrowed): a job on
    # borrowed GPUs goes before a job on its share's own quota in the victim order.
    borrowed: int = 0
    # A job submitted not preemptible is never a victim, of a reclaim or of in-share
    # preemption (docs/semantics.md).
    preemptible: bool = True
    # When the job last saved a checkpoint, if it did since `started`: the work a preemption
    # would lose runs from the later of the two (`victims.work_lost`).
    checkpointed: float | None = None


@dataclass(frozen=True, slots=True)
class RunnableJob:
    """A job waiting for GPUs: `gpus` of `gpu_type`, spread evenly over `nodes` distinct nodes."""

    id: str
    share: str
    gpu_type: str
    gpus: int
    nodes: int = 1
    priority: int = 0
    submitted: float = 0.0
    # The job this one was last preempted for, while it waits to run again. If that job is
    # runnable too, the GPUs this one released are still promised to it: it goes ahead of
    # them, so the victims do not take their GPUs back before it starts.
    preempted_for: str | None = None
    # Not preemptible: placed only within its share's limit (it never borrows, so no reclaim
    # could take it), and never a victim once placed.
    preemptible: bool = True
    # When it was preempted, at least its latest `Snapshot.churn_preemptions` times (older
    # ones may be left out): the churn breaker holds it off borrowed GPUs (`churn`).
    preempted_at: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class Snapshot:
    nodes: tuple[NodeView, ...]
    shares: tuple[ShareView, ...]
    placed: tuple[PlacedJob, ...] = ()
    runnable: tuple[RunnableJob, ...] = ()
    borrow_order: str = FIFO
    # The GPU indices the placed jobs hold on each node, as bit masks (bit i: GPU i), for a
    # caller that keeps them current between cycles (the simulator): it saves the engine a pass
    # over every placed job's allocations. It must be what `placed` holds; None: the engine
    # works it out.
    held_gpus: Mapping[str, int] | None = None
    # The time of the snapshot, on the clock of `started`, `submitted` and the like. None: the
    # latest time the snapshot holds (tests that do not care about time).
    now: float | None = None
    # The churn breaker (docs/semantics.md): a job preempted this many times within the window
    # is not placed on borrowed GPUs until the window has passed; 0: no breaker.
    churn_preemptions: int = CHURN_PREEMPTIONS
    churn_window_seconds: float = CHURN_WINDOW_SECONDS


@dataclass(frozen=True, slots=True)
class Placement:
    job_id: str
    allocations: tuple[Allocation, ...]
    borrowed: int  # GPUs of this job above its share's limit when it starts


@dataclass(frozen=True, slots=True)
class Preemption:
    job_id: str
    for_job_id: str
    kind: str  # RECLAIM or IN_SHARE
    reason: str


@dataclass(frozen=True, slots=True)
class Rejection:
    job_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    placements: tuple[Placement, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    rejections: tuple[Rejection, ...] = ()
    # Every runnable job neither placed nor rejected, with why it waits.
    waiting: Mapping[str, str] = field(default_factory=dict)
    # The earliest time after `now` at which time alone may let the plan decide otherwise: a
    # reclaim victim reaching its minimum runtime, a job's churn hold ending. None: no such.
    wake_at: float | None = None
