"""What a connector (`gpu-agent slurm`, `gpu-agent kubernetes`) needs of a cluster manager:
the one interface `scheduler.agent.connector.Connector` works through, so that the portal's
rules about attempts are carried out alike on every cluster manager. Slurm
(`scheduler.agent.slurm`) and Kubernetes (`scheduler.agent.kubernetes`) implement it.

The words: a cluster manager's *job* is what runs one portal attempt there (one Slurm job; the
pods of one attempt, one per node of its gang); a *node* is a machine it runs jobs on."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

# Characters that make a command a shell program rather than one program and its arguments.
SHELL_SYNTAX = frozenset("|&;<>()$`\\\"'*?[]#~=%{}\n")


def shell_line(command: str) -> str:
    """The job's command as the last line of a shell script: a plain command is exec'ed, so
    that its exit code is the job's and a SIGTERM reaches it directly rather than a shell
    (which, as a container's first process, would not pass it on)."""
    return command if SHELL_SYNTAX & set(command) else f"exec {command}"


class ClusterUnreachable(Exception):
    """The cluster manager did not answer (or its client could not run at all)."""


class ClusterRefused(Exception):
    """The cluster manager answered, and refused (a request that cannot be carried out)."""


class ClusterNode(Protocol):
    """A GPU node as the cluster manager reports it."""

    name: str
    gpu_type: str | None  # None: not known (the connector's command line may give it)
    gpus: int
    used_gpus: int  # by every job there, the portal's included
    state: str  # the portal's: NODE_READY, NODE_DRAINING or NODE_DOWN
    reason: str  # the cluster manager's state and reason, as an operator reads them


class ClusterJob(Protocol):
    """What runs one attempt in the cluster, as last read."""

    id: str
    state: str  # the cluster manager's word, for logs and reasons
    reason: str
    nodes: tuple[str, ...]
    gpus_per_node: int
    exit_code: int | None  # -N: killed by signal N (as Popen says)

    @property
    def pending(self) -> bool:
        """Accepted, not started, and holding no GPU yet."""

    @property
    def holding(self) -> bool:
        """Started: its processes hold their nodes' GPUs."""

    @property
    def end(self) -> str | None:
        """How it ended, in the protocol's words (END_EXIT, END_TIMEOUT, END_LOST, ...);
        None while it has not."""


class Cluster(Protocol):
    """A cluster manager, as a connector drives it."""

    kind: str  # the portal's Connector.Kind
    manager: str  # its name in reasons and logs: "Slurm", "Kubernetes"
    # Whether the cluster manager itself ends a stopped job after the grace period given to
    # `terminate` (the kubelet does); otherwise the connector calls `kill` once it is over.
    enforces_grace: bool
    # Whether a job holds its GPUs (in `ClusterNode.used_gpus`) from its submission, before it
    # starts (a pod bound to its node does; a pending Slurm job holds none).
    holds_while_pending: bool

    def start(self) -> None:
        """Begin watching the cluster, where the cluster manager is watched rather than asked."""

    def discover(self) -> None:
        """Read what the cluster's configuration says of where ended jobs are found."""

    def nodes(self) -> list[ClusterNode]:
        """The GPU nodes the connector brings to the portal. Raises ClusterUnreachable."""

    def attempt_jobs(self) -> dict[int, ClusterJob]:
        """The jobs the connector submitted, by attempt (the newest, where an attempt has
        several), running, pending or ended and still known. Raises ClusterUnreachable."""

    def ended_job(self, job_id: str) -> ClusterJob | None:
        """What became of a job the cluster no longer lists; None when nothing says."""

    def submit(self, order: dict, *, env: dict[str, str], log: Path) -> str:
        """Run the attempt of a run order on its nodes, with the portal's environment; its
        output goes to `log` where the cluster manager writes logs to files. Returns the
        job's id. Raises ClusterRefused, ClusterUnreachable."""

    def terminate(self, job_id: str, *, grace: float, started: bool) -> None:
        """Stop the job: SIGTERM to its processes, which have `grace` seconds to end (a job not
        started yet is withdrawn at once)."""

    def kill(self, job_id: str) -> None:
        """End the job now (its grace period is over, or it never started)."""

    def forget(self, job_id: str) -> None:
        """The job's end has been reported: what the cluster manager keeps of it may go."""

    def describe(self, job: ClusterJob, *, waited: float) -> dict | None:
        """What the cluster runs the started attempt as, for the portal: {id, allocations:
        [{node, gpu_indices}]} (the GPU indices where the cluster manager tells them). None:
        not known cheaply yet, `waited` seconds after the connector saw it start; asked again
        at the next look (an ended job's `waited` is infinite: answer then)."""

    def log_tail(self, job_id: str, log: Path) -> str:
        """The end of the job's output."""
