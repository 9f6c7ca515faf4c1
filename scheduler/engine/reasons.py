"""Every message the engine writes for a person: why a job waits, fails, or is preempted.

Tests and the layers above compare against these functions, so the wording lives in one place.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def _count(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


# --- why a runnable job waits -------------------------------------------------------------


def at_limit(share: str, used: int, limit: int, gpu_type: str) -> str:
    return f"share {share} at its limit ({used}/{limit} {gpu_type})"


def larger_than_limit(gpus: int, gpu_type: str, share: str, limit: int, strategy: str) -> str:
    return (
        f"needs {gpus} {gpu_type} but share {share}'s limit is {limit} "
        f"and a {strategy} share cannot borrow"
    )


def larger_than_borrow_limit(gpus: int, gpu_type: str, share: str, limit: int, cap: int) -> str:
    """A job larger than its share may ever use: its limit plus `cap`, its borrow limit."""
    if not cap:
        return (
            f"needs {gpus} {gpu_type} but share {share} may use at most its limit of {limit} "
            "(its borrow limit is 0)"
        )
    return (
        f"needs {gpus} {gpu_type} but share {share} may use at most {limit + cap}: its limit "
        f"of {limit} and a borrow limit of {cap} more"
    )


def not_preemptible(share: str, used: int, limit: int, gpu_type: str, gpus: int) -> str:
    """A job that is not preemptible never borrows: it runs only within its share's limit."""
    if gpus > limit:
        return (
            f"not preemptible: needs {gpus} {gpu_type}, more than share {share}'s limit "
            f"({limit}), and a job that is not preemptible never borrows"
        )
    return f"not preemptible: waits for share {share}'s own GPUs ({used}/{limit} {gpu_type} in use)"


def borrow_limit_reached(borrowed: int, cap: int, gpu_type: str) -> str:
    return f"borrow limit reached ({borrowed}/{cap} extra {gpu_type})"


def no_lendable(gpu_type: str) -> str:
    return f"no lendable {gpu_type} idle"


def quota_lent_out(share: str, gpu_type: str) -> str:
    return f"share {share}'s {gpu_type} quota is lent out; waiting for borrowers to release it"


def no_node(gpus_per_node: int, nodes: int, gpu_type: str) -> str:
    if nodes == 1:
        return f"no node with {gpus_per_node} free {gpu_type} GPUs"
    return f"no {nodes} nodes with {gpus_per_node} free {gpu_type} GPUs each"


def reclaiming(gpus: int, gpu_type: str, shares: Iterable[str], jobs: int) -> str:
    names = sorted(shares)
    label = "share" if len(names) == 1 else "shares"
    return (
        f"reclaiming {gpus} {gpu_type} from {label} {', '.join(names)} "
        f"({_count(jobs, 'job')} stopping)"
    )


def preempting_in_share(gpus: int, gpu_type: str, share: str, jobs: int) -> str:
    return (
        f"preempting {gpus} {gpu_type} of lower priority in share {share} "
        f"({_count(jobs, 'job')} stopping)"
    )


def _in(seconds: float) -> str:
    return f"in {max(1, math.ceil(seconds))} s"


def reclaiming_in(gpus: int, gpu_type: str, shares: Iterable[str], seconds: float) -> str:
    """The victims have not yet run their shares' minimum runtime."""
    names = sorted(shares)
    label = "share" if len(names) == 1 else "shares"
    return f"reclaiming {gpus} {gpu_type} from {label} {', '.join(names)} {_in(seconds)}"


def preempting_in_share_in(gpus: int, gpu_type: str, share: str, seconds: float) -> str:
    return f"preempting {gpus} {gpu_type} of lower priority in share {share} {_in(seconds)}"


def held_off(preemptions: int, window: float, seconds: float) -> str:
    """The churn breaker holds the job off borrowed GPUs."""
    return (
        f"held off borrowed GPUs for {_in(seconds)[3:]}: preempted {preemptions} times within "
        f"{window:g} s; runs within its share's limit meanwhile"
    )


def waiting_for_release(gpus: int, gpu_type: str) -> str:
    return f"waiting for {gpus} {gpu_type} being released"


def strict_fifo(job_id: str) -> str:
    return f"strict FIFO: behind job {job_id}"


# --- why a placed job is preempted ----------------------------------------------------------


def reclaimed_by(share: str, job_id: str) -> str:
    return f"reclaimed by share {share} for job {job_id}"


def preempted_in_share(share: str, job_id: str) -> str:
    return f"preempted in share {share} for higher-priority job {job_id}"


# --- why a runnable job is rejected (FAILED) ----------------------------------------------


def unknown_share(share: str) -> str:
    return f"unknown share {share}"


def no_limit_for_type(share: str, gpu_type: str) -> str:
    return f"share {share} has no limit for {gpu_type}"


def bad_size(gpus: int, nodes: int) -> str:
    return f"a job needs at least 1 GPU on at least 1 node (asked {gpus} GPUs on {nodes} nodes)"


def not_divisible(gpus: int, nodes: int) -> str:
    return f"{gpus} GPUs cannot be spread evenly over {nodes} nodes"


def no_nodes_of_type(gpu_type: str) -> str:
    return f"the cluster has no {gpu_type} nodes"


def node_too_small(gpus_per_node: int, gpu_type: str, largest: int) -> str:
    return f"{gpus_per_node} GPUs per node asked, the largest {gpu_type} node has {largest}"


def too_few_nodes(nodes: int, gpus_per_node: int, gpu_type: str, existing: int) -> str:
    return f"{nodes} nodes with {gpus_per_node} {gpu_type} GPUs asked, the cluster has {existing}"
