"""A real Kubernetes cluster for the tests: kube-apiserver, kube-controller-manager,
kube-scheduler and etcd, and one real kubelet (`kube1`, 8 fake GPUs through a device plugin)
running real containers through containerd, brought up on this machine by scripts/k8s_up.sh
(binaries built once from Debian's source package by scripts/k8s_build.sh). More nodes are
simulated kubelets (tests/kubernetes/simkubelet.py: a stand-in for the kubelet only, talking to
the real API server) that a test starts. The cluster is started once, if it is not up, and put
back in order before each test: no pod of the tests', kube1 uncordoned and Ready, no simulated
node, the API server running. K8S_TEST_DIR and K8S_TEST_PORT_BASE choose where it lives.

The connector runs with the least rights deploy/kubernetes/connector-rbac.yaml gives: the
kubeconfig of the gpu-portal-connector service account, not the admin's."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.live import ROOT, wait_for
from tests.slurm.conftest import slurm, slurm_cluster  # noqa: F401 — the three estates' test

REAL_NODE = "kube1"
NAMESPACE = "gpu-portal"  # the connector's, from deploy/kubernetes/connector-rbac.yaml
OTHER_NAMESPACE = "someone-else"  # where the tests put pods the portal did not create
JOB_IMAGE = "localhost/gpu-portal/busybox:test"
PRODUCT = "NVIDIA-H100-80GB-HBM3"
SIMKUBELET = ROOT / "tests" / "kubernetes" / "simkubelet.py"


class ClusterScriptFailed(AssertionError):
    """scripts/k8s_up.sh or scripts/k8s_build.sh failed."""


@dataclass
class KubeCluster:
    directory: Path
    env: dict[str, str]
    rbac_for: float = 0.0  # the admin kubeconfig's time when the connector's rights were made

    @property
    def kubeconfig(self) -> str:
        return str(self.directory / "admin.kubeconfig")

    @property
    def connector_kubeconfig(self) -> str:
        return str(self.directory / "connector.kubeconfig")

    def script(self, command: str) -> str:
        """Run scripts/k8s_up.sh COMMAND; fail with what it said on stderr."""
        done = subprocess.run(
            ["bash", str(ROOT / "scripts" / "k8s_up.sh"), command],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            raise ClusterScriptFailed(f"k8s_up.sh {command}: {done.stderr[-3000:]}")
        return done.stdout

    def start(self) -> None:
        """The cluster up (as it is, when it already is), and the connector's rights and
        kubeconfig made for it (again, when it was started afresh: new certificates)."""
        self.script("start")
        started = (self.directory / "admin.kubeconfig").stat().st_mtime
        if started != self.rbac_for:
            self.apply_rbac()
            self.rbac_for = started

    def kubectl(self, *args: str, check: bool = True, stdin: str | None = None) -> str:
        kubectl = Path(self.env.get("K8S_BIN", "")) / "kubectl"
        done = subprocess.run(
            [str(kubectl), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            env={**self.env, "KUBECONFIG": self.kubeconfig},
        )
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {done.stderr or done.stdout}")
        return done.stdout

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def pods(self, namespace: str = NAMESPACE) -> list[dict]:
        return self.get("pods", "-n", namespace)["items"]

    def node(self, name: str = REAL_NODE) -> dict:
        return self.get("node", name)

    def apply_rbac(self) -> None:
        """The connector's namespace and least rights, and a kubeconfig with its service
        account's token."""
        self.kubectl("apply", "-f", str(ROOT / "deploy" / "kubernetes" / "connector-rbac.yaml"))

        def token() -> str | None:
            account = self.get("serviceaccount", "gpu-portal-connector", "-n", NAMESPACE)
            secrets = account.get("secrets") or []
            if not secrets:
                return None
            secret = self.get("secret", secrets[0]["name"], "-n", NAMESPACE)
            return base64.b64decode(secret["data"]["token"]).decode()

        found = wait_for(token, timeout=60, what="the connector's service account token")
        server = f"https://127.0.0.1:{self.env['K8S_PORT_BASE']}"
        ca = self.directory / "pki" / "ca.crt"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "connector",
            "clusters": [
                {
                    "name": "portaltest",
                    "cluster": {"server": server, "certificate-authority": str(ca)},
                }
            ],
            "users": [{"name": "gpu-portal-connector", "user": {"token": found}}],
            "contexts": [
                {
                    "name": "connector",
                    "context": {"cluster": "portaltest", "user": "gpu-portal-connector"},
                }
            ],
        }
        Path(self.connector_kubeconfig).write_text(json.dumps(config))

    def reset(self) -> None:
        """No pod of the tests', no simulated node, kube1 uncordoned and Ready."""
        self.kubectl("create", "namespace", OTHER_NAMESPACE, check=False)
        for namespace in (NAMESPACE, OTHER_NAMESPACE):
            self.kubectl(
                "delete",
                "pods",
                "--all",
                "-n",
                namespace,
                "--grace-period=0",
                "--force",
                "--wait=false",
                check=False,
            )
        for node in self.get("nodes")["items"]:
            name = node["metadata"]["name"]
            if name != REAL_NODE:
                self.kubectl("delete", "node", name, "--wait=false", check=False)
        self.kubectl("uncordon", REAL_NODE)
        wait_for(
            lambda: not self.pods() and not self.pods(OTHER_NAMESPACE),
            timeout=60,
            what="the tests' pods gone",
        )
        wait_for(
            lambda: [n["metadata"]["name"] for n in self.get("nodes")["items"]] == [REAL_NODE],
            timeout=60,
            what="only kube1 left",
        )
        wait_for(self._kube1_ready, timeout=60, what="kube1 Ready")

    def _kube1_ready(self) -> bool:
        conditions = self.node()["status"].get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@pytest.fixture(scope="session")
def kube_cluster() -> Iterator[KubeCluster]:
    """The tests' cluster, started once and stopped when the session ends, so that no
    Kubernetes daemon outlives the tests."""
    directory = Path(os.environ.get("K8S_TEST_DIR", "/tmp/gpu-portal-k8s"))
    env = {
        **os.environ,
        "K8S_DIR": str(directory),
        "K8S_NODE": REAL_NODE,
        "K8S_GPUS": "8",
        "K8S_GPU_PRODUCT": PRODUCT,
        "K8S_JOB_IMAGE": JOB_IMAGE,
        "K8S_PORT_BASE": os.environ.get("K8S_TEST_PORT_BASE", "16443"),
    }
    try:
        built = subprocess.run(
            ["bash", str(ROOT / "scripts" / "k8s_build.sh")],
            env=env,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        if built.returncode != 0:
            raise ClusterScriptFailed(f"k8s_build.sh: {built.stderr[-3000:]}")
        env["K8S_BIN"] = built.stdout.strip().splitlines()[-1]
        cluster = KubeCluster(directory, env)
        cluster.start()
    except ClusterScriptFailed as error:
        message = f"could not bring up Kubernetes: {error}"
        if os.environ.get("CI"):
            raise AssertionError(message) from None
        pytest.skip(message)  # outside CI only: a machine that cannot build or run it
    yield cluster
    cluster.script("stop")


@pytest.fixture
def kube(kube_cluster: KubeCluster) -> KubeCluster:
    """The cluster, API server and kubelet running, with no pod of the tests', before and
    after."""
    kube_cluster.start()  # a test that stopped the API server or the kubelet
    kube_cluster.reset()
    yield kube_cluster
    kube_cluster.start()
    kube_cluster.reset()


def start_simulated_kubelets(
    live, kube: KubeCluster, *names: str, gpus: int = 8, name: str = "sim"
) -> None:
    """Simulated kubelets for `names`, in one process of `live`'s (stopped with it): GPU
    nodes with the same product label as kube1, driven through stdin (`die NODE`, `revive
    NODE`, `evict POD`)."""
    live.agents[name] = live._spawn(
        f"simkubelet-{name}",
        [
            sys.executable,
            str(SIMKUBELET),
            "--kubeconfig",
            kube.kubeconfig,
            "--nodes",
            ",".join(names),
            "--gpus",
            str(gpus),
            "--label",
            f"nvidia.com/gpu.product={PRODUCT}",
            "--log-dir",
            str(live.tmp / "simkubelet"),
            "--control-stdin",
            "--ca-cert",
            str(kube.directory / "pki" / "ca.crt"),
            "--ca-key",
            str(kube.directory / "pki" / "ca.key"),
        ],
        stdin=subprocess.PIPE,
    )


def control(live, command: str, name: str = "sim") -> None:
    """Send a command to the simulated kubelets' process, and wait until it is carried out."""
    log = live.tmp / f"simkubelet-{name}.log"
    done = log.read_text().count(f"ok {command}\n")
    process = live.agents[name]
    process.stdin.write(f"{command}\n".encode())
    process.stdin.flush()
    wait_for(lambda: log.read_text().count(f"ok {command}\n") > done, what=command)
