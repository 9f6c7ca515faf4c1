"""Objects a real API server sends, as the Kubernetes connector (scheduler.agent.kube) must
read them: pure tests over the objects as the API returns them."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from scheduler.agent.kube import (
    ATTEMPT_LABEL,
    GANG_ANNOTATION,
    GPU_RESOURCE,
    KubernetesCluster,
    attempt_job,
    node_view,
    pod_gpus,
    quantity,
)
from scheduler.agent.protocol import END_LOST, END_NEVER_STARTED, NODE_DRAINING, NODE_READY

STARTED = "2026-12-02T06:00:00Z"


def portal_pod(status: dict) -> dict:
    """One of the connector's pods (one-node attempt) with the given status."""
    asked = {GPU_RESOURCE: "2"}
    return {
        "metadata": {"name": "portal-research-job5-a11", "namespace": "gpu-portal",
                     "uid": "uid-1", "labels": {ATTEMPT_LABEL: "11"},
                     "annotations": {GANG_ANNOTATION: "kube1"}},
        "spec": {"nodeName": "kube1", "restartPolicy": "Never",
                 "containers": [{"name": "job", "image": "trainer:1",
                                 "resources": {"limits": asked, "requests": asked}}]},
        "status": status,
    }  # fmt: skip


def gpu_node(*, gpus: str = "8", taints: list | None = None) -> dict:
    spec: dict = {}
    if taints:
        spec["taints"] = taints
    return {
        "metadata": {"name": "kube1",
                     "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
        "spec": spec,
        "status": {"capacity": {GPU_RESOURCE: gpus}, "allocatable": {GPU_RESOURCE: gpus},
                   "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                   "message": "kubelet is posting ready status"}]},
    }  # fmt: skip


def synced_cluster(**settings) -> KubernetesCluster:
    """A connector whose watches have listed (their cache filled by hand below)."""
    cluster = KubernetesCluster(**settings)
    up = threading.Event()
    up.set()
    cluster.informers = [SimpleNamespace(synced=up, healthy=up)]
    return cluster


# 1. A pod the kubelet itself terminated (graceful node shutdown, e.g. a spot GPU VM reclaimed;
#    or kubelet preemption for a critical pod) is phase Failed with the kubelet's reason and a
#    DisruptionTarget condition; its container has terminated with whatever exit code the job
#    returned on SIGTERM (0 for a job that checkpoints and exits cleanly, as the portal asks).
@pytest.mark.parametrize(
    ("reason", "message", "exit_code"),
    [
        ("Terminated", "Pod was terminated in response to imminent node shutdown.", 0),
        ("Terminated", "Pod was terminated in response to imminent node shutdown.", 143),
        ("Preempting", "Preempted in order to admit critical pod", 143),
    ],
)
def test_a_job_the_kubelet_killed_for_node_shutdown_or_preemption_is_lost_not_finished(
    reason, message, exit_code
):
    status = {
        "phase": "Failed", "reason": reason, "message": message,
        "conditions": [{"type": "DisruptionTarget", "status": "True",
                        "reason": "TerminationByKubelet", "message": message}],
        "containerStatuses": [{"name": "job", "ready": False, "restartCount": 0, "state": {
            "terminated": {"exitCode": exit_code,
                           "reason": "Completed" if exit_code == 0 else "Error",
                           "startedAt": STARTED, "finishedAt": "2026-12-02T06:30:00Z"}}}],
    }  # fmt: skip
    job = attempt_job("gpu-portal/portal-research-job5-a11", [portal_pod(status)], expected=1,
                      deleted=set(), down={})  # fmt: skip
    # As a kubelet's eviction is: the job runs again from its checkpoint, nothing counted
    # against it; never "Succeeded" (exit 0) nor a failure of the job (exit 143).
    assert job.end == END_LOST, (job.state, job.end, job.exit_code)


# 2. A NoExecute taint (`kubectl taint node kube1 maintenance=true:NoExecute`): the kubelet
#    refuses every pod bound there that does not tolerate it (pkg/kubelet/lifecycle/predicate.go,
#    "Kubelet is only interested in the NoExecute taint"), and the taint manager evicts those
#    running. The node must not be offered to the engine as READY.
def test_a_gpu_node_with_a_noexecute_taint_its_pods_do_not_tolerate_is_not_offered_as_ready():
    taint = {"key": "maintenance", "value": "true", "effect": "NoExecute"}
    cluster = synced_cluster(default_gpu_type="h100")
    cluster._node_event("LISTED", [gpu_node(taints=[taint])])
    [view] = cluster.nodes()
    assert view.state != NODE_READY, view


# 3. Native sidecars (init containers with restartPolicy: Always, on by default since 1.29) run
#    beside the app containers for the pod's life: their requests add to the containers' sum
#    (component-helpers resource.PodRequests), and the device manager does not reuse their
#    devices for the app containers.
def test_gpus_of_a_sidecar_init_container_add_to_the_gpus_a_foreign_pod_holds():
    pod = {
        "metadata": {"name": "notebook", "namespace": "ml", "uid": "u-2"},
        "spec": {"nodeName": "kube1",
                 "initContainers": [{"name": "gpu-exporter", "image": "exporter",
                                     "restartPolicy": "Always",
                                     "resources": {"limits": {GPU_RESOURCE: "1"},
                                                   "requests": {GPU_RESOURCE: "1"}}}],
                 "containers": [{"name": "main", "image": "nb",
                                 "resources": {"limits": {GPU_RESOURCE: "2"},
                                               "requests": {GPU_RESOURCE: "2"}}}]},
        "status": {"phase": "Running"},
    }  # fmt: skip
    assert pod_gpus(pod) == 3


# 4. Quantities come back in canonical form: the exponent/suffix as large as possible without
#    losing precision, so a node that advertises 1000 nvidia.com/gpu (time-slicing replicas,
#    which docs/kubernetes.md "Limits" says are counted) is "1k" in node.status.
def test_a_node_whose_gpu_quantity_is_in_canonical_suffix_form_keeps_its_gpus():
    view = node_view(gpu_node(gpus="1k"), used_gpus=0, gpu_type="h100")
    assert view is not None and view.gpus == 1000


def test_a_noexecute_taint_the_pod_template_tolerates_leaves_the_node_ready():
    """A site whose pod template tolerates its GPU nodes' NoExecute taint (a dedicated pool)
    keeps those nodes for the portal."""
    taint = {"key": "dedicated", "value": "gpu", "effect": "NoExecute"}
    for toleration in (
        {"key": "dedicated", "operator": "Exists", "effect": "NoExecute"},
        {"key": "dedicated", "operator": "Equal", "value": "gpu"},
        {"operator": "Exists"},
    ):
        view = node_view(gpu_node(taints=[taint]), used_gpus=0, gpu_type="h100",
                         tolerations=[toleration])  # fmt: skip
        assert view is not None and view.state == NODE_READY, toleration
    other = {"key": "dedicated", "operator": "Equal", "value": "cpu"}
    view = node_view(gpu_node(taints=[taint]), used_gpus=0, gpu_type="h100", tolerations=[other])
    assert view is not None and view.state != NODE_READY


@pytest.mark.parametrize(("text", "value"), [
    ("8", 8), ("1k", 1000), ("1e3", 1000), ("1000m", 1), ("1Ki", 1024), ("0", 0), ("x", None),
])  # fmt: skip
def test_gpu_quantities_are_read_in_every_form_kubernetes_writes(text, value):
    assert quantity(text) == value


# 5. Init containers come from the site's pod template (a data fetch, a sidecar). The portal's
#    pods are restartPolicy Never, so an init container that exits non-zero fails the pod:
#    phase Failed, `kubectl get pod` shows Init:Error, and the job container never leaves
#    "waiting: PodInitializing" (or, once the kubelet's status manager has terminated the pod,
#    ContainerStatusUnknown, exit code 137, never started). Such an attempt was taken for a
#    kubelet's refusal and withdrawn, its job requeued to fail the same way for ever.
FETCH = "registry.example.org/ml/fetch-data:3"
NOT_INITIALIZED = [
    {"type": "Initialized", "status": "False", "reason": "ContainersNotInitialized",
     "message": "containers with incomplete status: [fetch-data]"},
    {"type": "Ready", "status": "False", "reason": "ContainersNotReady",
     "message": "containers with unready status: [job]"},
    {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady",
     "message": "containers with unready status: [job]"},
    {"type": "PodScheduled", "status": "True"},
]  # fmt: skip
JOB_INITIALIZING = {"name": "job", "image": "trainer:1", "imageID": "", "ready": False,
                    "restartCount": 0, "started": False,
                    "state": {"waiting": {"reason": "PodInitializing"}}}  # fmt: skip
JOB_NEVER_LOCATED = {**JOB_INITIALIZING, "state": {"terminated": {
    "exitCode": 137, "reason": "ContainerStatusUnknown",
    "message": "The container could not be located when the pod was terminated"}}}  # fmt: skip


def pod_with_init(status: dict, *, sidecar: bool = False) -> dict:
    pod = portal_pod(status)
    init = {"name": "fetch-data", "image": FETCH, "command": ["/bin/sh", "-c", "fetch"]}
    if sidecar:
        init["restartPolicy"] = "Always"
    pod["spec"]["initContainers"] = [init]
    return pod


def init_status(state: dict, **more) -> dict:
    return {"name": "fetch-data", "image": FETCH, "imageID": "", "ready": False,
            "restartCount": 0, "started": False, "state": state, **more}  # fmt: skip


def read_attempt(pod: dict):
    return attempt_job("gpu-portal/portal-research-job5-a11", [pod], expected=1, deleted=set(),
                       down={})  # fmt: skip


@pytest.mark.parametrize("job_container", [JOB_INITIALIZING, JOB_NEVER_LOCATED])
def test_an_init_container_that_fails_ends_the_attempt_never_started_naming_it(job_container):
    failed = {"exitCode": 3, "reason": "Error", "startedAt": STARTED,
              "finishedAt": "2026-12-02T06:00:04Z",
              "containerID": "containerd://0f3c9e7b2a"}  # fmt: skip
    status = {"phase": "Failed", "conditions": NOT_INITIALIZED, "startTime": STARTED,
              "initContainerStatuses": [init_status({"terminated": failed})],
              "containerStatuses": [job_container]}  # fmt: skip
    job = read_attempt(pod_with_init(status))
    # Never started: the job fails with this reason (retry_attempts applies), as a job whose
    # image cannot be pulled does; never withdrawn and requeued.
    assert job.end == END_NEVER_STARTED, (job.state, job.end, job.reason)
    assert job.reason == "init container fetch-data exited with code 3 (Error)"
    assert job.nodes == ()
    # One that did its work (exit code 0) leaves the attempt to its job.
    done = init_status({"terminated": {**failed, "exitCode": 0, "reason": "Completed"}})
    running = {**JOB_INITIALIZING, "started": True, "state": {"running": {"startedAt": STARTED}}}
    status = {"phase": "Running", "conditions": [{"type": "Initialized", "status": "True"}],
              "initContainerStatuses": [done], "containerStatuses": [running]}  # fmt: skip
    assert read_attempt(pod_with_init(status)).holding


@pytest.mark.parametrize(
    ("why", "message"),
    [
        ("ErrImagePull", f'rpc error: code = NotFound desc = failed to pull and unpack image '
         f'"{FETCH}": not found'),
        ("ImagePullBackOff", f'Back-off pulling image "{FETCH}"'),
        ("InvalidImageName", 'Failed to apply default image tag "Fetch-Data:3": couldn\'t parse '
         'image reference "Fetch-Data:3": invalid reference format: repository name must be '
         "lowercase"),
        ("CreateContainerConfigError", 'secret "dataset-token" not found'),
    ],
)  # fmt: skip
def test_an_init_container_that_cannot_start_ends_the_attempt_and_does_not_wait_for_ever(
    why, message
):
    """Phase Pending, the init container waiting in a state the kubelet will not leave by
    itself, the job container PodInitializing: the pod would wait for ever, and the attempt
    be withdrawn at the connector's pending timeout, again at each requeue."""
    status = {"phase": "Pending", "conditions": NOT_INITIALIZED, "startTime": STARTED,
              "initContainerStatuses": [init_status({"waiting": {"reason": why,
                                                                 "message": message}})],
              "containerStatuses": [JOB_INITIALIZING]}  # fmt: skip
    job = read_attempt(pod_with_init(status))
    assert job.end == END_NEVER_STARTED, (job.state, job.end, job.reason)
    assert job.reason == f"init container fetch-data: image {FETCH}: {why}: {message}"


def test_a_sidecar_that_crashes_before_it_starts_ends_the_attempt_never_started():
    """A native sidecar (restartPolicy Always) is restarted after each exit: one that never
    starts keeps the pod initializing, in CrashLoopBackOff, for ever. Once the pod is
    initialized, a sidecar restarting is no reason to end the attempt: its job container may
    be being created."""
    crashing = init_status(
        {"waiting": {"reason": "CrashLoopBackOff",
                     "message": "back-off 40s restarting failed container=fetch-data "
                     "pod=portal-research-job5-a11_gpu-portal(uid-1)"}},
        restartCount=3,
        lastState={"terminated": {"exitCode": 2, "reason": "Error", "startedAt": STARTED,
                                  "finishedAt": "2026-12-02T06:00:01Z"}},
    )  # fmt: skip
    status = {"phase": "Pending", "conditions": NOT_INITIALIZED, "startTime": STARTED,
              "initContainerStatuses": [crashing],
              "containerStatuses": [JOB_INITIALIZING]}  # fmt: skip
    job = read_attempt(pod_with_init(status, sidecar=True))
    assert job.end == END_NEVER_STARTED, (job.state, job.end, job.reason)
    assert job.reason == (
        "init container fetch-data exited with code 2 (Error), restarted 3 times (CrashLoopBackOff)"
    )
    initialized = [{"type": "Initialized", "status": "True"},
                   {"type": "PodScheduled", "status": "True"}]  # fmt: skip
    creating = {**JOB_INITIALIZING, "state": {"waiting": {"reason": "ContainerCreating"}}}
    status = {"phase": "Pending", "conditions": initialized,
              "initContainerStatuses": [crashing], "containerStatuses": [creating]}  # fmt: skip
    assert read_attempt(pod_with_init(status, sidecar=True)).pending


# 5. Node-pressure eviction: while a node reports MemoryPressure, DiskPressure or PIDPressure,
#    its kubelet evicts pods and rejects new ones. The portal's pods are bound by nodeName, so
#    the node.kubernetes.io/*-pressure NoSchedule taints do not keep them off.
@pytest.mark.parametrize("condition", ["MemoryPressure", "DiskPressure", "PIDPressure"])
def test_a_node_under_pressure_is_draining_so_its_evicted_jobs_are_not_placed_there_again(
    condition,
):
    node = gpu_node()
    node["status"]["conditions"].append(
        {"type": condition, "status": "True", "reason": f"Kubelet Has {condition}",
         "message": "kubelet has disk pressure"}
    )  # fmt: skip
    view = node_view(node, used_gpus=0, gpu_type="h100")
    assert (view.state, view.reason) == (
        NODE_DRAINING, f"Kubernetes: {condition}: kubelet has disk pressure"
    )  # fmt: skip
    node["status"]["conditions"][-1]["status"] = "False"
    assert node_view(node, used_gpus=0, gpu_type="h100").state == NODE_READY
