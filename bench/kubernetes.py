"""The portal on a real Kubernetes control plane, on the real kubelet and at scale on simulated
kubelets, side by side with Kubernetes alone and with the portal on its own agents, all in one
run on this machine.

    python bench/kubernetes.py [--runs 3] [--quick] [--keep] [--sim-nodes 100] [--no-agents]

Starts, all on 127.0.0.1: its own Kubernetes v1.20.2 (scripts/k8s_up.sh with K8S_DIR
/tmp/gpu-portal-k8s-bench, K8S_PORT_BASE 17443: etcd, kube-apiserver, controller-manager, scheduler;
stopped and started afresh before each Kubernetes part, stopped at the end), and with
bench/soak.py's machinery a scratch PostgreSQL database `portal_k8s_bench` (or K8S_BENCH_DATABASE;
dropped and re-created for each portal part, dropped at the end), Redis K8S_BENCH_REDIS_URL (default
redis://127.0.0.1:6379/12, flushed), the production server (`gpu-portal-server web`: uvicorn, 2
processes), its Celery worker and beat (`gpu-portal-server worker` and `beat`; a cycle every
second). Two shares: `vision` (LEND, 8 h100) of the owner, `research` (LEND_AND_BORROW, 4 h100: an
8-GPU job there borrows, on kube1's 8 GPUs as anywhere) of the borrower, grace 2 s; one admin, lead
of both teams, submits with its API token over POST /api/v1/jobs/. The churn breaker is off (cluster
setting churn_preemptions 0): on one node, one borrower is reclaimed --reclaims times in a row.

The clock. Every job is a busybox shell script (`exec /bin/busybox sh -c '...'`, the same
static binary in the kubelet's image and on this machine), which writes busybox ash's
$EPOCHREALTIME (gettimeofday: the wall clock time.time() reads, in µs; no time namespace in
the containers) to a file in its CHECKPOINT_DIR, a hostPath mounted at the same path, which the
bench reads. busybox's `date` has no %N (it prints a literal "%N"), and a file's mtime is the
kernel's coarse clock (up to 4 ms behind here), hence $EPOCHREALTIME.

Each run has these parts:

1. The real kubelet (k8s_up.sh's kube1: containerd, runc, 8 fake GPUs from a device plugin;
   node grace 10 s). Kubernetes alone, the floor: --latency-jobs pods of 1 GPU, one every
   --interval s, POSTed to the API server with nodeName kube1 (the very pod the connector
   makes: scheduler.agent.kube.pod_manifest), each writing its start time, then sleeping
   --job-seconds; latency = that time − time.time() just before the POST. One 1-s job a
   second by default: with bench/slurm.py's one 2-s job every 0.5 s, kube1's 8 GPUs would be
   nearly all held (a pod holds its GPU from its admission until the kubelet has seen it end,
   and the portal's books hold it a little longer), the portal's jobs would queue for GPUs,
   and the sample would measure queueing, not latency. Then pods of 8 GPUs running the
   borrower's script (below), each DELETEd with a grace of 2 s (as the connector stops a
   job): DELETE → the SIGTERM its trap notes, --reclaims times once the pod has run
   --settle-seconds, --early-reclaims times as soon as its script has started.
   Then the portal on it: the connector (`python -m scheduler.agent kubernetes`, with the
   service account of deploy/kubernetes/connector-rbac.yaml, as the tests run it;
   --host-network, --image the busybox image, --gpu-product NVIDIA-H100-80GB-HBM3=h100).
   Latency: the same sample over POST /api/v1/jobs/ (share vision, within its quota; submit
   time just before the POST). Reclaim: one borrower of 8 GPUs in research (a TERM trap writes
   its SIGTERM time, and it exits) fills kube1; then the owner submits an 8-GPU job to vision:
   reclaim = the borrower's SIGTERM time − time.time() just before the owner's POST; the
   owner's start (its job writes its start time, then sleeps 1 s) − the same time is shown
   too. Before each, the owner's last job has ended and every borrower runs again (its
   attempt's script has started); then --reclaims times the owner waits until every borrower
   has run --settle-seconds, and --early-reclaims times it submits at once (bench/slurm.py's
   protocol). The two are apart because a kubelet before 1.22 defers, or skips until its pod
   resync, the SIGTERM of a pod deleted in the first seconds of its container
   (kubernetes/kubernetes#102344): Kubernetes alone shows it too.
2. At scale: the cluster started afresh without a real kubelet (K8S_KUBELET=0), and
   --sim-nodes simulated kubelets (tests/kubernetes/simkubelet.py, one process, nodes
   bench-sim-1..N: a simulator that starts or stops kills every process of this machine marked
   with one of its node names, the tests' sim1 and sim2 included; each node 8 GPUs, heartbeat
   --heartbeat-seconds 10 s with a node grace of --node-grace 40 s: a stock kubelet's and
   controller-manager's, which costs a fifth of the CPU of k8s_up.sh's 2 s / 10 s).
   The same: Kubernetes alone (pod i bound to node i mod N), the portal's latency sample, and
   reclaims with as many borrowers of 8 GPUs as nodes, filling them all.
3. The portal on its own agents (the cluster stopped): a fresh database and 1 fake-GPU agent
   (`--fake-gpus 8 --gpu-type h100`), the same latency sample and reclaims, beside part 1; then
   --sim-nodes agents, beside part 2.

CPU seconds, from the nodes READY to the end of the part: the connector; the Kubernetes
daemons (etcd, apiserver, controller-manager, scheduler, and in part 1 containerd, the kubelet
and the device plugin; not the containers' shims); the simulator (its pods' ended processes
included); the agents (their jobs' ended processes included). Before each latency sample one
job runs unmeasured (the first after a start is slower). Prints each run's figures, then one
table: each figure as the median of the runs (each run's value), and the ratios of the portal
on Kubernetes to the portal on agents measured in the same run. A full run (3 runs) takes
about 40 minutes on 2 cores. --quick: 10 latency jobs, 3 + 2 reclaims, 1 run (for
development). Everything it started is stopped, also on errors and Ctrl-C: the portal's
process trees, the simulator (and any process it left), the cluster (k8s_up.sh stop), the
database. (This file's name is the kubernetes client's: it imports the client before it puts
bench/ on the path.)
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import requests

ROOT = Path(__file__).resolve().parent.parent
# This file's name is the kubernetes client's: bench/ (first on the path, as this script's
# directory) would shadow it. The client is imported first, without bench/ on the path.
_BENCH = ROOT / "bench"
_path = list(sys.path)
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _BENCH]
import kubernetes.client  # noqa: E402
import kubernetes.config  # noqa: E402

sys.path[:] = _path
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(_BENCH))
import kueue_baseline  # noqa: E402 — its report helpers; it sets soak's constants, reset below
import slurm as slurm_bench  # noqa: E402 — its helpers; it sets soak's constants, reset below
import soak  # noqa: E402

from scheduler.agent.kube import pod_manifest  # noqa: E402

read_time = slurm_bench.read_time
wait_for = slurm_bench.wait_for
latency_sample = slurm_bench.latency_sample
percentiles = slurm_bench.percentiles
close_django_connections = slurm_bench.close_django_connections
drop_database = slurm_bench.drop_database
stop_tree = slurm_bench.stop_tree

GRACE = 2
GPU_TYPE = "h100"
GPUS_PER_NODE = 8
PRODUCT = "NVIDIA-H100-80GB-HBM3"
IMAGE = "localhost/gpu-portal/busybox:test"
REAL_NODE = "kube1"
# Not the tests' sim1, sim2: a simulator that starts or stops kills every process on this
# machine marked with one of its node names, whichever cluster it belongs to.
SIM_PREFIX = "bench-sim-"
NAMESPACE = "gpu-portal"  # the connector's (deploy/kubernetes/connector-rbac.yaml)
ALONE_NAMESPACE = "bench-alone"  # Kubernetes alone's pods
GPU_RESOURCE = "nvidia.com/gpu"
BUSYBOX = "/bin/busybox"
K8S_SETTINGS = {
    "K8S_DIR": "/tmp/gpu-portal-k8s-bench",
    "K8S_PORT_BASE": "17443",
    "K8S_NODE": REAL_NODE,
    "K8S_GPUS": str(GPUS_PER_NODE),
    "K8S_GPU_PRODUCT": PRODUCT,
    "K8S_JOB_IMAGE": IMAGE,
}
K8S_UP = ROOT / "scripts" / "k8s_up.sh"
SIMKUBELET = ROOT / "tests" / "kubernetes" / "simkubelet.py"
# The daemons whose CPU counts (their pid files in $K8S_DIR/run).
DAEMONS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "containerd",
           "kubelet", "fake-gpu-plugin")  # fmt: skip

# soak.py takes its database, its Redis and its shares from module constants: this bench's own.
soak.DB_NAME = os.environ.get("K8S_BENCH_DATABASE", "portal_k8s_bench")
soak.REDIS_URL = os.environ.get("K8S_BENCH_REDIS_URL", "redis://127.0.0.1:6379/12")
soak.SHARES = [
    ("vision", "LEND", {GPU_TYPE: 8}, {"grace_seconds": GRACE}),
    ("research", "LEND_AND_BORROW", {GPU_TYPE: 4}, {"grace_seconds": GRACE}),
]
OWNER_SHARE, BORROWER_SHARE = "vision", "research"


# --- The jobs ------------------------------------------------------------------------------------


def busybox(script: str) -> str:
    """A job's command: `script` under busybox's ash, the same binary in the kubelet's image and
    on this machine (where /bin/sh is dash, without $EPOCHREALTIME)."""
    return f"exec {BUSYBOX} sh -c {shlex.quote(script)}"


def started_command(seconds: float) -> str:
    """Writes its start time (wall clock, µs) to $CHECKPOINT_DIR/started, then sleeps."""
    return busybox(f'echo $EPOCHREALTIME > "$CHECKPOINT_DIR/started"; sleep {seconds:g}')


# Runs until SIGTERM, which it answers by writing the time to sigterm-N and exiting 143. The
# trap is set before attempt-N.start is written: once that file is there, a SIGTERM is caught.
BORROWER_COMMAND = busybox(
    'trap \'echo $EPOCHREALTIME > "$CHECKPOINT_DIR/sigterm-$ATTEMPT"; kill $! 2>/dev/null; '
    "exit 143' TERM; "
    'echo $EPOCHREALTIME > "$CHECKPOINT_DIR/attempt-$ATTEMPT.start"; '
    "while :; do sleep 3600 & wait $!; done"
)


def tree_cpu(process: subprocess.Popen | None) -> float:
    if process is None:
        return math.nan
    with contextlib.suppress(psutil.Error):
        return soak.process_cpu(psutil.Process(process.pid))
    return math.nan


def descendants(processes) -> list[psutil.Process]:
    """The processes and all their descendants that are alive now."""
    found = []
    for process in processes:
        if process is None:
            continue
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(process.pid)
            found += [root, *root.children(recursive=True)]
    return found


# --- Kubernetes ----------------------------------------------------------------------------------


class Kube:
    """This bench's own cluster, through scripts/k8s_up.sh, kubectl and the kubernetes client."""

    def __init__(self) -> None:
        self.env = {**os.environ, **K8S_SETTINGS}
        self.env.pop("KUBECONFIG", None)
        self.directory = Path(K8S_SETTINGS["K8S_DIR"])
        self.kubeconfig = str(self.directory / "admin.kubeconfig")
        self.connector_kubeconfig = str(self.directory / "connector.kubeconfig")
        self.bin = ""
        self._api = None

    def script(self, command: str, timeout: float = 180) -> str:
        done = subprocess.run(["bash", str(K8S_UP), command], env=self.env, text=True,
                              capture_output=True, timeout=timeout)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"k8s_up.sh {command}: {(done.stderr or done.stdout)[-3000:]}")
        return done.stdout

    def restart(self, *, kubelet: bool, node_grace: int) -> None:
        """A fresh cluster (new etcd): with kube1, or the control plane alone."""
        self._api = None
        self.stop()
        self.env["K8S_KUBELET"] = "1" if kubelet else "0"
        self.env["K8S_NODE_GRACE"] = str(node_grace)
        # The first start may wait for scripts/k8s_build.sh (a build holds its lock).
        self.script("start", timeout=1800)
        for line in (self.directory / "settings").read_text().splitlines():
            if line.startswith("bin="):
                self.bin = line.removeprefix("bin=")
        self.kubectl("create", "namespace", ALONE_NAMESPACE)
        self.apply_rbac()

    def stop(self) -> None:
        self._api = None
        if self.directory.exists():
            self.script("stop", timeout=180)

    def kubectl(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(
            [str(Path(self.bin) / "kubectl"), "--kubeconfig", self.kubeconfig,
             "--request-timeout=30s", *args],
            capture_output=True, text=True, timeout=60, env=self.env,
        )  # fmt: skip
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr or done.stdout}")
        return done.stdout

    @property
    def api(self):
        if self._api is None:
            self._api = kubernetes.client.CoreV1Api(
                kubernetes.config.new_client_from_config(self.kubeconfig)
            )
        return self._api

    def apply_rbac(self) -> None:
        """The connector's namespace and least rights, and a kubeconfig with its service
        account's token (as tests/kubernetes/conftest.py does)."""
        self.kubectl("apply", "-f", str(ROOT / "deploy" / "kubernetes" / "connector-rbac.yaml"))

        def token() -> str | None:
            account = json.loads(self.kubectl("get", "serviceaccount", "gpu-portal-connector",
                                              "-n", NAMESPACE, "-o", "json"))  # fmt: skip
            secrets = account.get("secrets") or []
            if not secrets:
                return None
            secret = json.loads(self.kubectl("get", "secret", secrets[0]["name"], "-n",
                                             NAMESPACE, "-o", "json"))  # fmt: skip
            return base64.b64decode(secret["data"]["token"]).decode()

        found = wait_for(token, 60, "the connector's service account token")
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "connector",
            "clusters": [{"name": "k8s-bench", "cluster": {
                "server": f"https://127.0.0.1:{K8S_SETTINGS['K8S_PORT_BASE']}",
                "certificate-authority": str(self.directory / "pki" / "ca.crt")}}],
            "users": [{"name": "gpu-portal-connector", "user": {"token": found}}],
            "contexts": [{"name": "connector", "context": {"cluster": "k8s-bench",
                                                          "user": "gpu-portal-connector"}}],
        }  # fmt: skip
        Path(self.connector_kubeconfig).write_text(json.dumps(config))

    def ready_gpu_nodes(self) -> int:
        count = 0
        for node in self.api.list_node(_request_timeout=30).items:
            ready = any(c.type == "Ready" and c.status == "True"
                        for c in node.status.conditions or [])  # fmt: skip
            if ready and (node.status.allocatable or {}).get(GPU_RESOURCE) == str(GPUS_PER_NODE):
                count += 1
        return count

    def daemons_cpu(self) -> float:
        total = 0.0
        for role in DAEMONS:
            try:
                pid = int((self.directory / "run" / f"{role}.pid").read_text().strip())
                total += soak.process_cpu(psutil.Process(pid))
            except (OSError, ValueError, psutil.Error):
                continue
        return total

    # --- Kubernetes alone ------------------------------------------------------------------------

    def create_pod(self, name: str, node: str, command: str, root: Path, gpus: int = 1) -> Path:
        """The pod the connector would make for a job of `gpus` GPUs on `node`, but POSTed by
        hand; returns its CHECKPOINT_DIR's "started" file."""
        checkpoint_dir = root / name
        checkpoint_dir.mkdir(parents=True, exist_ok=True)  # as the connector does
        order = {"nodes": [{"node": node, "gpu_indices": list(range(gpus))}],
                 "grace_seconds": GRACE,
                 "share": "alone", "job": 0, "attempt": 0, "command": command}  # fmt: skip
        env = {"JOB_ID": "0", "ATTEMPT": "1", "CHECKPOINT_DIR": str(checkpoint_dir),
               "PREEMPT_GRACE_SECONDS": str(GRACE)}  # fmt: skip
        pod = pod_manifest(order=order, env=env, namespace=ALONE_NAMESPACE, group=name, index=0,
                           image=IMAGE, connector="bench-alone", checkpoint_root=root,
                           checkpoint_claim=None, host_network=True)  # fmt: skip
        self.api.create_namespaced_pod(ALONE_NAMESPACE, pod, _preload_content=False,
                                       _request_timeout=30)  # fmt: skip
        return checkpoint_dir / "started"

    def alone(self, kind: str, nodes: list[str], args: argparse.Namespace,
              tmp: Path) -> dict[str, float]:  # fmt: skip
        """Kubernetes alone: pods POSTed with their node, from the POST to their start."""
        root = tmp / f"{kind.replace(' ', '-')}-checkpoints"
        # Each run's pods have the same names: an earlier run's files would be read as theirs.
        shutil.rmtree(root, ignore_errors=True)
        warm = self.create_pod("alone-warm-up", nodes[0], started_command(0), root)
        wait_for(lambda: read_time(warm), 90, f"{kind}'s warm-up pod")

        def submit(i: int) -> Path:
            return self.create_pod(f"alone-{i}", nodes[i % len(nodes)],
                                   started_command(args.job_seconds), root)  # fmt: skip

        latencies, missing = latency_sample(submit, args.latency_jobs, args.interval, 60)
        figures: dict[str, float] = {f"{kind} latency missing": missing}
        percentiles(figures, f"{kind} latency", latencies)
        self.delete_pods(ALONE_NAMESPACE)

        # Pod DELETE (grace GRACE) → SIGTERM, of a borrower's pod of 8 GPUs that has run
        # --settle-seconds, then of one whose script has just started.
        samples: dict[str, list[float]] = {}
        for i, early in enumerate([False] * args.reclaims + [True] * args.early_reclaims):
            name = f"alone-delete-{i}"
            self.create_pod(name, nodes[i % len(nodes)], BORROWER_COMMAND, root, GPUS_PER_NODE)
            start = wait_for(lambda n=name: read_time(root / n / "attempt-1.start"), 90,
                             f"{kind}'s pod {name} running")  # fmt: skip
            if not early:
                time.sleep(max(0.0, start + args.settle_seconds - time.time()))
            before = time.time()
            self.api.delete_namespaced_pod(name, ALONE_NAMESPACE, grace_period_seconds=GRACE,
                                           _request_timeout=30)  # fmt: skip
            sigterm = wait_for(lambda n=name: read_time(root / n / "sigterm-1"), 120,
                               f"{kind}'s pod {name} SIGTERMed")  # fmt: skip
            samples.setdefault("early delete" if early else "delete", []).append(sigterm - before)
            wait_for(lambda n=name: not self.api.list_namespaced_pod(
                ALONE_NAMESPACE, field_selector=f"metadata.name={n}", _request_timeout=30).items,
                     90, f"{kind}'s pod {name} gone")  # fmt: skip
        for what, values in samples.items():
            percentiles(figures, f"{kind} {what}", values)
        return figures

    def delete_pods(self, namespace: str) -> None:
        """Once every pod there has ended (or after 60 s), all of them deleted for good."""

        def ended() -> bool:
            pods = self.api.list_namespaced_pod(namespace, _request_timeout=30).items
            return all(p.status.phase in ("Succeeded", "Failed") for p in pods)

        with contextlib.suppress(RuntimeError):
            wait_for(ended, 60, f"the pods of {namespace} to end")
        self.api.delete_collection_namespaced_pod(namespace, grace_period_seconds=0,
                                                  _request_timeout=30)  # fmt: skip
        wait_for(lambda: not self.api.list_namespaced_pod(namespace, _request_timeout=30).items,
                 90, f"the pods of {namespace} gone")  # fmt: skip


class Simulator:
    """--sim-nodes simulated kubelets in one process (tests/kubernetes/simkubelet.py)."""

    def __init__(self, kube: Kube, count: int, heartbeat: float, tmp: Path) -> None:
        self.kube, self.count, self.tmp = kube, count, tmp
        self.log = tmp / "simkubelet.log"
        self.names = [f"{SIM_PREFIX}{i}" for i in range(1, count + 1)]
        self.process: subprocess.Popen | None = None
        self.heartbeat = heartbeat

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [soak.PYTHON, str(SIMKUBELET), "--kubeconfig", self.kube.kubeconfig,
                 "--count", str(self.count), "--prefix", SIM_PREFIX,
                 "--gpus", str(GPUS_PER_NODE), "--label", f"nvidia.com/gpu.product={PRODUCT}",
                 "--log-dir", str(self.tmp / "simkubelet"),
                 "--heartbeat-seconds", f"{self.heartbeat:g}",
                 "--ca-cert", str(self.kube.directory / "pki" / "ca.crt"),
                 "--ca-key", str(self.kube.directory / "pki" / "ca.key")],
                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip

        def up() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"simkubelet ended: {self.log.read_text()[-2000:]}")
            return "nodes up" in self.log.read_text(errors="replace")

        wait_for(up, 180, "the simulated kubelets")
        wait_for(lambda: self.kube.ready_gpu_nodes() >= self.count, 120,
                 f"{self.count} simulated nodes Ready")  # fmt: skip

    def cpu(self) -> float:
        return tree_cpu(self.process)

    def stop(self) -> None:
        if self.process is None:
            return
        tree = descendants([self.process])
        # SIGTERM: it stops its pods' processes (TERM, then KILL 2 s later) and leaves.
        self.process.terminate()
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
        stop_tree(tree)
        # Whatever it left (its pods' processes carry a marker): killed.
        subprocess.run([soak.PYTHON, str(SIMKUBELET), "--count", str(self.count), "--prefix",
                        SIM_PREFIX, "--cleanup"], capture_output=True, timeout=60)  # fmt: skip
        self.process = None


# --- The portal ----------------------------------------------------------------------------------


class PortalPart(soak.Soak):
    """One portal part of a run: soak.Soak's processes, on Kubernetes (the connector) or on
    `agents` fake-GPU agents of 8 h100."""

    def __init__(self, args: argparse.Namespace, kind: str, nodes: int, *,
                 kube: Kube | None = None, simulator: Simulator | None = None) -> None:  # fmt: skip
        super().__init__(
            argparse.Namespace(agents=0 if kube else nodes, sqlite=False, keep=args.keep, seed=1,
                               minutes=60.0, clients=1, jobs=0)
        )  # fmt: skip
        self.bench = args
        self.kind = kind
        self.nodes = nodes
        self.kube = kube
        self.simulator = simulator
        self.checkpoints = self.tmp / "checkpoints"
        self.session = requests.Session()

    def start_agent(self, name: str) -> None:
        self.agent_specs[name] = (GPU_TYPE, GPUS_PER_NODE)
        super().start_agent(name)

    def start_connector(self) -> None:
        self.agents["connector"] = self.spawn(
            "connector",
            [soak.PYTHON, "-m", "scheduler.agent", "kubernetes", "--portal", self.url,
             "--join-token", soak.JOIN_TOKEN, "--name", "k8s-bench", "--namespace", NAMESPACE,
             "--kubeconfig", self.kube.connector_kubeconfig, "--image", IMAGE,
             "--host-network", "--gpu-product", f"{PRODUCT}={GPU_TYPE}", "--poll-wait", "5",
             "--log-level", "INFO", "--work-dir", str(self.tmp / "connector"),
             "--checkpoint-root", str(self.checkpoints)],
        )  # fmt: skip

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of what this part measures."""
        if self.kube is None:
            return {"agents": sum(tree_cpu(p) for p in self.agents.values())}
        used = {"connector": tree_cpu(self.agents.get("connector")),
                "daemons": self.kube.daemons_cpu()}  # fmt: skip
        if self.simulator is not None:
            used["simulator"] = self.simulator.cpu()
        return used

    def stop_everything(self) -> None:
        tree = descendants([self.web, self.worker, self.beat, *self.agents.values()])
        self.stop.set()
        self.stop_all()
        stop_tree(tree)
        close_django_connections()

    # --- Requests -------------------------------------------------------------------------------

    def post(self, share: str, gpus: int, command: str, name: str) -> int:
        body = {"name": name, "share": share, "gpu_type": GPU_TYPE, "gpus": gpus, "nodes": 1,
                "command": command}  # fmt: skip
        response = self.session.post(f"{self.url}/api/v1/jobs/", json=body, timeout=60)
        if response.status_code != 201:
            raise RuntimeError(f"submit refused ({response.status_code}): {response.text[:300]}")
        return response.json()["id"]

    def started_file(self, job_id: int) -> Path:
        return self.checkpoints / f"job-{job_id}" / "started"

    def wait_final(self, ids: list[int], timeout: float) -> bool:
        from scheduler.models import Job

        def done() -> bool:
            return not Job.objects.filter(pk__in=ids).exclude(state__in=Job.FINAL_STATES).exists()

        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    # --- The part ---------------------------------------------------------------------------------

    def run_part(self) -> dict[str, float]:
        token = self.prepare()
        self.session.headers["Authorization"] = f"Token {token}"
        self.setup_django()
        from scheduler.models import ClusterSettings, Node

        settings = ClusterSettings.load()
        settings.churn_preemptions = 0  # one borrower is reclaimed --reclaims times
        settings.save()
        self.start()
        if self.kube is not None:
            self.start_connector()
        wait_for(lambda: Node.objects.filter(state=Node.State.READY).count() == self.nodes,
                 120 + self.nodes, f"the {self.nodes} nodes READY")  # fmt: skip
        cpu0 = self.cpu()
        figures: dict[str, float] = {}
        kind, args = self.kind, self.bench

        warm_up = self.post(OWNER_SHARE, 1, started_command(0), "warm-up")
        wait_for(lambda: read_time(self.started_file(warm_up)), 90, "the warm-up job")
        ids: list[int] = []

        def submit(i: int) -> Path:
            ids.append(self.post(OWNER_SHARE, 1, started_command(args.job_seconds),
                                 f"latency-{i}"))  # fmt: skip
            return self.started_file(ids[-1])

        latencies, missing = latency_sample(submit, args.latency_jobs, args.interval, 60)
        figures[f"{kind} latency missing"] = missing
        percentiles(figures, f"{kind} latency", latencies)
        if not self.wait_final([warm_up, *ids], 90):
            raise RuntimeError("the latency jobs did not all end")

        for what, values in self.reclaims().items():
            percentiles(figures, f"{kind} {what}", values)
        cpu1 = self.cpu()
        for what, seconds in cpu1.items():
            figures[f"{kind} cpu {what}"] = seconds - cpu0[what]
        return figures

    def reclaims(self) -> dict[str, list[float]]:
        """Borrowers of 8 GPUs fill every node; then the owner reclaims 8 GPUs, --reclaims
        times once every borrower has run --settle-seconds, then --early-reclaims times as
        soon as every borrower's script has started. Returns the reclaim latencies and the
        owner's submit → start of each kind ("", "early ")."""
        from scheduler.models import Job, JobAttempt

        borrowers = [
            self.post(BORROWER_SHARE, GPUS_PER_NODE, BORROWER_COMMAND, f"borrower-{i}")
            for i in range(self.nodes)
        ]

        def started() -> list[float] | None:
            """When each borrower's running attempt started; None until all have."""
            ended = Job.objects.filter(pk__in=borrowers, state__in=Job.FINAL_STATES)
            for job_id, state, reason in ended.values_list("pk", "state", "reason")[:1]:
                raise RuntimeError(f"borrower {job_id} ended {state}: {reason}")
            attempts = list(
                JobAttempt.objects.filter(
                    job_id__in=borrowers, ended_at__isnull=True, job__state=Job.State.RUNNING
                ).values_list("job_id", "number")
            )
            if len(attempts) != len(borrowers):
                return None
            times = [
                read_time(self.checkpoints / f"job-{job}" / f"attempt-{number}.start")
                for job, number in attempts
            ]
            return None if None in times else times

        samples: dict[str, list[float]] = {}
        args = self.bench
        for i, early in enumerate([False] * args.reclaims + [True] * args.early_reclaims):
            times = wait_for(started, 120 + self.nodes, "every borrower running")
            while not early and time.time() < max(times) + args.settle_seconds:
                time.sleep(max(0.0, max(times) + args.settle_seconds - time.time()))
                # Each has run long enough, and none has ended meanwhile.
                times = wait_for(started, 120 + self.nodes, "every borrower running")
            before = time.time()
            owner = self.post(OWNER_SHARE, GPUS_PER_NODE, started_command(1), f"owner-{i}")
            victim = wait_for(
                lambda owner=owner: JobAttempt.objects.filter(preempted_for_id=owner).first(), 60,
                "a borrower's stop order",
            )  # fmt: skip
            sigterm = self.checkpoints / f"job-{victim.job_id}" / f"sigterm-{victim.number}"
            prefix = "early " if early else ""
            samples.setdefault(f"{prefix}reclaim", []).append(
                wait_for(lambda s=sigterm: read_time(s), 90, "the SIGTERM") - before
            )
            start = wait_for(lambda o=owner: read_time(self.started_file(o)), 120,
                             "the owner's start")  # fmt: skip
            samples.setdefault(f"{prefix}owner", []).append(start - before)
            if not self.wait_final([owner], 90):
                raise RuntimeError(f"the owner's job {owner} did not end")
        for job_id in borrowers:
            self.session.post(f"{self.url}/api/v1/jobs/{job_id}/cancel/", timeout=60)
        if not self.wait_final(borrowers, 120):
            raise RuntimeError("the borrowers did not end when cancelled")
        return samples


def portal_part(args: argparse.Namespace, kind: str, nodes: int, parts: list,
                **where) -> dict[str, float]:  # fmt: skip
    part = PortalPart(args, kind, nodes, **where)
    parts.append(part)
    try:
        close_django_connections()
        return part.run_part()
    finally:
        part.stop_everything()
        if args.keep:
            print(f"  logs and files of the portal part {kind} kept in {part.tmp}")
        else:
            shutil.rmtree(part.tmp, ignore_errors=True)


# --- Report --------------------------------------------------------------------------------------


def derived(f: dict[str, float]) -> None:
    nan = math.nan
    for k8s, alone, agents in (("kube1", "kube1 alone", "agents 1"),
                               ("sim", "sim alone", "agents n")):  # fmt: skip
        for q in ("p50", "p99"):
            f[f"{k8s} over alone {q}"] = f[f"{k8s} latency {q}"] - f[f"{alone} latency {q}"]
            for what in ("latency", "reclaim", "owner", "early reclaim", "early owner"):
                f[f"{k8s} ÷ agents {what} {q}"] = f.get(f"{k8s} {what} {q}", nan) / f.get(
                    f"{agents} {what} {q}", nan
                )


def rows(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The table: label, key."""
    n, settle = args.sim_nodes, f"{args.settle_seconds:g}"
    table = []
    for k8s, alone, agents, where, baseline in (
        ("kube1", "kube1 alone", "agents 1", "kube1 (real kubelet)", "1 agent"),
        ("sim", "sim alone", "agents n", f"{n} simulated nodes", f"{n} agents"),
    ):
        table += [
            (f"[{where}] submit → job running", ""),
            ("  Kubernetes alone (pod POST → running) p50 (s)", f"{alone} latency p50"),
            ("  Kubernetes alone (pod POST → running) p99 (s)", f"{alone} latency p99"),
            ("  portal on Kubernetes p50 (s)", f"{k8s} latency p50"),
            ("  portal on Kubernetes p99 (s)", f"{k8s} latency p99"),
            ("    p50 above Kubernetes alone's (s)", f"{k8s} over alone p50"),
            ("    p99 above Kubernetes alone's (s)", f"{k8s} over alone p99"),
            (f"  portal on {baseline} p50 (s)", f"{agents} latency p50"),
            (f"  portal on {baseline} p99 (s)", f"{agents} latency p99"),
            (f"  p50, Kubernetes ÷ {baseline} (×)", f"{k8s} ÷ agents latency p50"),
            (f"  p99, Kubernetes ÷ {baseline} (×)", f"{k8s} ÷ agents latency p99"),
            (f"[{where}] reclaim, borrower running ≥ {settle} s", ""),
            ("  Kubernetes alone (pod DELETE → SIGTERM) p50 (s)", f"{alone} delete p50"),
            ("  Kubernetes alone (pod DELETE → SIGTERM) p99 (s)", f"{alone} delete p99"),
            ("  portal on Kubernetes: owner's submit → borrower's SIGTERM p50 (s)",
             f"{k8s} reclaim p50"),
            ("  portal on Kubernetes: owner's submit → borrower's SIGTERM p99 (s)",
             f"{k8s} reclaim p99"),
            (f"  portal on {baseline}: owner's submit → borrower's SIGTERM p50 (s)",
             f"{agents} reclaim p50"),
            (f"  portal on {baseline}: owner's submit → borrower's SIGTERM p99 (s)",
             f"{agents} reclaim p99"),
            (f"  SIGTERM p50, Kubernetes ÷ {baseline} (×)", f"{k8s} ÷ agents reclaim p50"),
            (f"  SIGTERM p99, Kubernetes ÷ {baseline} (×)", f"{k8s} ÷ agents reclaim p99"),
            ("  portal on Kubernetes: owner's submit → owner running p50 (s)",
             f"{k8s} owner p50"),
            (f"  portal on {baseline}: owner's submit → owner running p50 (s)",
             f"{agents} owner p50"),
            (f"  owner running p50, Kubernetes ÷ {baseline} (×)", f"{k8s} ÷ agents owner p50"),
            (f"[{where}] reclaim, borrower's script just started", ""),
            ("  Kubernetes alone (pod DELETE → SIGTERM) p50 (s)", f"{alone} early delete p50"),
            ("  Kubernetes alone (pod DELETE → SIGTERM) p99 (s)", f"{alone} early delete p99"),
            ("  portal on Kubernetes: owner's submit → borrower's SIGTERM p50 (s)",
             f"{k8s} early reclaim p50"),
            ("  portal on Kubernetes: owner's submit → borrower's SIGTERM p99 (s)",
             f"{k8s} early reclaim p99"),
            (f"  portal on {baseline}: owner's submit → borrower's SIGTERM p50 (s)",
             f"{agents} early reclaim p50"),
            (f"  portal on {baseline}: owner's submit → borrower's SIGTERM p99 (s)",
             f"{agents} early reclaim p99"),
            (f"  SIGTERM p50, Kubernetes ÷ {baseline} (×)", f"{k8s} ÷ agents early reclaim p50"),
            ("  portal on Kubernetes: owner's submit → owner running p50 (s)",
             f"{k8s} early owner p50"),
            (f"  portal on {baseline}: owner's submit → owner running p50 (s)",
             f"{agents} early owner p50"),
            (f"[{where}] CPU seconds, nodes READY → end of the part", ""),
            ("  the connector", f"{k8s} cpu connector"),
            ("  Kubernetes daemons", f"{k8s} cpu daemons"),
            ("  the simulator", f"{k8s} cpu simulator"),
            (f"  the agents ({baseline})", f"{agents} cpu agents"),
        ]  # fmt: skip
    return table


def run_line(index: int, f: dict[str, float], args: argparse.Namespace) -> str:
    num = kueue_baseline.number

    def pair(key: str) -> str:
        p50, p99 = f.get(f"{key} p50", math.nan), f.get(f"{key} p99", math.nan)
        return f"{num(p50, 's')}/{num(p99, 's')}"

    lines = [f"run {index} (p50/p99, seconds):"]
    for kind, label in (
        ("kube1 alone", "Kubernetes alone on kube1"),
        ("sim alone", f"Kubernetes alone on {args.sim_nodes} simulated nodes"),
    ):
        if f"{kind} latency p50" in f:
            lines.append(
                f"  {label}: pod POST → running {pair(f'{kind} latency')} "
                f"({f[f'{kind} latency missing']:.0f} never started); pod DELETE → SIGTERM "
                f"{pair(f'{kind} delete')}, just started {pair(f'{kind} early delete')}"
            )
    for kind, label in (
        ("kube1", "kube1"),
        ("sim", f"{args.sim_nodes} simulated nodes"),
        ("agents 1", "1 agent"),
        ("agents n", f"{args.sim_nodes} agents"),
    ):
        if f"{kind} latency p50" not in f:
            continue
        cpu = ", ".join(f"{what} {num(f[key], 's')}" for what in
                        ("connector", "daemons", "simulator", "agents")
                        if (key := f"{kind} cpu {what}") in f)  # fmt: skip
        lines.append(
            f"  portal on {label}: submit → running {pair(f'{kind} latency')} "
            f"({f[f'{kind} latency missing']:.0f} never started); reclaim → SIGTERM "
            f"{pair(f'{kind} reclaim')}, owner running {pair(f'{kind} owner')}; borrower just "
            f"started: SIGTERM {pair(f'{kind} early reclaim')}, owner running "
            f"{pair(f'{kind} early owner')}; CPU s: {cpu}"
        )
    return "\n".join(lines)


def report(runs: list[dict[str, float]], args: argparse.Namespace) -> str:
    lines = [
        "",
        f"kubernetes bench: {len(runs)} run(s); kube1 (real kubelet, 8 {GPU_TYPE}) and "
        f"{args.sim_nodes} simulated nodes × {GPUS_PER_NODE} (heartbeat "
        f"{args.heartbeat_seconds:g} s, node grace {args.node_grace} s); latency "
        f"{args.latency_jobs} jobs of 1 GPU, one every {args.interval:g} s, running "
        f"{args.job_seconds:g} s; reclaims of 8 GPUs (grace {GRACE} s): {args.reclaims} of a "
        f"borrower running ≥ {args.settle_seconds:g} s, {args.early_reclaims} of one just "
        f"started; "
        f"value = median (each run); ratios: the portal on Kubernetes ÷ on agents, same run",
        "",
    ]
    table = [("figure", "value")]
    for label, key in rows(args):
        if not key:
            table.append((label, ""))
        elif any(key in run for run in runs):
            table.append((label, kueue_baseline.live_cell(runs, key, "s")))
    widths = [max(len(row[column]) for row in table) for column in range(2)]
    for number, row in enumerate(table):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
                     .rstrip())  # fmt: skip
        if number == 0:
            lines.append("  ".join("-" * width for width in widths))
    lines.append(f"machine: {os.cpu_count()} CPUs")
    return "\n".join(lines)


# --- Main ----------------------------------------------------------------------------------------


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latency-jobs", type=int, default=40)
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between submits")
    parser.add_argument("--job-seconds", type=float, default=1.0, help="a latency job's run")
    parser.add_argument("--reclaims", type=int, default=10,
                        help="reclaims once every borrower has run --settle-seconds")  # fmt: skip
    parser.add_argument("--settle-seconds", type=float, default=5.0)
    parser.add_argument("--early-reclaims", type=int, default=5,
                        help="reclaims as soon as every borrower's script has started")  # fmt: skip
    parser.add_argument("--sim-nodes", type=int, default=100, help="simulated kubelets")
    parser.add_argument("--heartbeat-seconds", type=float, default=10.0,
                        help="the simulated kubelets' lease renewals")  # fmt: skip
    parser.add_argument("--node-grace", type=int, default=40,
                        help="controller-manager --node-monitor-grace-period with the "
                        "simulated nodes (k8s_up.sh's 10 s with kube1)")  # fmt: skip
    parser.add_argument("--no-agents", action="store_true", help="skip the portal on agents")
    parser.add_argument("--quick", action="store_true", help="small counts, 1 run")
    parser.add_argument("--keep", action="store_true", help="keep logs and files")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.latency_jobs, args.reclaims, args.early_reclaims = 1, 10, 3, 2
    return args


def main() -> int:
    args = parse()
    # A plain `kill` cleans up as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = Path(tempfile.mkdtemp(prefix="bench-k8s-"))
    kube = Kube()
    simulator: Simulator | None = None
    parts: list[PortalPart] = []
    runs: list[dict[str, float]] = []
    began = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - began:5.0f} s] {text}", flush=True)

    try:
        for index in range(1, args.runs + 1):
            figures: dict[str, float] = {}
            kube.restart(kubelet=True, node_grace=10)
            figures.update(kube.alone("kube1 alone", [REAL_NODE], args, tmp))
            say(f"run {index}: Kubernetes alone on kube1 done")
            figures.update(portal_part(args, "kube1", 1, parts, kube=kube))
            say(f"run {index}: the portal on kube1 done")

            kube.restart(kubelet=False, node_grace=args.node_grace)
            simulator = Simulator(kube, args.sim_nodes, args.heartbeat_seconds, tmp)
            simulator.start()
            figures.update(kube.alone("sim alone", simulator.names, args, tmp))
            say(f"run {index}: Kubernetes alone on {args.sim_nodes} simulated nodes done")
            figures.update(portal_part(args, "sim", args.sim_nodes, parts, kube=kube,
                                       simulator=simulator))  # fmt: skip
            say(f"run {index}: the portal on {args.sim_nodes} simulated nodes done")
            simulator.stop()
            simulator = None
            kube.stop()

            if not args.no_agents:
                figures.update(portal_part(args, "agents 1", 1, parts))
                say(f"run {index}: the portal on 1 agent done")
                figures.update(portal_part(args, "agents n", args.sim_nodes, parts))
                say(f"run {index}: the portal on {args.sim_nodes} agents done")
            derived(figures)
            runs.append(figures)
            print(run_line(index, figures, args), flush=True)
        print(report(runs, args), flush=True)
        say("done")
        return 0
    finally:
        for part in parts:
            with contextlib.suppress(Exception):
                part.stop_everything()
        if simulator is not None:
            with contextlib.suppress(Exception):
                simulator.stop()
        with contextlib.suppress(Exception):
            kube.stop()
        with contextlib.suppress(Exception):
            drop_database()
        with contextlib.suppress(Exception):
            import redis

            redis.Redis.from_url(soak.REDIS_URL).flushdb()
        if args.keep:
            print(f"Kubernetes' files in {K8S_SETTINGS['K8S_DIR']}, the bench's in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(K8S_SETTINGS["K8S_DIR"], ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
