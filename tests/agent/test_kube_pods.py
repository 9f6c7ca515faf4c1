"""The Kubernetes connector reads its attempts from the pods' JSON as the API server sends it
(the shapes below are those kube-apiserver 1.20 and its kubelet wrote here, on the cluster of
scripts/k8s_up.sh), and writes its pods from the portal's run orders. The live tests
(tests/kubernetes/) run the same code on the real API server and kubelet."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.agent.kube import (
    ATTEMPT_LABEL,
    GANG_ANNOTATION,
    GPU_RESOURCE,
    attempt_job,
    down_reason,
    gpu_type_name,
    holds_gpus,
    merge_template,
    node_view,
    pod_gpus,
    pod_manifest,
    read_pod_template,
)
from scheduler.agent.protocol import (
    END_EXIT,
    END_LOST,
    END_NEVER_STARTED,
    END_TIMEOUT,
    END_WITHDRAWN,
)

STARTED = "2026-12-02T06:00:00Z"


def pod(name="portal-research-job5-a11", node="kube1", gpus=2, phase="Running", state=None,
        reason="", message="", deleting=False, gang="kube1") -> dict:  # fmt: skip
    """A pod of the connector's as the API server shows it."""
    statuses = [{"name": "job", "state": state, "ready": "running" in state}] if state else []
    metadata = {
        "name": name, "namespace": "gpu-portal", "uid": f"uid-{name}",
        "labels": {ATTEMPT_LABEL: "11"}, "annotations": {GANG_ANNOTATION: gang},
    }  # fmt: skip
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-02T06:01:00Z"
        metadata["deletionGracePeriodSeconds"] = 2
    status = {"phase": phase, "containerStatuses": statuses}
    if reason:
        status.update(reason=reason, message=message)
    asked = {GPU_RESOURCE: str(gpus)}
    container = {"name": "job", "image": "busybox",
                 "resources": {"limits": asked, "requests": asked}}  # fmt: skip
    return {"metadata": metadata, "spec": {"nodeName": node, "containers": [container]},
            "status": status}  # fmt: skip


def running() -> dict:
    return {"running": {"startedAt": STARTED}}


def waiting(reason: str, message: str = "") -> dict:
    return {"waiting": {"reason": reason, "message": message}}


def terminated(code: int, reason: str = "", finished: str = "2026-12-02T06:02:00Z") -> dict:
    return {"terminated": {"exitCode": code, "reason": reason or ("Completed" if code == 0
            else "Error"), "startedAt": STARTED, "finishedAt": finished}}  # fmt: skip


def read(pods, *, expected=1, deleted=(), down=None, stopped=False):
    return attempt_job("gpu-portal/portal-research-job5-a11", pods, expected=expected,
                       deleted=set(deleted), down=down or {}, stopped=stopped)  # fmt: skip


def test_a_pod_whose_container_runs_is_a_running_attempt_holding_its_gpus():
    job = read([pod(state=running())])
    assert (job.holding, job.pending, job.end) == (True, False, None)
    assert (job.nodes, job.gpus_per_node) == (("kube1",), 2)


def test_a_pod_still_creating_its_container_is_pending():
    job = read([pod(phase="Pending", state=waiting("ContainerCreating"))])
    assert (job.pending, job.holding, job.end, job.nodes) == (True, False, None, ())
    assert job.reason == "ContainerCreating"
    assert read([pod(phase="Pending")]).pending  # not even a container status yet


def test_an_ended_container_ends_the_attempt_with_its_exit_code():
    assert (read([pod(phase="Succeeded", state=terminated(0))]).end, read(
        [pod(phase="Succeeded", state=terminated(0))]).exit_code) == (END_EXIT, 0)  # fmt: skip
    failed = read([pod(phase="Failed", state=terminated(3))])
    assert (failed.end, failed.exit_code, failed.nodes) == (END_EXIT, 3, ("kube1",))


def test_the_attempt_ends_when_its_container_has_terminated_not_when_the_pod_is_gone():
    """A pod being deleted (grace running, the kubelet has not removed it): once its container
    has terminated, the attempt has ended (143: the SIGTERM of the stop)."""
    job = read([pod(phase="Running", state=terminated(143), deleting=True)], stopped=True)
    assert (job.end, job.exit_code) == (END_EXIT, 143)
    still = read([pod(phase="Running", state=running(), deleting=True)], stopped=True)
    assert still.end is None and still.holding


def test_a_gang_runs_once_every_pod_runs_and_ends_with_the_first_failure():
    one = pod(name="g-0", node="kube1", state=running(), gang="kube1,sim1")
    two = pod(name="g-1", node="sim1", phase="Pending", state=waiting("ContainerCreating"),
              gang="kube1,sim1")  # fmt: skip
    assert read([one, two], expected=2).pending
    assert read([one], expected=2).pending  # its second pod not seen yet
    two = pod(name="g-1", node="sim1", state=running(), gang="kube1,sim1")
    job = read([one, two], expected=2)
    assert job.holding and job.nodes == ("kube1", "sim1")
    first = pod(name="g-0", node="kube1", phase="Failed", state=terminated(4, finished=STARTED))
    then = pod(name="g-1", node="sim1", phase="Failed", state=terminated(143))
    assert read([first, then], expected=2).exit_code == 4
    assert read([first, two], expected=2).end is None  # the other still runs


@pytest.mark.parametrize(
    ("status", "end", "words"),
    [
        ({"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: "
          "memory."}, END_LOST, "evicted by the kubelet of kube1"),
        ({"phase": "Failed", "reason": "OutOfnvidia.com/gpu", "message": "Pod Node didn't have "
          "enough resource: nvidia.com/gpu, requested: 2, used: 8, capacity: 8"}, END_WITHDRAWN,
         "the kubelet of kube1 refused it (OutOfnvidia.com/gpu"),
        ({"phase": "Failed", "reason": "DeadlineExceeded", "message": "Pod was active on the node "
          "longer than the specified deadline"}, END_TIMEOUT, "DeadlineExceeded"),
    ],
)  # fmt: skip
def test_what_a_kubelet_did_to_a_pod_reads_as_the_attempts_end(status, end, words):
    one = pod()
    one["status"] = {**status, "containerStatuses": []}
    job = read([one])
    assert job.end == end and words in job.reason


@pytest.mark.parametrize("why", ["ErrImagePull", "ImagePullBackOff", "InvalidImageName",
                                 "CreateContainerConfigError"])  # fmt: skip
def test_a_container_that_cannot_start_ends_the_attempt_never_started(why):
    job = read([pod(phase="Pending", state=waiting(why, 'Back-off pulling image "nope"'))])
    assert job.end == END_NEVER_STARTED
    assert job.reason.startswith(f"image busybox: {why}")


def test_a_command_that_cannot_run_ends_the_attempt_never_started():
    message = 'exec: "trian": executable file not found in $PATH'
    state = {"terminated": {"exitCode": 128, "reason": "StartError", "message": message,
                            "startedAt": "1970-01-01T00:00:00Z"}}  # fmt: skip
    job = read([pod(phase="Failed", state=state)])
    assert (job.end, job.nodes) == (END_NEVER_STARTED, ())
    assert "executable file not found" in job.reason


def test_a_pod_on_a_node_that_is_down_is_lost_with_its_node():
    job = read([pod(state=running())], down={"kube1": "NotReady (NodeStatusUnknown)"})
    assert (job.end, job.state) == (END_LOST, "NodeLost")
    assert job.reason == "node kube1 NotReady (NodeStatusUnknown)"
    # A pod that had ended before its node went down ended as it did.
    assert read([pod(phase="Succeeded", state=terminated(0))], down={"kube1": "x"}).end == END_EXIT


def test_pods_deleted_by_someone_else_lose_the_attempt_and_the_connectors_own_stop_does_not():
    deleting = pod(phase="Running", state=terminated(143), deleting=True)
    assert read([deleting]).end == END_LOST and "outside the portal" in read([deleting]).reason
    assert read([deleting], stopped=True).end == END_EXIT
    # Forced away (no terminated status ever written): gone while it ran.
    vanished = pod(state=running())
    assert read([vanished], deleted={vanished["metadata"]["name"]}).end == END_LOST
    stopped = read([vanished], deleted={vanished["metadata"]["name"]}, stopped=True)
    assert (stopped.end, stopped.exit_code) == (END_EXIT, None)


def test_gpus_a_pod_holds_are_counted_until_it_has_ended():
    assert pod_gpus(pod(gpus=6)) == 6 and holds_gpus(pod())
    assert holds_gpus(pod(phase="Pending"))  # bound, admitted: its devices are its
    assert not holds_gpus(pod(phase="Succeeded")) and not holds_gpus(pod(phase="Failed"))
    unbound = pod()
    del unbound["spec"]["nodeName"]
    assert not holds_gpus(unbound)
    init = pod(gpus=1)
    init["spec"]["initContainers"] = [{"resources": {"limits": {GPU_RESOURCE: "4"}}}]
    assert pod_gpus(init) == 4


def node(name="kube1", gpus="8", ready="True", unschedulable=False, reason="KubeletReady"):
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": {"capacity": {GPU_RESOURCE: gpus}, "allocatable": {GPU_RESOURCE: gpus},
                   "conditions": [{"type": "Ready", "status": ready, "reason": reason,
                                   "message": "kubelet is posting ready status"}]},
    }  # fmt: skip


def test_node_states_map_to_the_portals():
    ready = node_view(node(), used_gpus=3, gpu_type="h100")
    assert (ready.state, ready.reason, ready.gpus, ready.used_gpus) == ("READY", "", 8, 3)
    cordoned = node_view(node(unschedulable=True), used_gpus=0, gpu_type="h100")
    assert (cordoned.state, cordoned.reason) == ("DRAINING", "Kubernetes: cordoned")
    lost = node(ready="Unknown", reason="NodeStatusUnknown")
    lost["status"]["conditions"][0]["message"] = "Kubelet stopped posting node status."
    down = node_view(lost, used_gpus=0, gpu_type="h100")
    assert down.state == "DOWN"
    assert (
        down.reason
        == "Kubernetes: NotReady (NodeStatusUnknown: Kubelet stopped posting node status.)"
    )
    assert down_reason(lost) == "NotReady (NodeStatusUnknown)" and down_reason(node()) is None
    assert node_view(node(gpus="0"), used_gpus=0, gpu_type="h100") is None  # no GPU: not ours


def test_gpu_product_labels_read_as_portal_gpu_types():
    assert gpu_type_name("NVIDIA-H100-80GB-HBM3") == "h100-80gb-hbm3"
    assert gpu_type_name("Tesla-T4") == "tesla-t4"
    assert gpu_type_name("NVIDIA A100-SXM4-40GB") == "a100-sxm4-40gb"


ORDER = {
    "attempt": 11, "job": 5, "share": "research", "number": 2, "command": "python train.py",
    "env": {"LR": "0.1"}, "image": "", "timeout_seconds": 600, "grace_seconds": 30,
    "nodes": [{"node": "kube1", "gpu_indices": [0, 1]}, {"node": "kube2", "gpu_indices": [4, 5]}],
}  # fmt: skip
ENV = {"LR": "0.1", "JOB_ID": "5", "ATTEMPT": "2", "CHECKPOINT_DIR": "/ckpt/job-5",
       "PREEMPT_GRACE_SECONDS": "30"}  # fmt: skip


def manifest(**extra):
    fields = {"order": ORDER, "env": ENV, "namespace": "gpu-portal",
              "group": "portal-research-job5-a11", "index": 1, "image": "trainer:1",
              "connector": "lab", "checkpoint_root": Path("/ckpt"), "checkpoint_claim": None,
              "host_network": False, **extra}  # fmt: skip
    return pod_manifest(**fields)


def test_a_pod_is_bound_to_its_node_with_its_gpus_command_environment_and_checkpoints():
    made = manifest()
    spec, container = made["spec"], made["spec"]["containers"][0]
    assert made["metadata"]["name"] == "portal-research-job5-a11-1"
    assert made["metadata"]["labels"][ATTEMPT_LABEL] == "11"
    assert made["metadata"]["annotations"][GANG_ANNOTATION] == "kube1,kube2"
    assert (spec["nodeName"], spec["restartPolicy"]) == ("kube2", "Never")
    assert spec["terminationGracePeriodSeconds"] == 30
    assert spec["activeDeadlineSeconds"] == 600 + 30 + 60
    assert container["resources"]["limits"] == {GPU_RESOURCE: "2"}
    assert container["command"] == ["/bin/sh", "-c", "exec python train.py"]
    assert {e["name"]: e["value"] for e in container["env"]} == ENV
    assert container["workingDir"] == "/ckpt/job-5"
    host_path = {"path": "/ckpt", "type": "DirectoryOrCreate"}
    assert spec["volumes"] == [{"name": "checkpoints", "hostPath": host_path}]
    assert container["volumeMounts"] == [{"name": "checkpoints", "mountPath": "/ckpt"}]
    claim = manifest(checkpoint_claim="ckpt-rwx")["spec"]["volumes"][0]
    assert claim == {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt-rwx"}}
    # A grace of 0 would be a forced delete, which removes the pod before its process stops.
    zero = manifest(order={**ORDER, "grace_seconds": 0, "timeout_seconds": None})["spec"]
    assert zero["terminationGracePeriodSeconds"] == 1 and "activeDeadlineSeconds" not in zero


def test_a_pod_starts_the_command_in_the_working_directory_the_job_names():
    """In the container (its runtime makes a directory the image lacks); blank: the job's
    checkpoint directory, as above."""
    named = manifest(order={**ORDER, "working_dir": "/workspace/trainer"})
    assert named["spec"]["containers"][0]["workingDir"] == "/workspace/trainer"
    blank = manifest(order={**ORDER, "working_dir": ""})
    assert blank["spec"]["containers"][0]["workingDir"] == "/ckpt/job-5"


def test_a_pod_template_adds_the_sites_settings_but_never_moves_or_changes_the_job():
    template = {
        "metadata": {"labels": {"team": "ml"}},
        "spec": {"nodeName": "elsewhere", "runtimeClassName": "nvidia",
                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                 "imagePullSecrets": [{"name": "registry"}],
                 "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}],
                 "containers": [{"image": "other", "command": ["rm"],
                                 "env": [{"name": "NCCL_DEBUG", "value": "INFO"},
                                         {"name": "JOB_ID", "value": "forged"}],
                                 "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
                                 "resources": {"limits": {"memory": "64Gi",
                                                          GPU_RESOURCE: "8"}}}]},
    }  # fmt: skip
    made = merge_template(manifest(), template)
    spec, container = made["spec"], made["spec"]["containers"][0]
    assert (spec["nodeName"], spec["runtimeClassName"]) == ("kube2", "nvidia")
    assert spec["tolerations"] and spec["imagePullSecrets"] == [{"name": "registry"}]
    assert [v["name"] for v in spec["volumes"]] == ["checkpoints", "shm"]
    assert (container["image"], container["command"][0]) == ("trainer:1", "/bin/sh")
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NCCL_DEBUG"] == "INFO" and env["JOB_ID"] == "5"
    assert container["resources"]["limits"] == {"memory": "64Gi", GPU_RESOURCE: "2"}
    assert made["metadata"]["labels"]["team"] == "ml"
    assert made["metadata"]["labels"][ATTEMPT_LABEL] == "11"


def test_a_pod_template_is_read_from_yaml_and_anything_but_a_pod_is_refused_saying_why(tmp_path):
    written = tmp_path / "pod.yaml"
    written.write_text("spec:\n  runtimeClassName: nvidia\n")
    assert read_pod_template(str(written)) == {"spec": {"runtimeClassName": "nvidia"}}
    written.write_text("- a list\n")
    with pytest.raises(ValueError, match="not a pod"):
        read_pod_template(str(written))
    with pytest.raises(ValueError, match="No such file"):
        read_pod_template(str(tmp_path / "missing.yaml"))
