"""A Kubernetes cluster, as the connector (`gpu-agent kubernetes`) sees it: through its API
server, with the official `kubernetes` client (kubeconfig or in-cluster credentials).

The portal decides where each attempt runs, so its pods bypass Kubernetes' scheduler: each is
bound to its node (`spec.nodeName`) and asks for its GPUs as `nvidia.com/gpu` (the kubelet's
device plugin picks which devices). One attempt is one pod per node of its gang, labelled with
its share, job and attempt. The connector watches (a list, then a watch from its
resourceVersion; a new list when the watch has expired) every pod and every GPU node, and
reads what it needs from that cache: it never polls the API server.

- A node that advertises `nvidia.com/gpu` is a portal node: GPU type from a label
  (`nvidia.com/gpu.product`, as NVIDIA's GPU feature discovery sets it) or the command line;
  cordoned → DRAINING; NotReady → DOWN.
- Pods the connector did not create that hold `nvidia.com/gpu` on a node hold those GPUs:
  reported, never planned on.
- Preemption and cancel delete the pods with `gracePeriodSeconds` = the share's grace: the
  kubelet sends SIGTERM, then SIGKILL. An attempt ends when its containers have terminated,
  not when the pod objects are gone (that can take far longer); the connector then deletes
  them.

Reading the cache's pods into attempts (`attempt_job`) is a pure function over the pods' JSON,
tested on its own (tests/agent/test_kube_pods.py, tests/kubernetes/test_api_objects.py) and
live (tests/kubernetes/)."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from fnmatch import fnmatchcase
from pathlib import Path

from scheduler.agent.cluster import ClusterRefused, ClusterUnreachable, shell_line
from scheduler.agent.protocol import (
    END_EXIT,
    END_LOST,
    END_NEVER_STARTED,
    END_TIMEOUT,
    END_WITHDRAWN,
    LOG_TAIL_CHARS,
    NODE_DOWN,
    NODE_DRAINING,
    NODE_READY,
)

logger = logging.getLogger("scheduler.agent.kube")

GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
# The labels and annotations of the connector's pods.
LABEL_PREFIX = "gpu-quota-portal"
MANAGED_BY = "app.kubernetes.io/managed-by"
CONNECTOR_LABEL = f"{LABEL_PREFIX}/connector"
SHARE_LABEL = f"{LABEL_PREFIX}/share"
JOB_LABEL = f"{LABEL_PREFIX}/job"
ATTEMPT_LABEL = f"{LABEL_PREFIX}/attempt"
GANG_ANNOTATION = f"{LABEL_PREFIX}/gang"  # the attempt's nodes, comma-separated
GROUP_ANNOTATION = f"{LABEL_PREFIX}/attempt-pods"  # their names, less the node suffix
GRACE_ANNOTATION = f"{LABEL_PREFIX}/grace-seconds"
CONTAINER = "job"
CHECKPOINT_VOLUME = "checkpoints"

REQUEST_TIMEOUT = (5.0, 30.0)  # connect, read: an API server that does not answer is unreachable
# A watch asks the API server to end it after WATCH_SECONDS, and gives up reading after
# WATCH_READ_SECONDS without a byte (a connection that died without a word).
WATCH_SECONDS = 240
WATCH_READ_SECONDS = WATCH_SECONDS + 30
SYNC_WAIT_SECONDS = 10.0  # how long `start` waits for the first lists
SWEEP_SECONDS = 5.0  # how often the pods of ended jobs left behind are deleted again
RETRY_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0)

# Why a kubelet may refuse to run a pod bound to its node (pod phase Failed before any
# container ran): the portal placed it on GPUs something else holds. Withdrawn and requeued.
# A kubelet's eviction (node pressure) loses the attempt instead, as a node failure does.
EVICTED = "Evicted"
# A pod its kubelet itself terminated, not for anything the job did: the node shutting down
# (graceful node shutdown: "Terminated", "Shutdown" before Kubernetes 1.22) or a critical pod
# admitted in its place ("Preempting"); Kubernetes 1.26+ also marks it with a DisruptionTarget
# condition of reason TerminationByKubelet.
KUBELET_TERMINATED = frozenset(("Terminated", "Shutdown", "Preempting"))
# Quantity suffixes (resource.Quantity): decimal and binary multipliers, and milli.
QUANTITY_SUFFIXES = {
    "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip
QUANTITY = re.compile(r"([0-9.]+)(?:([eE][+-]?[0-9]+)|(m|k|[KMGTPE]i|[MGTPE])?)")
# Container waiting reasons that mean the job cannot start where it is (its image or its
# configuration): the attempt ends, as an agent's command that cannot start does.
CANNOT_START = frozenset(
    ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
     "CreateContainerConfigError", "CreateContainerError", "RunContainerError")
)  # fmt: skip
# A container that ended this way never ran its command (an executable not found, say).
NOT_STARTED = frozenset(("StartError", "ContainerCannotRun"))
# An init container the kubelet restarts after each failure (a sidecar, restartPolicy Always).
CRASH_LOOP = "CrashLoopBackOff"
# What the kubelet writes for a container of a pod it terminated without knowing how it ended.
STATUS_UNKNOWN = "ContainerStatusUnknown"
TERMINAL_PHASES = frozenset(("Succeeded", "Failed"))
# A node's conditions under which its kubelet evicts pods and refuses new ones (node-pressure
# eviction): a pod placed there would be evicted and requeued, and placed there again.
PRESSURE_CONDITIONS = frozenset(("MemoryPressure", "DiskPressure", "PIDPressure"))


# --- What the pods say -------------------------------------------------------------------------


@dataclass(frozen=True)
class KubeNode:
    name: str
    gpu_type: str | None
    gpus: int
    used_gpus: int
    state: str  # the portal's: NODE_READY, NODE_DRAINING or NODE_DOWN
    reason: str


@dataclass(frozen=True)
class KubeJob:
    """The pods of one attempt, read together: a gang is one job."""

    id: str  # namespace/name of the attempt's pods, less the node suffix
    state: str  # Pending, Running, Succeeded, Failed, CANCELLED, Evicted, NodeLost, ...
    reason: str
    nodes: tuple[str, ...]  # where its containers started
    gpus_per_node: int
    exit_code: int | None
    ended: str | None = None  # END_*: how it ended; None while it has not
    pods: tuple[str, ...] = ()  # the pods' names

    @property
    def pending(self) -> bool:
        return self.ended is None and self.state == "Pending"

    @property
    def holding(self) -> bool:
        return self.ended is None and self.state == "Running"

    @property
    def end(self) -> str | None:
        return self.ended


def quantity(value: object) -> int | None:
    """A resource.Quantity as an integer ("8", "1k", "1e3", "1000m" and "1Ki" are 8, 1000,
    1000, 1 and 1024), rounded down; None for what is not a quantity."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    match = QUANTITY.fullmatch(value.strip()) if isinstance(value, str) else None
    if match is None:
        return None
    number, exponent, suffix = match.groups()
    try:
        amount = Decimal(number) * (Decimal(10) ** int(exponent[1:]) if exponent else 1)
    except (InvalidOperation, ValueError):
        return None
    if suffix == "m":
        amount /= 1000
    else:
        amount *= QUANTITY_SUFFIXES[suffix or ""]
    return int(amount)


def pod_gpus(pod: dict) -> int:
    """The GPUs a pod holds on its node, as the kubelet counts them: its containers'
    `nvidia.com/gpu` limits (which Kubernetes requires to equal the requests) and its sidecars'
    (init containers that keep running: restartPolicy Always), or, if more, what an init
    container asks for beside the sidecars started before it."""
    spec = pod.get("spec") or {}

    def asked(container: dict) -> int:
        resources = container.get("resources") or {}
        value = (resources.get("limits") or {}).get(GPU_RESOURCE) or (
            resources.get("requests") or {}
        ).get(GPU_RESOURCE)
        return max(0, quantity(value or 0) or 0)

    sidecars = init = 0
    for container in spec.get("initContainers") or []:
        if container.get("restartPolicy") == "Always":
            sidecars += asked(container)
        else:
            init = max(init, sidecars + asked(container))
    return max(sum(asked(c) for c in spec.get("containers") or []) + sidecars, init)


def holds_gpus(pod: dict) -> bool:
    """Whether the pod holds its GPUs now: bound to a node and not ended (a pod being deleted
    holds them until its containers have stopped)."""
    return bool((pod.get("spec") or {}).get("nodeName")) and (
        (pod.get("status") or {}).get("phase", "") not in TERMINAL_PHASES
    )


def _container(pod: dict) -> dict:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for status in statuses:
        if status.get("name") == CONTAINER:
            return status
    return statuses[0] if statuses else {}


def _started(pod: dict) -> bool:
    """Whether the pod's job container has started (it runs, or it ran and ended)."""
    state = _container(pod).get("state") or {}
    if "running" in state:
        return True
    terminated = state.get("terminated")
    return bool(
        terminated and terminated.get("startedAt") and terminated.get("reason") not in NOT_STARTED
    )


def _terminated(pod: dict) -> dict | None:
    return (_container(pod).get("state") or {}).get("terminated")


def attempt_job(
    job_id: str,
    pods: list[dict],
    *,
    expected: int,
    deleted: set[str],
    down: dict[str, str],
    stopped: bool = False,
) -> KubeJob:
    """One attempt's job from its pods as last seen (`deleted`: the names of those whose pod
    object is gone), `expected` of them (its gang), `down`: the nodes that are NotReady, with
    why; `stopped`: the connector deleted its pods (a stop order). The rules, in order:

    - a pod on a node that is down, and not ended: the attempt is lost with its node;
    - a pod evicted by its kubelet: lost;
    - an init container (a pod template's) that failed, or cannot start, or keeps failing
      (`init_failure`): the job container never starts, so the attempt is never started,
      with that container's name, exit code and reason;
    - a pod its kubelet refused (Failed before its container ran): withdrawn;
    - a container that cannot start (its image, its command, its configuration): never
      started;
    - a pod past its activeDeadlineSeconds: timed out;
    - every pod ended (its container terminated, or its pod object gone): ended, with the
      first non-zero exit code of its containers. Pods deleted by someone else (`kubectl
      delete`, a drain's eviction) lose the attempt, as a node failure does: the job is run
      again, nothing counted against it;
    - every container started: running; else pending."""
    names = tuple(sorted(p["metadata"]["name"] for p in pods))
    started_on = tuple(sorted(p["spec"].get("nodeName", "") for p in pods if _started(p)))
    gpus = max((pod_gpus(p) for p in pods), default=0)

    def job(state: str, reason: str, ended: str | None = None, exit_code: int | None = None):
        return KubeJob(id=job_id, state=state, reason=reason, nodes=started_on,
                       gpus_per_node=gpus, exit_code=exit_code, ended=ended,
                       pods=names)  # fmt: skip

    for pod in pods:
        node = pod["spec"].get("nodeName", "")
        status = pod.get("status") or {}
        if node in down and status.get("phase") not in TERMINAL_PHASES and not _terminated(pod):
            return job("NodeLost", f"node {node} {down[node]}", END_LOST)
    for pod in pods:
        status = pod.get("status") or {}
        reason, message = status.get("reason", ""), status.get("message", "")
        said = f"{reason}: {message}" if message else reason
        if status.get("phase") == "Failed" and reason == EVICTED:
            return job(EVICTED, f"evicted by the kubelet of {pod['spec'].get('nodeName')}: "
                       f"{message}", END_LOST)  # fmt: skip
        if status.get("phase") == "Failed" and not stopped and _kubelet_terminated(status):
            return job("TerminatedByKubelet", f"the kubelet of {pod['spec'].get('nodeName')} "
                       f"terminated it ({said})", END_LOST)  # fmt: skip
        if reason == "DeadlineExceeded":
            return job("DeadlineExceeded", said, END_TIMEOUT, exit_code=None)
        failed_init = init_failure(pod)
        if failed_init is not None:
            return job("CannotStart", failed_init, END_NEVER_STARTED)
        if status.get("phase") == "Failed" and not _started(pod) and not _terminated(pod):
            node = pod["spec"].get("nodeName", "")
            return job("Rejected", f"the kubelet of {node} refused it ({said})", END_WITHDRAWN)
        waiting = (_container(pod).get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in CANNOT_START:
            image = ((pod["spec"].get("containers") or [{}])[0]).get("image", "")
            detail = f"{waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
            return job("CannotStart", f"image {image}: {detail}", END_NEVER_STARTED)
        terminated = _terminated(pod) or {}
        if terminated.get("reason") in NOT_STARTED:
            detail = f"{terminated['reason']}: {terminated.get('message', '')}".rstrip(": ")
            return job("CannotStart", detail, END_NEVER_STARTED)
    ended = [p for p in pods if _terminated(p) or p["metadata"]["name"] in deleted]
    if len(pods) >= expected and len(ended) == len(pods):
        codes = [
            int(terminated.get("exitCode", 0))
            for pod in sorted(ended, key=lambda p: (_terminated(p) or {}).get("finishedAt") or "")
            if (terminated := _terminated(pod)) is not None
        ]
        failing = [code for code in codes if code != 0]
        exit_code = (failing[0] if failing else 0) if codes else None
        if not stopped and any(
            p["metadata"].get("deletionTimestamp") or p["metadata"]["name"] in deleted for p in pods
        ):
            return job("DeletedOutside", "its pod was deleted outside the portal (kubectl "
                       "delete, a drain)", END_LOST, exit_code=exit_code)  # fmt: skip
        if exit_code is None:
            if any(_started(p) for p in pods):
                return job("Deleted", "its pods were deleted", END_EXIT)
            return job("Deleted", "its pods were deleted before it started", END_NEVER_STARTED)
        return job("Failed" if failing else "Succeeded", "", END_EXIT, exit_code=exit_code)
    if len(pods) >= expected and all(_started(p) or _terminated(p) for p in pods):
        return job("Running", "")
    waiting = [
        (_container(p).get("state") or {}).get("waiting") or {} for p in pods if not _started(p)
    ]
    reasons = sorted({w.get("reason", "") for w in waiting} - {""})
    return job("Pending", ", ".join(reasons) or "pods not started yet")


def init_failure(pod: dict) -> str | None:
    """Why the pod's init containers (a pod template may add some) keep its job container from
    ever starting, or None. The pod's restartPolicy is Never, so an init container that exits
    non-zero fails the pod ("Init:Error", phase Failed, the job container still waiting,
    PodInitializing); one waiting for an image it cannot pull or a configuration that is not
    there (CANNOT_START) waits for ever; a sidecar (restartPolicy Always) that crashes before
    it has started is restarted in a loop (CrashLoopBackOff). None once the job container has
    started or the pod is initialized, and for a pod being deleted (its init containers were
    killed for that)."""
    status = pod.get("status") or {}
    initialized = any(
        c.get("type") == "Initialized" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    if _started(pod) or initialized or pod["metadata"].get("deletionTimestamp"):
        return None
    specs = {c.get("name"): c for c in (pod.get("spec") or {}).get("initContainers") or []}
    for container in status.get("initContainerStatuses") or []:
        name = container.get("name", "")
        spec = specs.get(name) or {}
        state = container.get("state") or {}
        waiting = state.get("waiting") or {}
        terminated = state.get("terminated") or {}
        if (
            terminated
            and spec.get("restartPolicy") != "Always"
            and terminated.get("reason") != STATUS_UNKNOWN
            and terminated.get("exitCode") not in (0, None)
        ):
            return f"init container {name} {_how_it_ended(terminated)}"
        if waiting.get("reason") in CANNOT_START:
            detail = f"{waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
            return f"init container {name}: image {spec.get('image', '')}: {detail}"
        if waiting.get("reason") == CRASH_LOOP:
            last = (container.get("lastState") or {}).get("terminated") or {}
            return (
                f"init container {name} {_how_it_ended(last)}, restarted "
                f"{container.get('restartCount', 0)} times ({CRASH_LOOP})"
            )
    return None


def _how_it_ended(terminated: dict) -> str:
    """How a container ended, from its terminated state: "exited with code 1 (Error: ...)"."""
    said = ": ".join(
        part for part in (terminated.get("reason"), (terminated.get("message") or "").strip())
        if part
    )  # fmt: skip
    return f"exited with code {terminated.get('exitCode', '?')}" + (f" ({said})" if said else "")


def _kubelet_terminated(status: dict) -> bool:
    """Whether a Failed pod's kubelet terminated it for the node's sake (KUBELET_TERMINATED)."""
    return status.get("reason") in KUBELET_TERMINATED or any(
        c.get("type") == "DisruptionTarget" and c.get("status") == "True"
        and c.get("reason") == "TerminationByKubelet"
        for c in status.get("conditions") or []
    )  # fmt: skip


def _tolerated(taint: dict, tolerations: list) -> bool:
    """Whether one of `tolerations` tolerates `taint` (the rules of core/v1 Toleration)."""
    for toleration in tolerations:
        if not isinstance(toleration, dict):
            continue
        if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
            continue
        key = toleration.get("key", "")
        if toleration.get("operator") == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and toleration.get("value", "") == taint.get("value", ""):
            return True
    return False


def node_view(
    node: dict, *, used_gpus: int, gpu_type: str | None, tolerations: list | tuple = ()
) -> KubeNode | None:
    """A Node object as the portal takes it; None for a node without GPUs. `tolerations`: the
    connector's pods' (from its pod template): a NoExecute taint none of them tolerates keeps
    every portal pod off the node (its kubelet refuses them, and evicts those running). A node
    under memory, disk or PID pressure is DRAINING: its kubelet evicts pods and admits none."""
    status = node.get("status") or {}
    gpus = status.get("allocatable", {}).get(GPU_RESOURCE) or status.get("capacity", {}).get(
        GPU_RESOURCE
    )
    gpus = quantity(gpus or 0) or 0
    if gpus <= 0:
        return None
    untolerated = [
        taint for taint in (node.get("spec") or {}).get("taints") or []
        if taint.get("effect") == "NoExecute" and not _tolerated(taint, tolerations)
    ]  # fmt: skip
    name = node["metadata"]["name"]
    ready = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {"status": ""}
    )
    if ready.get("status") != "True":
        why = ready.get("reason") or "no Ready condition"
        message = ready.get("message", "")
        said = f"{why}: {message}" if message else why
        state, reason = NODE_DOWN, f"Kubernetes: NotReady ({said})"
    elif (node.get("spec") or {}).get("unschedulable"):
        state, reason = NODE_DRAINING, "Kubernetes: cordoned"
    elif pressure := [
        c for c in status.get("conditions") or []
        if c.get("type") in PRESSURE_CONDITIONS and c.get("status") == "True"
    ]:  # fmt: skip
        said = "; ".join(
            f"{c['type']}: {c['message']}" if c.get("message") else c["type"] for c in pressure
        )
        state, reason = NODE_DRAINING, f"Kubernetes: {said}"
    elif untolerated:
        taints = ", ".join(
            f"{t.get('key', '')}={t.get('value', '')}:NoExecute" for t in untolerated
        )
        state, reason = (
            NODE_DRAINING,
            f"Kubernetes: tainted {taints}, which its pods do not tolerate",
        )
    else:
        state, reason = NODE_READY, ""
    return KubeNode(name=name, gpu_type=gpu_type, gpus=gpus,
                    used_gpus=min(gpus, used_gpus), state=state, reason=reason)  # fmt: skip


def down_reason(node: dict) -> str | None:
    """Why a node is not Ready ("NotReady (NodeStatusUnknown)"), or None when it is."""
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            if condition.get("status") == "True":
                return None
            return f"NotReady ({condition.get('reason') or condition.get('status')})"
    return "NotReady (no Ready condition)"


def gpu_type_name(product: str) -> str:
    """A GPU product label as a portal GPU type: "NVIDIA-H100-80GB-HBM3" → "h100-80gb-hbm3"."""
    name = re.sub(r"[^a-z0-9-]+", "-", product.lower()).strip("-")
    name = name.removeprefix("nvidia-")
    return name[:32].rstrip("-")


def dns_name(text: str) -> str:
    """`text` as a part of a pod's name (lowercase letters, digits and dashes)."""
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-") or "x"


def label_value(text: str) -> str:
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63]
    return value.strip("-_.") or "x"


def pod_manifest(
    *, order: dict, env: dict[str, str], namespace: str, group: str, index: int, image: str,
    connector: str, checkpoint_root: Path, checkpoint_claim: str | None, host_network: bool,
    template: dict | None = None,
) -> dict:  # fmt: skip
    """The pod that runs the attempt of `order` on the `index`-th node of its gang, named
    after `group` (with `-{index}` in a gang of several)."""
    node = order["nodes"][index]["node"]
    name = group if len(order["nodes"]) == 1 else f"{group}-{index}"
    gpus = len(order["nodes"][index]["gpu_indices"])
    grace = int(float(order["grace_seconds"]))
    labels = {
        MANAGED_BY: "gpu-quota-portal",
        CONNECTOR_LABEL: label_value(connector),
        SHARE_LABEL: label_value(order["share"]),
        JOB_LABEL: str(order["job"]),
        ATTEMPT_LABEL: str(order["attempt"]),
    }
    annotations = {
        GANG_ANNOTATION: ",".join(a["node"] for a in order["nodes"]),
        GROUP_ANNOTATION: group,
        GRACE_ANNOTATION: str(grace),
    }
    volume: dict = {"name": CHECKPOINT_VOLUME}
    if checkpoint_claim:
        volume["persistentVolumeClaim"] = {"claimName": checkpoint_claim}
    else:
        volume["hostPath"] = {"path": str(checkpoint_root), "type": "DirectoryOrCreate"}
    container = {
        "name": CONTAINER,
        "image": image,
        "command": ["/bin/sh", "-c", shell_line(order["command"])],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        # The container runtime makes a working directory the image does not have.
        "workingDir": order.get("working_dir") or env["CHECKPOINT_DIR"],
        "resources": {"limits": {GPU_RESOURCE: str(gpus)}, "requests": {GPU_RESOURCE: str(gpus)}},
        "volumeMounts": [{"name": CHECKPOINT_VOLUME, "mountPath": str(checkpoint_root)}],
    }
    spec = {
        "nodeName": node,
        "restartPolicy": "Never",
        # The kubelet's smallest grace is 2 s, whatever is asked; 0 would be a forced delete.
        "terminationGracePeriodSeconds": max(1, grace),
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "hostNetwork": host_network,
        "containers": [container],
        "volumes": [volume],
    }
    timeout = order.get("timeout_seconds")
    if timeout:
        # The connector stops it at its timeout; this is only the backstop.
        spec["activeDeadlineSeconds"] = int(timeout) + grace + 60
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },  # fmt: skip
        "spec": spec,
    }
    return merge_template(pod, template) if template else pod


# What of a pod template the connector keeps its own: where and how the job runs.
OWN_SPEC = frozenset(("nodeName", "restartPolicy", "terminationGracePeriodSeconds",
                      "activeDeadlineSeconds", "containers"))  # fmt: skip
OWN_CONTAINER = frozenset(("name", "image", "command", "args", "workingDir"))


def merge_template(pod: dict, template: dict) -> dict:
    """`pod` with what the site's pod template adds (tolerations, a runtime class, image pull
    secrets, a security context, more volumes, labels; the first container's resources, env
    and mounts beside the job's): the template never moves the pod off its node, never changes
    its command, image or GPUs."""
    metadata = template.get("metadata") or {}
    for key in ("labels", "annotations"):
        pod["metadata"][key] = {**(metadata.get(key) or {}), **pod["metadata"][key]}
    spec = template.get("spec") or {}
    for key, value in spec.items():
        if key in OWN_SPEC:
            continue
        if key == "volumes":
            pod["spec"]["volumes"] = [*pod["spec"]["volumes"], *value]
        elif key != "hostNetwork" or value:
            pod["spec"][key] = value
    extra = (spec.get("containers") or [{}])[0]
    container = pod["spec"]["containers"][0]
    for key, value in extra.items():
        if key in OWN_CONTAINER:
            continue
        if key == "env":
            names = {e["name"] for e in container["env"]}
            container["env"] = [*[e for e in value if e.get("name") not in names],
                                *container["env"]]  # fmt: skip
        elif key == "volumeMounts":
            container["volumeMounts"] = [*container["volumeMounts"], *value]
        elif key == "resources":
            for kind in ("limits", "requests"):
                container["resources"][kind] = {**(value.get(kind) or {}),
                                                 **container["resources"][kind]}  # fmt: skip
        else:
            container[key] = value
    return pod


# --- Watching ----------------------------------------------------------------------------------


class WatchExpired(Exception):
    """410 Gone: the resourceVersion a watch resumes from is older than the API server keeps."""


@dataclass
class Informer:
    """A list, then a watch from its resourceVersion, of one kind of object, kept in `on_event`'s
    hands: ADDED, MODIFIED, DELETED for each change, and ("LISTED", objects) after each list.
    A watch that ends (as the API server ends them) resumes from the last resourceVersion seen;
    one that has expired (410) is replaced by a new list."""

    name: str
    list_path: str
    request: Callable[..., object]  # (method, path, query) → urllib3 response
    on_event: Callable[[str, object], None]
    stopping: threading.Event
    label_selector: str = ""
    resource_version: str | None = None
    healthy: threading.Event = field(default_factory=threading.Event)
    synced: threading.Event = field(default_factory=threading.Event)  # one list done
    relists: int = 0

    def run(self) -> None:
        failures = 0
        while not self.stopping.is_set():
            try:
                if self.resource_version is None:
                    self._list()
                self._watch()
                failures = 0
            except WatchExpired:
                logger.info("%s watch expired; listing again", self.name)
                self.resource_version = None
            except ClusterRefused as error:
                self.healthy.clear()
                logger.warning("%s: %s", self.name, error)
                failures += 1
            except ClusterUnreachable as error:
                if self.healthy.is_set():
                    logger.warning("%s watch lost (%s)", self.name, error)
                self.healthy.clear()
                failures += 1
            except Exception:  # an answer it cannot read: never a cache frozen without a word
                logger.exception("%s watch failed; listing again", self.name)
                self.healthy.clear()
                self.resource_version = None
                failures += 1
            if failures:
                self.stopping.wait(RETRY_SECONDS[min(failures, len(RETRY_SECONDS)) - 1])

    def _query(self, **extra) -> dict:
        query = dict(extra)
        if self.label_selector:
            query["labelSelector"] = self.label_selector
        return query

    def _list(self) -> None:
        response = self.request("GET", self.list_path, self._query(), timeout=(5.0, 120.0))
        body = json.loads(response.data)
        self.resource_version = body["metadata"]["resourceVersion"]
        self.relists += 1
        self.on_event("LISTED", body.get("items") or [])
        self.synced.set()
        self.healthy.set()

    def _watch(self) -> None:
        query = self._query(watch="true", resourceVersion=self.resource_version,
                            allowWatchBookmarks="true",
                            timeoutSeconds=str(WATCH_SECONDS))  # fmt: skip
        response = self.request("GET", self.list_path, query, timeout=(5.0, WATCH_READ_SECONDS))
        self.healthy.set()
        try:
            for line in _lines(response):
                if self.stopping.is_set():
                    return
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise WatchExpired()
                    raise ClusterUnreachable(f"watch error: {obj.get('message')}")
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version:
                    self.resource_version = version
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self.on_event(kind, obj)
        finally:
            response.close()  # a watch left unread is no connection to reuse
            response.release_conn()


def _lines(response) -> Iterator[bytes]:
    """The lines of a watch's chunked answer, as they arrive."""
    pending = b""
    try:
        for chunk in response.stream(64 * 1024, decode_content=False):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            yield from (line for line in lines if line.strip())
    except Exception as error:  # urllib3's protocol and timeout errors, a reset socket
        raise ClusterUnreachable(f"watch: {error}") from error
    if pending.strip():
        yield pending


# --- The cluster -------------------------------------------------------------------------------


@dataclass
class KubernetesCluster:
    """The GPU nodes of a Kubernetes cluster (all of them, or those `node_selector` picks) and
    the pods the connector runs there, in `namespace`, named `{prefix}-{share}-job{J}-a{A}`
    (and `-{i}` for each node of a gang) so that `kubectl get pods` shows whose they are."""

    namespace: str = "gpu-portal"
    connector: str = "kubernetes"  # the connector's name: its pods' label
    prefix: str = "portal"
    image: str = ""  # for jobs that name none
    gpu_label: str = PRODUCT_LABEL
    default_gpu_type: str | None = None  # for nodes without the label
    node_gpu_types: dict[str, str] = field(default_factory=dict)  # node name or glob → type
    product_types: dict[str, str] = field(default_factory=dict)  # label value → type
    node_selector: str = ""
    checkpoint_root: Path = Path("/var/lib/gpu-portal/checkpoints")
    checkpoint_claim: str | None = None  # a ReadWriteMany claim instead of a hostPath
    host_network: bool = False
    pod_template: dict | None = None
    kubeconfig: str | None = None
    context: str | None = None

    kind = "kubernetes"
    manager = "Kubernetes"
    enforces_grace = True  # the kubelet kills a deleted pod's containers after its grace
    # A pod bound to its node holds its GPUs from the kubelet's admission, before it starts.
    holds_while_pending = True

    def __post_init__(self) -> None:
        self.api = None  # the kubernetes client's ApiClient, made by start()
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.node_objects: dict[str, dict] = {}
        self.pod_usage: dict[str, tuple[str, int]] = {}  # uid → (node, GPUs) while it holds them
        self.ours: dict[str, dict[str, dict]] = {}  # job id → pod name → pod
        self.deleted: dict[str, set[str]] = {}  # job id → names of its pods that are gone
        self.forgotten: set[str] = set()  # jobs reported ended whose pods may still be listed
        self.stops: set[str] = set()  # jobs whose pods the connector deleted (a stop order)
        self.last_sweep = 0.0
        self.informers: list[Informer] = []
        self.selector = f"{CONNECTOR_LABEL}={label_value(self.connector)}"

    # --- The API server ------------------------------------------------------------------------

    def load_credentials(self) -> None:
        """Read the credentials (--kubeconfig, KUBECONFIG, ~/.kube/config, or the pod's service
        account) now, not at the first request: ClusterRefused when there are none, which no
        retry mends."""
        if self.api is None:
            self.api = self._client()

    def _client(self):
        from kubernetes import client, config

        configuration = client.Configuration()
        try:
            if self.kubeconfig or not _in_cluster():
                config.load_kube_config(config_file=self.kubeconfig, context=self.context,
                                        client_configuration=configuration)  # fmt: skip
            else:
                config.load_incluster_config(client_configuration=configuration)
        except Exception as error:  # the client's own ConfigException, a missing file
            raise ClusterRefused(f"no Kubernetes credentials: {error}") from error
        configuration.connection_pool_maxsize = 8
        return client.ApiClient(configuration)

    def _request(self, method: str, path: str, query: dict | None = None, *, body=None,
                 timeout=REQUEST_TIMEOUT):  # fmt: skip
        """One call to the API server, its answer unparsed. Raises ClusterUnreachable (no
        answer, or a 5xx), WatchExpired (410 Gone) or ClusterRefused (another 4xx)."""
        from kubernetes.client.exceptions import ApiException

        if self.api is None:
            self.api = self._client()
        try:
            return self.api.call_api(
                path, method, query_params=list((query or {}).items()),
                header_params={"Accept": "application/json", "Content-Type": "application/json"},
                body=body, auth_settings=["BearerToken"], _preload_content=False,
                _request_timeout=timeout,
            )[0]  # fmt: skip
        except ApiException as error:
            if error.status == 410:
                raise WatchExpired() from error
            message = _status_message(error)
            if error.status and 400 <= error.status < 500:
                raise ClusterRefused(f"{method} {path}: {error.status} {message}") from error
            raise ClusterUnreachable(f"{method} {path}: {error.status} {message}") from error
        except Exception as error:  # urllib3's: refused, reset, timed out, TLS
            raise ClusterUnreachable(f"{method} {path}: {error}") from error

    def start(self) -> None:
        """Watch the nodes and the pods, in threads, and wait (a while) for the first lists."""
        if self.informers:
            return
        node_list = "/api/v1/nodes"
        self.informers = [
            Informer("nodes", node_list, self._request, self._node_event, self.stopping,
                     label_selector=self.node_selector),
            Informer("pods", "/api/v1/pods", self._request, self._pod_event, self.stopping),
        ]  # fmt: skip
        for informer in self.informers:
            threading.Thread(target=informer.run, name=f"watch-{informer.name}",
                             daemon=True).start()  # fmt: skip
        deadline = time.monotonic() + SYNC_WAIT_SECONDS
        for informer in self.informers:
            informer.synced.wait(max(0.0, deadline - time.monotonic()))

    def stop(self) -> None:
        self.stopping.set()

    def _check(self) -> None:
        """The cache may be read: both watches are up. Raises ClusterUnreachable."""
        if not self.informers:
            self.start()
        for informer in self.informers:
            if not (informer.synced.is_set() and informer.healthy.is_set()):
                raise ClusterUnreachable(f"the API server does not answer ({informer.name})")

    # --- The cache -----------------------------------------------------------------------------

    def _node_event(self, kind: str, obj) -> None:
        with self.lock:
            if kind == "LISTED":
                self.node_objects = {n["metadata"]["name"]: n for n in obj}
            elif kind == "DELETED":
                self.node_objects.pop(obj["metadata"]["name"], None)
            else:
                self.node_objects[obj["metadata"]["name"]] = obj

    def _pod_event(self, kind: str, obj) -> None:
        with self.lock:
            if kind == "LISTED":
                self._relisted(obj)
                return
            self._take_pod(obj, gone=kind == "DELETED")

    def _take_pod(self, pod: dict, *, gone: bool) -> None:
        metadata = pod["metadata"]
        uid = metadata.get("uid", metadata["name"])
        if not gone and holds_gpus(pod) and pod_gpus(pod):
            self.pod_usage[uid] = (pod["spec"]["nodeName"], pod_gpus(pod))
        else:
            self.pod_usage.pop(uid, None)
        job_id = self._job_of(pod)
        if job_id is None:
            return
        name = metadata["name"]
        if gone:
            if job_id in self.forgotten:
                self.ours.get(job_id, {}).pop(name, None)
                if not self.ours.get(job_id):
                    self._drop(job_id)
                return
            # Kept, with its last state: the attempt's end is read from it.
            self.ours.setdefault(job_id, {})[name] = pod
            self.deleted.setdefault(job_id, set()).add(name)
        else:
            self.ours.setdefault(job_id, {})[name] = pod

    def _drop(self, job_id: str) -> None:
        """Nothing of the job is left: what is known of it goes."""
        self.ours.pop(job_id, None)
        self.deleted.pop(job_id, None)
        self.forgotten.discard(job_id)
        self.stops.discard(job_id)

    def _relisted(self, pods: list[dict]) -> None:
        """A new list: pods of ours that were known and are not listed any more went while the
        watch was away (deleted, with their last state as last seen)."""
        listed = {p["metadata"]["name"] for p in pods if self._job_of(p) is not None}
        for job_id, known in list(self.ours.items()):
            for name, pod in list(known.items()):
                if name not in listed and name not in self.deleted.get(job_id, set()):
                    self._take_pod(pod, gone=True)
        self.pod_usage = {}
        for pod in pods:
            self._take_pod(pod, gone=False)

    def _job_of(self, pod: dict) -> str | None:
        """The job id of one of the connector's pods; None for any other pod."""
        metadata = pod["metadata"]
        labels = metadata.get("labels") or {}
        if metadata.get("namespace") != self.namespace or labels.get(CONNECTOR_LABEL) != (
            label_value(self.connector)
        ):
            return None
        group = (metadata.get("annotations") or {}).get(GROUP_ANNOTATION)
        if not labels.get(ATTEMPT_LABEL, "").isdigit() or not group:
            return None
        return f"{self.namespace}/{group}"

    def _group_name(self, order: dict) -> str:
        share = dns_name(order["share"])[:40]
        return f"{dns_name(self.prefix)}-{share}-job{order['job']}-a{order['attempt']}"

    # --- The Cluster interface ------------------------------------------------------------------

    def discover(self) -> None:
        """Kubernetes keeps no record of a pod once it is gone: the cache is all there is."""

    def gpu_type_of(self, node: dict) -> str | None:
        name = node["metadata"]["name"]
        for pattern, gpu_type in self.node_gpu_types.items():
            if fnmatchcase(name, pattern):
                return gpu_type
        product = ((node["metadata"].get("labels") or {}).get(self.gpu_label) or "").strip()
        if product:
            return self.product_types.get(product) or gpu_type_name(product) or None
        return self.default_gpu_type

    def nodes(self) -> list[KubeNode]:
        """The GPU nodes (without a GPU type known: left out, with a warning)."""
        self._check()
        with self.lock:
            objects = list(self.node_objects.values())
            used: dict[str, int] = {}
            for node, gpus in self.pod_usage.values():
                used[node] = used.get(node, 0) + gpus
        nodes = []
        tolerations = ((self.pod_template or {}).get("spec") or {}).get("tolerations") or []
        for obj in objects:
            gpu_type = self.gpu_type_of(obj)
            view = node_view(obj, used_gpus=used.get(obj["metadata"]["name"], 0),
                             gpu_type=gpu_type, tolerations=tolerations)  # fmt: skip
            if view is None:
                continue
            if gpu_type is None:
                logger.warning("node %s: no %s label; give its GPU type with --gpu-type",
                               view.name, self.gpu_label)  # fmt: skip
                continue
            nodes.append(view)
        return nodes

    def attempt_jobs(self) -> dict[int, KubeJob]:
        self._check()
        with self.lock:
            groups = {job_id: list(pods.values()) for job_id, pods in self.ours.items()
                      if job_id not in self.forgotten}  # fmt: skip
            deleted = {job_id: set(names) for job_id, names in self.deleted.items()}
            stops = set(self.stops)
            down = {name: why for name, obj in self.node_objects.items()
                    if (why := down_reason(obj)) is not None}  # fmt: skip
        jobs = {}
        for job_id, pods in groups.items():
            attempt = int(pods[0]["metadata"]["labels"][ATTEMPT_LABEL])
            gang = (pods[0]["metadata"].get("annotations") or {}).get(GANG_ANNOTATION, "")
            expected = len(gang.split(",")) if gang else 1
            job = attempt_job(job_id, pods, expected=expected, deleted=deleted.get(job_id, set()),
                              down=down, stopped=job_id in stops)  # fmt: skip
            if job.end is None and expected > 1:
                self._stop_gang_on_failure(job, pods)
            jobs[attempt] = job
        self._sweep()
        return jobs

    def _sweep(self) -> None:
        """Delete again, every few seconds, the pods of ended jobs that are still there and
        not being deleted (the API server did not answer `forget`'s delete)."""
        now = time.monotonic()
        if now - self.last_sweep < SWEEP_SECONDS:
            return
        self.last_sweep = now
        with self.lock:
            left = [
                name
                for job_id in self.forgotten
                for name, pod in self.ours.get(job_id, {}).items()
                if not pod["metadata"].get("deletionTimestamp")
                and name not in self.deleted.get(job_id, set())
            ]
        for name in left:
            with contextlib.suppress(ClusterRefused, ClusterUnreachable):
                self._delete_pod(name, grace=None)

    def _stop_gang_on_failure(self, job: KubeJob, pods: list[dict]) -> None:
        """A gang is one job: one of its containers that failed stops the others (as Slurm's
        srun --kill-on-bad-exit does)."""
        failed = [p for p in pods if (_terminated(p) or {}).get("exitCode", 0) != 0]
        if not failed:
            return
        with self.lock:
            self.stops.add(job.id)
        for pod in pods:
            if _terminated(pod) or pod["metadata"].get("deletionTimestamp"):
                continue
            grace = int((pod["metadata"].get("annotations") or {}).get(GRACE_ANNOTATION, 0))
            with contextlib.suppress(ClusterRefused, ClusterUnreachable):
                self._delete_pod(pod["metadata"]["name"], grace=grace)

    def ended_job(self, job_id: str) -> KubeJob | None:
        return None

    def submit(self, order: dict, *, env: dict[str, str], log: Path) -> str:
        """Create the attempt's pods, one on each node of its gang. Returns the job's id (its
        pods' namespace/name, less the node suffix)."""
        image = order.get("image") or self.image
        if not image:
            raise ClusterRefused("the job names no image, and the connector has no --image")
        group = self._group_name(order)
        created = []
        for index in range(len(order["nodes"])):
            pod = pod_manifest(
                order=order, env=env, namespace=self.namespace, group=group, index=index,
                image=image, connector=self.connector, checkpoint_root=self.checkpoint_root,
                checkpoint_claim=self.checkpoint_claim, host_network=self.host_network,
                template=self.pod_template,
            )  # fmt: skip
            name = pod["metadata"]["name"]
            try:
                self._request("POST", f"/api/v1/namespaces/{self.namespace}/pods",
                              body=pod)  # fmt: skip
            except ClusterRefused as error:
                if " 409 " not in str(error):  # already there: made before a restart
                    for made in created:
                        with contextlib.suppress(ClusterRefused, ClusterUnreachable):
                            self._delete_pod(made, grace=0)
                    raise
            created.append(name)
        return f"{self.namespace}/{group}"

    def _delete_pod(self, name: str, *, grace: int | None) -> None:
        body = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace is not None:
            body["gracePeriodSeconds"] = grace
        try:
            self._request("DELETE", f"/api/v1/namespaces/{self.namespace}/pods/{name}", body=body)
        except ClusterRefused as error:
            if " 404 " not in str(error):
                raise

    def _pod_names(self, job_id: str) -> list[str]:
        """The job's pods that are still there; its stop is the connector's from now on."""
        with self.lock:
            self.stops.add(job_id)
            names = set(self.ours.get(job_id, {})) - self.deleted.get(job_id, set())
        return sorted(names)

    def terminate(self, job_id: str, *, grace: float, started: bool) -> None:
        """Delete the job's pods with the grace period: the kubelet sends SIGTERM, then
        SIGKILL after it (at least 1 s: a grace of 0 would be a forced delete, which removes
        the pod before its containers have stopped)."""
        for name in self._pod_names(job_id):
            self._delete_pod(name, grace=max(1, int(grace)))

    def kill(self, job_id: str) -> None:
        """Shorten the pods' grace to its least."""
        for name in self._pod_names(job_id):
            self._delete_pod(name, grace=1)

    def forget(self, job_id: str) -> None:
        """Delete the ended job's pods (each with its own grace: a pod whose containers have
        ended goes at once; one on a node that is down waits for its kubelet, holding its GPUs
        as the node's until then)."""
        with self.lock:
            self.forgotten.add(job_id)
            names = set(self.ours.get(job_id, {})) - self.deleted.get(job_id, set())
            if not names:
                self._drop(job_id)
        for name in sorted(names):
            self._delete_pod(name, grace=None)

    def describe(self, job: KubeJob, *, waited: float) -> dict:
        """The pods' id; the GPU indices are the device plugin's, which the API does not
        tell."""
        return {"id": job.id, "allocations": []}

    def log_tail(self, job_id: str, log: Path) -> str:
        """The first pod's log, through the API server (the kubelet keeps it)."""
        with self.lock:
            names = sorted(self.ours.get(job_id, {}))
        if not names:
            return ""
        response = self._request(
            "GET", f"/api/v1/namespaces/{self.namespace}/pods/{names[0]}/log",
            {"container": CONTAINER, "limitBytes": str(LOG_TAIL_CHARS * 4), "tailLines": "200"},
        )  # fmt: skip
        return response.data.decode(errors="replace")[-LOG_TAIL_CHARS:]


def read_pod_template(path: str) -> dict:
    """The pod of `--pod-template`, a YAML (or JSON) object; ValueError says what is wrong."""
    import yaml  # from the kubernetes extra, as the client is

    try:
        template = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(str(error)) from error
    if not isinstance(template, dict):
        raise ValueError("not a pod (a YAML or JSON object).")
    return template


def kubeconfig_cluster_name(kubeconfig: str | None, context: str | None) -> str:
    """The cluster name of the kubeconfig's context (the current one by default), as a portal
    connector's name; "" when there is none."""
    with contextlib.suppress(Exception):  # no kubeconfig, an unreadable one: no name
        from kubernetes import config

        contexts, current = config.list_kube_config_contexts(config_file=kubeconfig)
        chosen = (
            next((c for c in contexts if c["name"] == context), current) if context else current
        )
        return dns_name(chosen["context"]["cluster"]) if chosen else ""
    return ""


def _in_cluster() -> bool:
    return Path("/var/run/secrets/kubernetes.io/serviceaccount/token").exists()


def _status_message(error) -> str:
    with contextlib.suppress(ValueError, TypeError):
        return json.loads(error.body).get("message", "")
    return str(error.reason or "")
