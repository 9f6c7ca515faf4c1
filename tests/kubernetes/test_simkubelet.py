"""The simulated kubelet (tests/kubernetes/simkubelet.py) against a real Kubernetes control
plane (scripts/k8s_up.sh): its nodes are Ready for the real node lifecycle controller, it
admits and runs pods like a kubelet, deletes them gracefully like one (terminated status
first, then the pod gone), and a node of it that dies goes NotReady, then comes back."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.live import wait_for

pytestmark = pytest.mark.live

SIMKUBELET = Path(__file__).with_name("simkubelet.py")
GPU = "nvidia.com/gpu"
# Trap SIGTERM and exit 0 (a clean shutdown), or ignore it (to be SIGKILLed).
CLEAN_EXIT = 'echo gpus=$CUDA_VISIBLE_DEVICES; trap "echo term; exit 0" TERM; sleep 100 & wait'
STUBBORN = 'trap "" TERM; echo started; while true; do sleep 0.2; done'


@pytest.fixture(scope="module")
def kubeconfig(kube_cluster) -> str:
    """The KUBECONFIG of the test cluster (tests/kubernetes/conftest.py)."""
    kube_cluster.start()
    return kube_cluster.kubeconfig


class Sim:
    """A simulated-kubelet process for `nodes` of 2 GPUs each, driven through its stdin. Its log
    server's certificate is signed by the cluster's CA (k8s_up.sh's $K8S_DIR/pki, beside the
    kubeconfig), which the apiserver checks kubelets' against."""

    def __init__(self, kubeconfig: str, tmp: Path, nodes: list[str]) -> None:
        self.log_dir = tmp / "simkubelet"
        self.output = open(tmp / "simkubelet.log", "ab")  # noqa: SIM115 — closed in stop()
        pki = Path(kubeconfig).parent / "pki"
        self.process = subprocess.Popen(
            [sys.executable, str(SIMKUBELET), "--kubeconfig", kubeconfig,
             "--nodes", ",".join(nodes), "--gpus", "2",
             "--label", "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3",
             "--log-dir", str(self.log_dir), "--control-stdin", "--delete-nodes-on-exit",
             "--ca-cert", str(pki / "ca.crt"), "--ca-key", str(pki / "ca.key")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.output, text=True,
        )  # fmt: skip
        line = self.process.stdout.readline()
        assert "nodes up" in line, (tmp / "simkubelet.log").read_text()

    def command(self, text: str) -> None:
        """Send a control command (die NODE, revive NODE); fail unless it is accepted."""
        self.process.stdin.write(text + "\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline().startswith("ok"), text

    def stop(self) -> None:
        """SIGTERM, as a test run ends it: its processes killed, its nodes deleted."""
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.output.close()


def node_ready(core, name: str) -> str | None:
    """The status of the node's Ready condition ("True", "Unknown", ...)."""
    node = core.read_node(name)
    return next((c.status for c in node.status.conditions or [] if c.type == "Ready"), None)


def pod(name: str, node: str, gpus: int, script: str) -> dict:
    """A pod bound to `node`, asking for `gpus`, that runs `script` with sh."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "job",
                    "image": "busybox",
                    "command": ["sh", "-c", script],
                    "resources": {"limits": {GPU: str(gpus)}},
                }
            ],
        },
    }


def delete_watching(core, namespace: str, name: str, grace: int) -> tuple[list, float]:
    """Delete the pod with `grace` while watching it: its watch events up to its DELETED one,
    and how long that took."""
    from kubernetes import watch

    events = []
    watcher = watch.Watch()

    def collect() -> None:
        for event in watcher.stream(core.list_namespaced_pod, namespace,
                                    field_selector=f"metadata.name={name}",
                                    timeout_seconds=60):  # fmt: skip
            events.append((event["type"], event["object"]))
            if event["type"] == "DELETED":
                watcher.stop()

    thread = threading.Thread(target=collect)
    thread.start()
    wait_for(lambda: events, timeout=10, what="the watch started")  # its ADDED event
    started = time.monotonic()
    core.delete_namespaced_pod(name, namespace, grace_period_seconds=grace)
    thread.join(60)
    assert events and events[-1][0] == "DELETED", [kind for kind, _ in events]
    return events, time.monotonic() - started


@pytest.mark.slow
def test_simulated_kubelet(kubeconfig: str, tmp_path: Path) -> None:
    from kubernetes import client, config

    api_client = config.new_client_from_config(config_file=kubeconfig)
    core = client.CoreV1Api(api_client)
    suffix = uuid.uuid4().hex[:6]
    namespace, a, b = f"simkubelet-{suffix}", f"sim-a-{suffix}", f"sim-b-{suffix}"
    core.create_namespace({"metadata": {"name": namespace}})
    sim = Sim(kubeconfig, tmp_path, [a, b])
    try:
        # Registered as GPU nodes and kept Ready by the real node lifecycle controller.
        wait_for(lambda: node_ready(core, a) == node_ready(core, b) == "True", timeout=30,
                 what="the simulated nodes Ready")  # fmt: skip
        node = core.read_node(a)
        assert node.status.allocatable[GPU] == "2"
        assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        # The namespace's service account, which pod admission may require.
        wait_for(lambda: core.list_namespaced_service_account(namespace).items, timeout=30,
                 what="the namespace's service account")  # fmt: skip

        def phase(name: str) -> str:
            return core.read_namespaced_pod(name, namespace).status.phase

        # Admitted: runs with the GPUs it was given, reported Running.
        core.create_namespaced_pod(namespace, pod("clean", a, 2, CLEAN_EXIT))
        wait_for(lambda: phase("clean") == "Running", timeout=30, what="pod clean Running")
        running = core.read_namespaced_pod("clean", namespace).status
        assert running.pod_ip == "127.0.0.1"
        assert running.container_statuses[0].state.running.started_at
        uid = core.read_namespaced_pod("clean", namespace).metadata.uid
        log = sim.log_dir / a / f"{namespace}_clean_{uid}" / "job.log"
        wait_for(lambda: log.exists() and "gpus=0,1" in log.read_text(), timeout=10,
                 what="the pod's log")  # fmt: skip
        # The same log through the apiserver, which asks the node's kubelet (the simulator).
        assert core.read_namespaced_pod_log("clean", namespace, container="job") == "gpus=0,1\n"

        # Over capacity: refused as the kubelet refuses it.
        core.create_namespaced_pod(namespace, pod("greedy", a, 1, "true"))
        wait_for(lambda: phase("greedy") == "Failed", timeout=30, what="pod greedy Failed")
        refused = core.read_namespaced_pod("greedy", namespace).status
        assert refused.reason == "OutOfnvidia.com/gpu"
        assert "requested: 1, used: 2, capacity: 2" in refused.message

        # Graceful deletion: SIGTERM, the terminated status written, and only then the pod gone.
        for name, grace, code in (("clean", 3, 0), ("stubborn", 2, 137)):
            if name == "stubborn":
                core.create_namespaced_pod(namespace, pod(name, a, 2, STUBBORN))
                wait_for(lambda n=name: phase(n) == "Running", timeout=30, what=f"pod {name}")
            events, took = delete_watching(core, namespace, name, grace)
            assert (grace <= took < grace + 10) if code == 137 else took < grace, took
            before = events[-2][1].status
            terminated = before.container_statuses[0].state.terminated
            assert terminated is not None and terminated.exit_code == code, before
            assert before.phase == ("Succeeded" if code == 0 else "Failed")

        # A node that dies goes NotReady (the controller-manager's grace period); its running
        # pod's process dies with it, which it reports once it is back.
        core.create_namespaced_pod(namespace, pod("doomed", b, 1, STUBBORN))
        wait_for(lambda: phase("doomed") == "Running", timeout=30, what="pod doomed Running")
        sim.command(f"die {b}")
        wait_for(lambda: node_ready(core, b) == "Unknown", timeout=120, what=f"{b} NotReady")
        assert node_ready(core, a) == "True"
        sim.command(f"revive {b}")
        wait_for(lambda: node_ready(core, b) == "True", timeout=30, what=f"{b} Ready again")
        wait_for(lambda: phase("doomed") == "Failed", timeout=30, what="pod doomed Failed")
        ended = core.read_namespaced_pod("doomed", namespace).status
        assert ended.container_statuses[0].state.terminated.exit_code == 137
    finally:
        # Its pods deleted while the simulator still runs, which finalizes their deletion.
        core.delete_namespace(namespace)
        try:
            wait_for(lambda: not core.list_namespaced_pod(namespace).items, timeout=30,
                     what="the test's pods deleted")  # fmt: skip
        finally:
            sim.stop()
    # --delete-nodes-on-exit
    assert not [n for n in core.list_node().items if n.metadata.name in (a, b)]
