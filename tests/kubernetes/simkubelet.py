#!/usr/bin/env python3
"""A simulated kubelet: a stand-in for the kubelet ONLY, for the Kubernetes connector's tests
and benchmarks, which need more nodes than the one real kubelet a test machine runs (a gang over
two nodes, a mixed pool, a pool of 100 nodes). Everything else is real: it talks to a real
kube-apiserver the way a kubelet does, and the real controller-manager and scheduler see its
nodes as any others. One process runs many nodes, cheaply: one watch over the pods of all of
them, one over their Node objects, one heartbeat thread, two small pools of writer threads, one
log server, and one thread per running pod (blocked in waitid, costing nothing). It speaks
JSON over the kubeconfig's credentials with urllib3 (the kubernetes client's transport; the
client itself only reads the kubeconfig).

Each simulated node
- registers a Node (labels as given, plus kubernetes.io/hostname and SIM_LABEL=true; capacity and
  allocatable with nvidia.com/gpu: N, cpu, memory, pods; condition Ready=True; InternalIP 127.0.0.1,
  its only address) and keeps it alive like a kubelet: it renews its Lease in kube-node-lease every
  `heartbeat_seconds` (the lease lasts 4 times that, as a kubelet's) and posts its node status (the
  conditions' lastHeartbeatTime) every `status_report_seconds` (5 min, the kubelet's
  nodeStatusReportFrequency) and at once whenever someone else has marked it not Ready. The
  heartbeat must stay well within the controller-manager's --node-monitor-grace-period (less its
  --node-monitor-period): 2 s by default, as scripts/k8s_up.sh's kubelet (its grace is
  K8S_NODE_GRACE=10 s); a stock kubelet's is 10 s, for a 40 s grace. Each renewal costs about 2 ms
  of CPU here and 7 ms in the apiserver and etcd: for 100 nodes, 2 s heartbeats take about 45% of a
  core in all, 10 s ones (with a grace of 30 s or more) a fifth of that. A node can be made to die
  (`die`: it stops heartbeating, writes nothing, and by default its processes are SIGKILLed like a
  crashed machine's; the node lifecycle controller marks it NotReady, condition Ready=Unknown, after
  its node-monitor-grace-period) and to revive (`revive`: Ready again at once, and it catches up
  with every pod bound to it meanwhile).
- runs the pods bound to it (spec.nodeName), in creation order, like a kubelet: it admits a pod only
  if its nvidia.com/gpu limits (the largest of the containers' sum and each init container's) fit in
  the node's GPUs that no admitted, still running pod holds; otherwise the pod is Failed with the
  kubelet's reason `OutOfnvidia.com/gpu` and message ("Pod Node didn't have enough resource:
  nvidia.com/gpu, requested: 2, used: 8, capacity: 8"), plus a Warning event. An admitted pod's
  FIRST container's `command` + `args` (with $(VAR) references expanded as Kubernetes does) runs as
  a local process in its own process group, with the environment a container would have: the
  container's `env` (plain values and the usual fieldRefs; secrets and config maps are not
  supported), PATH (the simulator's own: it stands in for the image's), HOSTNAME (the pod's name),
  CUDA_VISIBLE_DEVICES (the GPU indices assigned to it, the lowest free ones, e.g. "2,3"; "" for
  none), and the marker SIMKUBELET_NODE=<node>. The process runs on this machine, so a hostPath
  volume is only where the container expects it when mounted at its own path (mountPath =
  hostPath.path), as the connector mounts them; a DirectoryOrCreate hostPath is created first, as
  the kubelet does. Its working directory: the host directory of workingDir if that lies in a
  hostPath mount (created if need be, as a runtime creates a working directory); else workingDir if
  that is a directory of this machine; else, with a hostPath mount, the simulator's own (the command
  cd's where it must); else a fresh directory of its own,
  LOG_DIR/<node>/<namespace>_<pod>_<uid>/workdir. The pod is reported Running (podIP and hostIP
  127.0.0.1, containerStatuses[0].state.running, ready, conditions) and, when the process ends,
  Succeeded (exit 0) or Failed with containerStatuses[0].state.terminated {exitCode, reason
  Completed/Error, startedAt, finishedAt}. As in a container, the rest of the process group is
  SIGKILLed when the main process ends. The pod stays until someone deletes it.
- deletes gracefully like a kubelet: when a running pod gets a deletionTimestamp, its process group
  gets SIGTERM and, deletionGracePeriodSeconds later (at least 2 s, the kubelet's minimum), SIGKILL;
  once the process has ended, the pod's terminated status is written (exitCode 143 after SIGTERM,
  137 after SIGKILL, or whatever the process exited with) and only THEN is the pod deleted for good
  (gracePeriodSeconds 0, precondition on its uid), as the kubelet does once a pod's containers are
  gone. A pod deleted before it ever ran is just deleted for good; a pod force-deleted while running
  has its process stopped the same way.
- writes each pod's stdout and stderr, interleaved as `kubectl logs` shows them, to
  LOG_DIR/<node>/<namespace>_<pod>_<uid>/<container>.log (`pod_log_path`), and serves them as a
  kubelet does, so that `pods/log` through the apiserver (tailLines, limitBytes; not follow) works
  for simulated nodes too: one HTTPS server on 127.0.0.1 for all the nodes of the process, its port
  their Node's kubelet port (daemonEndpoints). The apiserver checks a kubelet's certificate against
  its --kubelet-certificate-authority if it has one (scripts/k8s_up.sh's has: pass that CA and its
  key, $K8S_DIR/pki/ca.crt and ca.key, as `ca_cert`, `ca_key`, and the simulator makes its
  certificate with them); without one, the certificate is self-signed. No authentication of the
  apiserver, no exec, no stats. The files stay after the pods are gone.

Caveats. Only the first container runs; init containers and images are ignored; the only
resource admission checks is nvidia.com/gpu (not cpu, memory or the pod count); no probes, no
restarts (restartPolicy is taken as Never); the processes run as the simulator's user on this
machine, unconfined. If the simulator stops (SIGTERM, SIGINT, `stop()`), its pods' processes die
with it (SIGTERM to each process group, SIGKILL 2 s later) and their pods are left as they are
in the API; a simulator started again for the same nodes reports such pods Failed (exitCode
137), since their processes are gone. If the simulator is SIGKILLed its processes survive it,
until a simulator for the same nodes starts again or `--cleanup` runs: both kill every process
marked SIMKUBELET_NODE=<one of its nodes>.

Command line (runs until SIGTERM or SIGINT; prints `simkubelet: N nodes up, kubelet port P`
once registered):
    python tests/kubernetes/simkubelet.py --kubeconfig PATH --nodes sim1,sim2 --gpus 8 \\
        --label nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3 --log-dir DIR
    python tests/kubernetes/simkubelet.py --kubeconfig PATH --count 100 --prefix sim ...
  --control-stdin reads commands from stdin, one a line, and answers `ok ...` or `error ...` on
  stdout: `die NODE` (crash: processes killed), `die NODE keep-processes` (cut off from the
  apiserver: processes keep running), `revive NODE`, `evict NAMESPACE/POD` (as a kubelet's
  eviction under node pressure: the pod's processes killed, the pod Failed with reason
  Evicted), `stop`.
  --delete-nodes-on-exit deletes the Node objects and their leases when it stops.
  --cleanup kills the processes left by an earlier simulator of these nodes, and exits.
  --ca-cert/--ca-key: the CA the apiserver trusts for kubelets, to sign the log server's
  certificate; --kubelet-port, --tls-cert/--tls-key, --no-serve-logs: the log server's port
  (default: any free one), a certificate of one's own, or no log server (kubelet port 0).
In-process: `SimKubelet(kubeconfig, [NodeSpec(...)], log_dir).start()`, then `die`, `revive`,
`stop`.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import logging
import math
import os
import queue
import re
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import urllib3

log = logging.getLogger("simkubelet")

GPU = "nvidia.com/gpu"
# On every Node this simulator registers, so that they can be told from real ones.
SIM_LABEL = "simkubelet.gpu-portal.test/simulated"
# In every process it starts (and so in their children): how leftovers are found and killed.
MARK = "SIMKUBELET_NODE"
LEASE_NAMESPACE = "kube-node-lease"
MIN_GRACE_SECONDS = 2  # the kubelet's minimumGracePeriodInSeconds
# What the kubelet's eviction manager writes when memory runs short.
EVICTION_MESSAGE = (
    "The node was low on resource: memory. Container job was using 1Gi, which exceeds its "
    "request of 0."
)
DEFAULT_GRACE_SECONDS = 30  # a pod spec's terminationGracePeriodSeconds when unset
ADDRESS = "127.0.0.1"
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
WATCH_SECONDS = 300
# A healthy node's conditions, as a kubelet words them.
NODE_CONDITIONS = (
    ("MemoryPressure", "False", "KubeletHasSufficientMemory",
     "kubelet has sufficient memory available"),
    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
)  # fmt: skip


def now_iso() -> str:
    """The current time as Kubernetes writes metav1.Time (RFC 3339, whole seconds, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    """The current time as Kubernetes writes metav1.MicroTime (a Lease's renewTime)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def pod_dir(log_dir: str | Path, node: str, namespace: str, pod: str, uid: str) -> Path:
    """The directory of one pod's files on a simulated node: its log, and its working directory
    when it has none of its own."""
    return Path(log_dir) / node / f"{namespace}_{pod}_{uid}"


def pod_log_path(
    log_dir: str | Path, node: str, namespace: str, pod: str, uid: str, container: str
) -> Path:
    """Where a simulated node writes a pod's container's stdout and stderr."""
    return pod_dir(log_dir, node, namespace, pod, uid) / f"{container or 'container'}.log"


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """`text` with Kubernetes' variable references expanded: $(NAME) becomes NAME's value when
    `env` defines it and stays as it is otherwise; $$ becomes $ (so $$(NAME) stays literal)."""
    return _REFERENCE.sub(
        lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text
    )


def gpus_requested(spec: dict) -> int:
    """The pod's nvidia.com/gpu request as the kubelet's admission counts it: the larger of its
    containers' sum and its largest init container's (limits, which an extended resource's
    request must equal, or requests)."""

    def of(container: dict) -> int:
        resources = container.get("resources") or {}
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        value = limits.get(GPU) or requests.get(GPU)
        return int(float(str(value))) if value else 0

    containers = sum(of(c) for c in spec.get("containers") or [])
    init = max((of(c) for c in spec.get("initContainers") or []), default=0)
    return max(containers, init)


def kill_marked(nodes: set[str], sig: int = signal.SIGKILL) -> int:
    """Send `sig` to every process of this machine whose environment says it was started for
    one of `nodes` (MARK), and answer how many there were."""
    marks = {f"{MARK}={name}".encode() for name in nodes}
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as environ:
                variables = set(environ.read().split(b"\0"))
        except OSError:
            continue
        if variables & marks:
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), sig)
                count += 1
    return count


class ApiError(Exception):
    """The apiserver answered with an error status."""

    def __init__(self, status: int, body: dict) -> None:
        super().__init__(f"{status}: {body.get('message') or body}")
        self.status = status
        self.body = body


class Api:
    """The apiserver of a kubeconfig (its current context), JSON in and out as plain dicts over
    one thread-safe urllib3 pool: the kubernetes client's own transport, without the CPU its
    models cost. The kubernetes client only reads the kubeconfig (embedded certificates,
    tokens)."""

    def __init__(self, kubeconfig: str) -> None:
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        self.base = configuration.host.rstrip("/")
        self.headers = {"Accept": JSON}
        authorization = configuration.get_api_key_with_prefix("authorization")
        if authorization:
            self.headers["Authorization"] = authorization
        tls = {}
        if self.base.startswith("https"):
            tls = {
                "cert_reqs": "CERT_REQUIRED" if configuration.verify_ssl else "CERT_NONE",
                "ca_certs": configuration.ssl_ca_cert,
                "cert_file": configuration.cert_file,
                "key_file": configuration.key_file,
            }
            if configuration.tls_server_name:
                tls["server_hostname"] = configuration.tls_server_name
        # Enough connections for every thread at once (writers, heartbeats, two watches);
        # block=False: a burst opens more rather than waiting.
        self.pool = urllib3.PoolManager(num_pools=2, maxsize=16, block=False, **tls)

    def _url(self, path: str, query: dict[str, str] | None) -> str:
        return self.base + path + ("?" + urllib.parse.urlencode(query) if query else "")

    def request(
        self,
        method: str,
        path: str,
        body: dict | None = None,
        *,
        query: dict[str, str] | None = None,
        content_type: str = JSON,
        timeout: float = 15,
    ) -> dict:
        """The decoded answer to one request; ApiError for an error status, urllib3's errors
        when the apiserver cannot be reached."""
        headers = dict(self.headers)
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        response = self.pool.request(
            method,
            self._url(path, query),
            body=data,
            headers=headers,
            retries=False,
            timeout=urllib3.Timeout(connect=5, read=timeout),
        )
        try:
            answer = json.loads(response.data) if response.data else {}
        except ValueError:
            answer = {"message": response.data[:500].decode(errors="replace")}
        if response.status >= 400:
            raise ApiError(response.status, answer)
        return answer

    def watch(self, path: str, query: dict[str, str]) -> Iterator[dict]:
        """The events ({type, object}) of one watch request, as they come, until the apiserver
        ends it (after WATCH_SECONDS at most)."""
        query = {
            **query,
            "watch": "1",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(WATCH_SECONDS),
        }
        response = self.pool.request(
            "GET",
            self._url(path, query),
            headers=self.headers,
            retries=False,
            preload_content=False,
            timeout=urllib3.Timeout(connect=5, read=WATCH_SECONDS + 30),
        )
        try:
            if response.status >= 400:
                raise ApiError(response.status, json.loads(response.read() or b"{}"))
            pending = b""
            for chunk in response.stream(65536):
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
        finally:
            # Half-read: the connection cannot be reused, so it is closed before it goes back.
            response.close()
            response.release_conn()


@dataclass
class NodeSpec:
    """One simulated node: its name, GPUs, labels and what else it claims to have."""

    name: str
    gpus: int = 8
    labels: dict[str, str] = field(default_factory=dict)
    cpu: str = "16"
    memory: str = "64Gi"
    pods: int = 110


@dataclass
class _Node:
    spec: NodeSpec
    free: set[int]  # the GPU indices no running pod holds
    alive: bool = True
    uid: str = ""
    ready_since: str = ""  # the Ready condition's lastTransitionTime
    next_lease: float = 0.0
    next_report: float = 0.0
    lease_pending: bool = False
    report_pending: bool = False
    boot_id: str = field(default_factory=lambda: str(uuid.uuid4()))  # one per simulator run


@dataclass
class _Run:
    """What this simulator knows of one pod bound to one of its nodes, from its admission until
    the pod is gone from the API and its process has ended."""

    uid: str
    namespace: str
    name: str
    node: str
    container: str
    image: str
    gpus: int
    indices: list[int] = field(default_factory=list)
    process: subprocess.Popen | None = None
    started_at: str = ""
    exit_code: int | None = None
    reason: str = ""
    message: str = ""
    finished_at: str = ""
    rejected: tuple[str, str] | None = None  # (reason, message) when admission refused it
    evicted: str = ""  # the eviction's message, once `evict` has evicted it
    kill_at: float | None = None  # monotonic time of the SIGKILL once SIGTERM is sent
    gone: bool = False  # deleted from the API
    gone_grace: int = 0
    reported_running: bool = False
    reported_end: bool = False
    delete_sent: bool = False

    @property
    def running(self) -> bool:
        """Whether its process was started and has not been reaped yet."""
        return self.process is not None and self.exit_code is None

    @property
    def container_id(self) -> str:
        """The containerID reported for it: the node and the process id."""
        return f"simkubelet://{self.node}/{self.process.pid if self.process else 0}"


class _Writers:
    """API writes run by `count` threads: in order for one key (a pod's uid, a node's name),
    in parallel across keys."""

    def __init__(self, name: str, count: int) -> None:
        self._queues: list[queue.SimpleQueue] = [queue.SimpleQueue() for _ in range(count)]
        for index, q in enumerate(self._queues):
            threading.Thread(
                target=self._serve, args=(q,), daemon=True, name=f"{name}-{index}"
            ).start()

    def submit(self, key: str, action: Callable[[], None]) -> None:
        """Run `action` after every action submitted before it with the same key."""
        self._queues[hash(key) % len(self._queues)].put(action)

    def close(self) -> None:
        """End the threads once they have run what was submitted before."""
        for q in self._queues:
            q.put(None)

    @staticmethod
    def _serve(q: queue.SimpleQueue) -> None:
        while (action := q.get()) is not None:
            try:
                action()
            except Exception:
                log.exception("an API write failed")


def serving_certificate(
    directory: Path, ca_cert: str | None = None, ca_key: str | None = None
) -> tuple[str, str]:
    """A serving certificate for 127.0.0.1 and its key, made now, as files in `directory`:
    signed by the CA of `ca_cert` and `ca_key` (PEM files) if given, else self-signed."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "simkubelet")])
    issuer, signer = name, key
    if ca_cert and ca_key:
        issuer = x509.load_pem_x509_certificate(Path(ca_cert).read_bytes()).subject
        signer = serialization.load_pem_private_key(Path(ca_key).read_bytes(), None)
    now = datetime.now(UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=365))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ADDRESS))]),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(signer, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = directory / "kubelet.crt", directory / "kubelet.key"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_file.chmod(0o600)
    return str(cert_file), str(key_file)


def tail(data: bytes, lines: int | None, limit: int | None) -> bytes:
    """A log as the kubelet serves it: its last `lines` lines (all if None or negative), then at
    most `limit` bytes of those."""
    if lines is not None and lines >= 0:
        cut = len(data)
        if data.endswith(b"\n"):
            cut -= 1
        for _ in range(lines):
            cut = data.rfind(b"\n", 0, cut)
            if cut < 0:
                break
        data = data[cut + 1 :] if lines > 0 else b""
    return data[:limit] if limit is not None else data


class _LogServer(ThreadingHTTPServer):
    """The one read of the kubelet API a connector makes, served for every node of this
    simulator (they share 127.0.0.1 and this port): GET /containerLogs/NS/POD/CONTAINER with
    tailLines and limitBytes, which the apiserver proxies for `pods/log`; HTTPS, as the
    apiserver speaks to kubelets."""

    daemon_threads = True

    def __init__(self, sim: SimKubelet, port: int, cert_file: str, key_file: str) -> None:
        super().__init__((ADDRESS, port), _LogHandler)
        self.sim = sim
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        # The handshake in the request's thread, not in the one that accepts connections.
        self.socket = context.wrap_socket(
            self.socket, server_side=True, do_handshake_on_connect=False
        )


class _LogHandler(BaseHTTPRequestHandler):
    server: _LogServer

    def do_GET(self) -> None:  # noqa: N802 — http.server's name
        """A container's log, or 404 for anything else (another path, a pod not here)."""
        url = urllib.parse.urlsplit(self.path)
        parts = url.path.strip("/").split("/")
        query = urllib.parse.parse_qs(url.query)
        if len(parts) != 4 or parts[0] != "containerLogs":
            self._answer(404, b"only /containerLogs/NAMESPACE/POD/CONTAINER is served\n")
            return
        path = self.server.sim.log_file(*parts[1:])
        if path is None:
            self._answer(404, f"pod {parts[1]}/{parts[2]} not found\n".encode())
            return

        def number(name: str) -> int | None:
            values = query.get(name)
            return int(values[0]) if values and values[0].lstrip("-").isdigit() else None

        try:
            data = path.read_bytes()
        except OSError:
            data = b""
        self._answer(200, tail(data, number("tailLines"), number("limitBytes")))

    def _answer(self, status: int, body: bytes) -> None:
        """Send `body` as the whole response, plain text."""
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 — http.server's name
        """Requests go to the debug log, not to stderr."""
        log.debug("log server: " + format, *args)


class SimKubelet:
    """Simulated kubelets for `nodes`, in this process (see the module's docstring). `start()`
    registers the nodes and returns once the pods already bound to them are taken in hand;
    `stop()` kills their processes and, with `delete_nodes_on_exit`, deletes the nodes."""

    def __init__(
        self,
        kubeconfig: str,
        nodes: list[NodeSpec],
        log_dir: str | Path,
        *,
        heartbeat_seconds: float = 2,
        status_report_seconds: float = 300,
        delete_nodes_on_exit: bool = False,
        writers: int = 4,
        serve_logs: bool = True,
        kubelet_port: int = 0,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        ca_cert: str | None = None,
        ca_key: str | None = None,
    ) -> None:
        self.api = Api(kubeconfig)
        self.log_dir = Path(log_dir).resolve()
        self.heartbeat_seconds = heartbeat_seconds
        # A kubelet renews its lease every quarter of its duration.
        self.lease_seconds = max(1, math.ceil(4 * heartbeat_seconds))
        self.status_report_seconds = status_report_seconds
        self.delete_nodes_on_exit = delete_nodes_on_exit
        self._nodes = {spec.name: _Node(spec, set(range(spec.gpus))) for spec in nodes}
        self._runs: dict[str, _Run] = {}  # by pod uid
        self._pods: dict[str, dict] = {}  # the latest object of each pod bound to our nodes
        # One lock for all of this state: every section under it is short (no API call; a
        # fork at most).
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._wake = threading.Event()  # the heartbeat thread's: a node revived
        self._pods_listed = threading.Event()
        self._writers_count = writers
        self._pod_writers: _Writers | None = None
        self._beat_writers: _Writers | None = None
        self._version = "v0.0.0"
        self._serve_logs = serve_logs
        self._tls = (tls_cert, tls_key, ca_cert, ca_key)
        self._log_server: _LogServer | None = None
        self.kubelet_port = kubelet_port  # the log server's, once started; 0: none

    # ----- life cycle

    def start(self, timeout: float = 60) -> None:
        """Register every node (Node, status, Lease) and start its heartbeats and the watches;
        return once the pods already bound to the nodes have been taken in hand."""
        killed = kill_marked(set(self._nodes))
        if killed:
            log.warning("killed %d processes left by an earlier simulator of these nodes", killed)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self._serve_logs:
            cert_file, key_file, ca_cert, ca_key = self._tls
            if not cert_file:
                cert_file, key_file = serving_certificate(self.log_dir / ".tls", ca_cert, ca_key)
            self._log_server = _LogServer(self, self.kubelet_port, cert_file, key_file)
            self.kubelet_port = self._log_server.server_address[1]
            threading.Thread(
                target=self._log_server.serve_forever, daemon=True, name="log-server"
            ).start()
        with contextlib.suppress(ApiError, KeyError):
            self._version = self.api.request("GET", "/version")["gitVersion"]
        self._pod_writers = _Writers("pod-writer", self._writers_count)
        self._beat_writers = _Writers("heartbeat", 2)
        # A few at a time: each is four requests, most of their time the apiserver's.
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(self._register, self._nodes.values()))
        now = time.monotonic()
        for index, node in enumerate(self._nodes.values()):
            # Spread the heartbeats over the interval rather than all at once.
            node.next_lease = now + self.heartbeat_seconds * (index + 1) / len(self._nodes)
            node.next_report = now + self.status_report_seconds
        threading.Thread(target=self._heartbeats, daemon=True, name="heartbeats").start()
        if len(self._nodes) == 1:  # a kubelet's own selector
            pods_query = {"fieldSelector": f"spec.nodeName={next(iter(self._nodes))}"}
        else:  # every bound pod, filtered here: field selectors have no "in"
            pods_query = {"fieldSelector": "spec.nodeName!="}
        threading.Thread(
            target=self._informer,
            daemon=True,
            name="pod-watch",
            args=("/api/v1/pods", pods_query, self._replace_pods, self._on_pod_event),
        ).start()
        threading.Thread(
            target=self._informer,
            daemon=True,
            name="node-watch",
            args=(
                "/api/v1/nodes",
                {"labelSelector": f"{SIM_LABEL}=true"},
                self._replace_nodes,
                self._on_node_event,
            ),
        ).start()
        if not self._pods_listed.wait(timeout):
            raise TimeoutError("the pods of the simulated nodes could not be listed")
        log.info("%d simulated nodes up", len(self._nodes))

    def stop(self) -> None:
        """Stop: SIGTERM to every pod's process group, SIGKILL 2 s later, nothing more written
        about the pods; the nodes (and leases) deleted with `delete_nodes_on_exit`."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._wake.set()
        with self._lock:
            running = [run for run in self._runs.values() if run.running]
            for run in running:
                self._signal(run, signal.SIGTERM)
        deadline = time.monotonic() + MIN_GRACE_SECONDS
        while time.monotonic() < deadline and any(run.running for run in running):
            time.sleep(0.05)
        with self._lock:
            for run in running:
                self._signal(run, signal.SIGKILL)
        kill_marked(set(self._nodes))  # whatever left its process group
        if self._log_server:
            self._log_server.shutdown()
            self._log_server.server_close()
        if self.delete_nodes_on_exit:
            for name in self._nodes:
                for path in (
                    f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{name}",
                    f"/api/v1/nodes/{name}",
                ):
                    try:
                        self.api.request("DELETE", path)
                    except (ApiError, urllib3.exceptions.HTTPError) as error:
                        log.warning("could not delete %s: %s", path, error)
        for writers in (self._pod_writers, self._beat_writers):
            if writers:
                writers.close()
        log.info("stopped")

    def die(self, name: str, *, kill_processes: bool = True) -> None:
        """Node `name` goes silent: no heartbeat, no status, no pod handled until `revive`; with
        `kill_processes` (a crashed machine) its pods' processes are SIGKILLed now, otherwise
        (a node cut off from the apiserver) they keep running."""
        with self._lock:
            node = self._nodes[name]
            node.alive = False
            if kill_processes:
                for run in self._runs.values():
                    if run.node == name and run.running:
                        self._signal(run, signal.SIGKILL)
        log.info("node %s dies (processes %s)", name, "killed" if kill_processes else "kept")

    def evict(self, namespace: str, name: str, message: str = EVICTION_MESSAGE) -> None:
        """Evict a running pod as a kubelet's eviction manager does under node pressure (a hard
        threshold: no grace): its processes are killed and the pod is Failed, reason Evicted,
        with `message`; the pod object stays. Raises KeyError for a pod not running here."""
        with self._lock:
            found = [r for r in self._runs.values() if (r.namespace, r.name) == (namespace, name)]
            run = next((r for r in found if r.running), None)
            if run is None:
                raise KeyError(f"no running pod {namespace}/{name}")
            run.evicted = message
            log.info("pod %s/%s on %s: evicted", namespace, name, run.node)
            self._signal(run, signal.SIGKILL)

    def revive(self, name: str) -> None:
        """Node `name` is back: Ready at once, and every pod bound to it is caught up with (what
        ended meanwhile reported, what was deleted stopped, what was bound to it started)."""
        with self._lock:
            node = self._nodes[name]
            if node.alive:
                return
            node.alive = True
            node.ready_since = now_iso()
            node.next_lease = node.next_report = time.monotonic()
            for run in self._runs.values():
                if run.node == name and run.running:
                    run.reported_running = False  # the controller marked its pods not ready
            uids = {uid for uid, run in self._runs.items() if run.node == name}
            uids |= {uid for uid, pod in self._pods.items() if _node_of(pod) == name}
            for uid in sorted(uids, key=self._creation):
                self._sync(uid)
        self._wake.set()
        log.info("node %s revived", name)

    def log_file(self, namespace: str, pod: str, container: str) -> Path | None:
        """The log file of a container of a pod that this simulator runs or ran and that still
        exists (the latest of that name); None if there is none."""
        with self._lock:
            runs = [
                run
                for run in self._runs.values()
                if run.namespace == namespace and run.name == pod and not run.gone
            ]
        run = max(runs, key=lambda r: r.started_at, default=None)
        if run is None or not run.started_at or container != run.container:
            return None
        return pod_log_path(self.log_dir, run.node, namespace, pod, run.uid, container)

    def _creation(self, uid: str) -> str:
        """The pod's creationTimestamp, "" if it is gone: the order a kubelet admits pods in."""
        pod = self._pods.get(uid)
        return pod["metadata"].get("creationTimestamp", "") if pod else ""

    # ----- the nodes

    def _node_status(self, node: _Node) -> dict:
        """The node's status as its kubelet posts it, heartbeats now."""
        spec = node.spec
        capacity = {
            "cpu": spec.cpu,
            "memory": spec.memory,
            "pods": str(spec.pods),
            "ephemeral-storage": "100Gi",
            GPU: str(spec.gpus),
        }
        heartbeat = now_iso()
        return {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [
                {
                    "type": kind,
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "lastHeartbeatTime": heartbeat,
                    "lastTransitionTime": node.ready_since,
                }
                for kind, status, reason, message in NODE_CONDITIONS
            ],
            # No Hostname address: the apiserver would try it first, and a simulated node's
            # name does not resolve.
            "addresses": [{"type": "InternalIP", "address": ADDRESS}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.kubelet_port}},
            "nodeInfo": {
                "machineID": uuid.uuid5(uuid.NAMESPACE_DNS, spec.name).hex,
                "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_DNS, spec.name)),
                "bootID": node.boot_id,
                "kernelVersion": os.uname().release,
                "osImage": "simkubelet (tests/kubernetes/simkubelet.py)",
                "containerRuntimeVersion": "simkubelet://1",
                "kubeletVersion": self._version,
                "kubeProxyVersion": self._version,
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    def _register(self, node: _Node) -> None:
        """Create the Node (or take over an existing one of that name), post its status, and
        create its Lease, owned by the Node so that it goes with it."""
        name = node.spec.name
        node.ready_since = now_iso()
        metadata = {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **node.spec.labels,
                SIM_LABEL: "true",
            },
            "annotations": {SIM_LABEL: "a kubelet stand-in: tests/kubernetes/simkubelet.py"},
        }
        status = self._node_status(node)
        try:
            created = self.api.request(
                "POST",
                "/api/v1/nodes",
                {"apiVersion": "v1", "kind": "Node", "metadata": metadata, "status": status},
            )
        except ApiError as error:
            if error.status != 409:
                raise
            created = self.api.request(
                "PATCH", f"/api/v1/nodes/{name}", {"metadata": metadata}, content_type=MERGE_PATCH
            )
        node.uid = created["metadata"]["uid"]
        # A Node's status on creation may be dropped or stale (a node taken over): post it.
        self.api.request(
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            {"status": status},
            content_type=STRATEGIC_PATCH,
        )
        self._create_lease(node)

    def _create_lease(self, node: _Node) -> None:
        """Create the node's Lease, renewed now and owned by its Node (so that it goes with
        it), or take over the one there is."""
        name = node.spec.name
        lease = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {
                "name": name,
                "namespace": LEASE_NAMESPACE,
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node.uid}
                ],
            },
            "spec": {
                "holderIdentity": name,
                "leaseDurationSeconds": self.lease_seconds,
                "renewTime": now_micro(),
            },
        }
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
        try:
            self.api.request("POST", path, lease)
        except ApiError as error:
            if error.status != 409:
                raise
            self.api.request("PATCH", f"{path}/{name}", lease, content_type=MERGE_PATCH)

    def _heartbeats(self) -> None:
        """The heartbeat thread: each live node's lease renewed every `heartbeat_seconds` and
        its status posted every `status_report_seconds`, by the heartbeat writers."""
        while not self._stopping.is_set():
            self._wake.clear()
            now = time.monotonic()
            wake = now + self.heartbeat_seconds
            with self._lock:
                for node in self._nodes.values():
                    if not node.alive:
                        continue
                    if now >= node.next_lease:
                        node.next_lease = now + self.heartbeat_seconds
                        if not node.lease_pending:  # a slow apiserver: no pile-up
                            node.lease_pending = True
                            self._beat_writers.submit(node.spec.name, lambda n=node: self._renew(n))
                    if now >= node.next_report:
                        node.next_report = now + self.status_report_seconds
                        self._report_node(node)
                    wake = min(wake, node.next_lease, node.next_report)
            self._wake.wait(max(0.01, wake - time.monotonic()))

    def _renew(self, node: _Node) -> None:
        name = node.spec.name
        path = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases/{name}"
        try:
            if node.alive and not self._stopping.is_set():
                self.api.request(
                    "PATCH",
                    path,
                    {
                        "spec": {
                            "holderIdentity": name,
                            "leaseDurationSeconds": self.lease_seconds,
                            "renewTime": now_micro(),
                        }
                    },
                    content_type=MERGE_PATCH,
                )
        except ApiError as error:
            if error.status == 404:  # deleted by someone: as the kubelet does, create it again
                with contextlib.suppress(ApiError, urllib3.exceptions.HTTPError):
                    self._create_lease(node)
            else:
                log.warning("lease of %s not renewed: %s", name, error)
        except urllib3.exceptions.HTTPError as error:
            log.warning("lease of %s not renewed: %s", name, error)
        finally:
            node.lease_pending = False

    def _report_node(self, node: _Node) -> None:
        """Queue a post of the node's status (its heartbeat); call with the lock held."""
        if node.report_pending:
            return
        node.report_pending = True

        def send() -> None:
            try:
                if node.alive and not self._stopping.is_set():
                    self._call(
                        "PATCH",
                        f"/api/v1/nodes/{node.spec.name}/status",
                        {"status": self._node_status(node)},
                        STRATEGIC_PATCH,
                    )
            finally:
                node.report_pending = False

        self._beat_writers.submit(node.spec.name, send)

    def _replace_nodes(self, items: list[dict]) -> None:
        """A full listing of the simulated nodes: each handled as a change."""
        for item in items:
            self._on_node_event("MODIFIED", item)

    def _on_node_event(self, kind: str, obj: dict) -> None:
        """A live node that someone else marked not Ready (the node lifecycle controller, after
        a missed heartbeat) posts its status at once, as the kubelet does within 10 s."""
        node = self._nodes.get(obj["metadata"]["name"])
        if node is None:
            return
        if kind == "DELETED":
            # A kubelet registers only when it starts; so does this one.
            if not self._stopping.is_set():
                log.warning("node %s was deleted from the API", node.spec.name)
            return
        conditions = (obj.get("status") or {}).get("conditions") or []
        ready = next((c.get("status") for c in conditions if c.get("type") == "Ready"), None)
        if ready != "True":
            with self._lock:
                if node.alive and not node.report_pending:
                    node.ready_since = now_iso()
                    self._report_node(node)

    # ----- watches

    def _informer(
        self,
        path: str,
        query: dict[str, str],
        replace: Callable[[list[dict]], None],
        handle: Callable[[str, dict], None],
    ) -> None:
        """List `path` then watch it, for as long as the simulator runs: `replace` gets each full
        listing (the first, and another whenever the watch's history is gone), `handle` each
        event after."""
        version = ""
        while not self._stopping.is_set():
            try:
                if not version:
                    listing = self.api.request("GET", path, query=query, timeout=60)
                    version = listing["metadata"]["resourceVersion"]
                    replace(listing.get("items") or [])
                for event in self.api.watch(path, {**query, "resourceVersion": version}):
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:  # history compacted: list again
                            version = ""
                            break
                        raise ApiError(obj.get("code") or 500, obj)
                    version = obj["metadata"]["resourceVersion"]
                    if kind != "BOOKMARK":
                        handle(kind, obj)
            except Exception as error:  # the apiserver restarting, a network error, ...
                if self._stopping.is_set():
                    return
                if isinstance(error, ApiError) and error.status == 410:
                    version = ""
                expected = isinstance(error, ApiError | urllib3.exceptions.HTTPError | OSError)
                log.warning("watch of %s: %s; again in 1 s", path, error, exc_info=not expected)
                self._stopping.wait(1)

    def _replace_pods(self, items: list[dict]) -> None:
        """A full listing of pods: those of our nodes taken in hand (in creation order, as a
        kubelet admits them), those no longer listed handled as deleted."""
        mine = sorted(
            (p for p in items if _node_of(p) in self._nodes),
            key=lambda p: p["metadata"].get("creationTimestamp", ""),
        )
        with self._lock:
            present = {p["metadata"]["uid"] for p in mine}
            for uid, old in list(self._pods.items()):
                if uid not in present:
                    self._on_pod_event("DELETED", old)
            for pod in mine:
                self._on_pod_event("MODIFIED", pod)
        self._pods_listed.set()

    def _on_pod_event(self, kind: str, pod: dict) -> None:
        """One watch event of a pod: cached (or forgotten) and synced, if it is bound to one of
        our nodes."""
        if _node_of(pod) not in self._nodes:
            return
        uid = pod["metadata"]["uid"]
        with self._lock:
            if kind == "DELETED":
                self._pods.pop(uid, None)
                run = self._runs.get(uid)
                if run is not None:
                    run.gone = True
                    run.gone_grace = _grace(pod)
            else:
                self._pods[uid] = pod
            self._sync(uid)

    # ----- the pods

    def _sync(self, uid: str) -> None:
        """Bring one pod and its process in line with each other, as a kubelet's pod worker
        does: admit and start a new pod, stop a deleted one, report what changed, delete for
        good a deleted pod whose process has ended. Idempotent; call with the lock held."""
        run = self._runs.get(uid)
        pod = self._pods.get(uid)
        name = run.node if run else _node_of(pod) if pod else None
        if name is None or self._stopping.is_set() or not self._nodes[name].alive:
            return
        if run is None:
            run = self._runs[uid] = self._admit(self._nodes[name], pod)
        if run.gone:
            if run.running:
                self._terminate(run, run.gone_grace)
            else:
                del self._runs[uid]
            return
        deleting = bool(pod["metadata"].get("deletionTimestamp"))
        if run.running:
            if not run.reported_running:
                run.reported_running = True
                self._write(run, "reported_running", self._report_running)
            if deleting:
                self._terminate(run, _grace(pod))
            return
        if not run.reported_end:
            run.reported_end = True
            self._write(run, "reported_end", self._report_end)
        if deleting and not run.delete_sent:
            run.delete_sent = True
            self._write(run, "delete_sent", self._delete_for_good)

    def _admit(self, node: _Node, pod: dict) -> _Run:
        """The run of a pod new to this simulator: started if it is new and its GPUs fit,
        rejected if they do not, and in any other case not started."""
        metadata, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
        container = (spec.get("containers") or [{}])[0]
        run = _Run(
            uid=metadata["uid"],
            namespace=metadata["namespace"],
            name=metadata["name"],
            node=node.spec.name,
            container=container.get("name", ""),
            image=container.get("image", ""),
            gpus=gpus_requested(spec),
        )
        if status.get("phase") in ("Succeeded", "Failed") or metadata.get("deletionTimestamp"):
            run.reported_end = True  # it ended before, or was deleted before it started
            return run
        started = any(
            "running" in (c.get("state") or {}) or "terminated" in (c.get("state") or {})
            for c in status.get("containerStatuses") or []
        )
        if status.get("phase") == "Running" or started:
            # Started by an earlier simulator of this node, whose processes died with it.
            run.started_at = status.get("startTime") or ""
            self._ended(run, 137, "the simulated kubelet restarted; the process died with it")
            return run
        if run.gpus > len(node.free):
            used = node.spec.gpus - len(node.free)
            run.rejected = (
                f"OutOf{GPU}",
                f"Pod Node didn't have enough resource: {GPU}, "
                f"requested: {run.gpus}, used: {used}, capacity: {node.spec.gpus}",
            )
            log.info(
                "pod %s/%s rejected on %s: %s", run.namespace, run.name, run.node, run.rejected[1]
            )
            return run
        run.indices = sorted(node.free)[: run.gpus]
        node.free.difference_update(run.indices)
        self._spawn(run, pod, container)
        return run

    def _environment(self, pod: dict, container: dict, run: _Run) -> dict[str, str]:
        """The process's environment: what the container's would hold (module docstring)."""
        env = {"PATH": os.environ.get("PATH", os.defpath), "HOSTNAME": run.name}
        fields = {
            "metadata.name": run.name,
            "metadata.namespace": run.namespace,
            "metadata.uid": run.uid,
            "spec.nodeName": run.node,
            "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
            "status.hostIP": ADDRESS,
            "status.podIP": ADDRESS,
        }
        for item in container.get("env") or []:
            if "valueFrom" not in item:
                env[item["name"]] = expand(item.get("value", ""), env)
                continue
            path = ((item["valueFrom"].get("fieldRef") or {}).get("fieldPath")) or ""
            match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
            if path in fields:
                env[item["name"]] = fields[path]
            elif match:
                env[item["name"]] = (pod["metadata"].get(match[1]) or {}).get(match[2], "")
            else:
                log.warning(
                    "pod %s/%s: env %s: only plain values and fieldRefs are supported",
                    run.namespace,
                    run.name,
                    item["name"],
                )
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, run.indices))
        env[MARK] = run.node
        return env

    def _spawn(self, run: _Run, pod: dict, container: dict) -> None:
        """Start the container's command as a process of its own group, its output in its log
        file; a command that cannot start ends the run at once (exit 128, as a runtime
        reports it)."""
        env = self._environment(pod, container, run)
        argv = [
            expand(a, env) for a in (container.get("command") or []) + (container.get("args") or [])
        ]
        directory = pod_dir(self.log_dir, run.node, run.namespace, run.name, run.uid)
        directory.mkdir(parents=True, exist_ok=True)
        cwd = self._working_dir(pod, container, directory)
        run.started_at = now_iso()
        if not argv:
            self._ended(
                run,
                128,
                "no command: a simulated node runs only command and args",
                reason="ContainerCannotRun",
            )
            return
        log_path = pod_log_path(
            self.log_dir, run.node, run.namespace, run.name, run.uid, run.container
        )
        try:
            with open(log_path, "ab") as output:
                run.process = subprocess.Popen(
                    argv,
                    cwd=cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
        except OSError as error:
            self._ended(run, 128, str(error), reason="ContainerCannotRun")
            return
        log.info(
            "pod %s/%s started on %s: pid %d, GPUs %s",
            run.namespace,
            run.name,
            run.node,
            run.process.pid,
            run.indices,
        )
        threading.Thread(
            target=self._reap, args=(run,), daemon=True, name=f"pod-{run.name}"
        ).start()

    @staticmethod
    def _working_dir(pod: dict, container: dict, directory: Path) -> str | None:
        """The process's working directory, standing in for the container's: the host
        directory of its workingDir when that lies in a hostPath mount (created if missing, as
        a runtime creates a working directory); else its workingDir if that is a directory of
        this machine; else, with a hostPath mount, the simulator's own (the command cd's where
        it must); else a fresh directory of the pod's own (its "container filesystem")."""
        host_paths = {
            v["name"]: v["hostPath"] for v in pod["spec"].get("volumes") or [] if v.get("hostPath")
        }
        mounts = [
            (m["mountPath"], host_paths[m["name"]])
            for m in container.get("volumeMounts") or []
            if m.get("name") in host_paths
        ]
        for _, host in mounts:
            if host.get("type") == "DirectoryOrCreate":  # the kubelet creates it first
                with contextlib.suppress(OSError):
                    os.makedirs(host["path"], exist_ok=True)
        working = container.get("workingDir")
        if working:
            for mount_path, host in mounts:
                if Path(working).is_relative_to(mount_path):
                    path = Path(host["path"]) / Path(working).relative_to(mount_path)
                    with contextlib.suppress(OSError):
                        path.mkdir(parents=True, exist_ok=True)
                    return str(path)
            if os.path.isdir(working):
                return working
        if mounts:
            return None
        own = directory / "workdir"
        own.mkdir(exist_ok=True)
        return str(own)

    def _reap(self, run: _Run) -> None:
        """The thread of one process: waits for it to end, then records how it ended."""
        pid = run.process.pid
        # Wait without reaping: while the leader is a zombie its pid, the group's id, cannot be
        # reused, so the group kill below reaches only the pod's own processes.
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        with self._lock:
            # As in a container, whatever the main process leaves behind goes with it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            code = run.process.wait()
            self._ended(run, code if code >= 0 else 128 - code)
            log.info(
                "pod %s/%s on %s ended: exit %d", run.namespace, run.name, run.node, run.exit_code
            )
            self._sync(run.uid)

    def _ended(self, run: _Run, code: int, message: str = "", *, reason: str = "") -> None:
        """Record the end of the run's process (or that it never could start) and free its GPUs."""
        run.exit_code = code
        run.reason = reason or ("Completed" if code == 0 else "Error")
        run.message = message
        run.finished_at = now_iso()
        self._nodes[run.node].free.update(run.indices)

    def _signal(self, run: _Run, sig: int) -> None:
        """Signal the process group of a running pod; call with the lock held (the reaper
        records the end under it, so the group is still the pod's)."""
        if run.running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(run.process.pid, sig)

    def _terminate(self, run: _Run, grace: int) -> None:
        """SIGTERM now (once), SIGKILL `grace` seconds later (at least MIN_GRACE_SECONDS, as the
        kubelet); a later, shorter grace brings the SIGKILL forward."""
        kill_at = time.monotonic() + max(grace, MIN_GRACE_SECONDS)
        if run.kill_at is not None and kill_at >= run.kill_at:
            return
        if run.kill_at is None:
            log.info(
                "pod %s/%s on %s: SIGTERM, SIGKILL in %d s",
                run.namespace,
                run.name,
                run.node,
                max(grace, MIN_GRACE_SECONDS),
            )
            self._signal(run, signal.SIGTERM)
        run.kill_at = kill_at
        timer = threading.Timer(kill_at - time.monotonic(), self._kill_late, (run,))
        timer.daemon = True
        timer.start()

    def _kill_late(self, run: _Run) -> None:
        """SIGKILL once the grace is over, if the process is still there."""
        with self._lock:
            if run.kill_at is not None and time.monotonic() >= run.kill_at - 0.05:
                self._signal(run, signal.SIGKILL)

    # ----- the pods' API writes

    def _write(self, run: _Run, flag: str, action: Callable[[_Run], None]) -> None:
        """Queue `action` for the pod of `run`, after the pod's earlier writes. If its node is
        dead when the write's turn comes, nothing is sent and `flag` is cleared, so that the
        write is made when the node revives."""

        def send() -> None:
            with self._lock:
                if self._stopping.is_set():
                    return
                if not self._nodes[run.node].alive:
                    setattr(run, flag, False)
                    return
            action(run)

        self._pod_writers.submit(run.uid, send)

    def _pod_path(self, run: _Run) -> str:
        """The API path of the run's pod."""
        return f"/api/v1/namespaces/{run.namespace}/pods/{run.name}"

    def _patch_status(self, run: _Run, status: dict) -> None:
        """Patch the pod's status (a strategic merge: conditions merged by type)."""
        # The uid in the patch makes it fail, rather than land on a new pod of the same name.
        self._call(
            "PATCH",
            self._pod_path(run) + "/status",
            {"metadata": {"uid": run.uid}, "status": status},
            STRATEGIC_PATCH,
        )

    def _report_running(self, run: _Run) -> None:
        """Post the pod's status as Running, as a kubelet does once its container has started."""
        kinds = ("Initialized", "Ready", "ContainersReady", "PodScheduled")
        conditions = [_condition(kind, True) for kind in kinds]
        state = {"running": {"startedAt": run.started_at}}
        self._patch_status(run, _pod_status(run, "Running", conditions, state, ready=True))

    def _report_end(self, run: _Run) -> None:
        """Post how the pod ended: refused at admission, or its container terminated."""
        if run.rejected:
            reason, message = run.rejected
            self._patch_status(run, {"phase": "Failed", "reason": reason, "message": message})
            self._event(run, reason, message)
            return
        terminated = {
            "exitCode": run.exit_code,
            "reason": run.reason,
            "startedAt": run.started_at or run.finished_at,
            "finishedAt": run.finished_at,
            "containerID": run.container_id,
        }
        if run.message:
            terminated["message"] = run.message
        conditions = [
            _condition("Initialized", True),
            _condition("PodScheduled", True),
            _condition("Ready", False, "PodCompleted"),
            _condition("ContainersReady", False, "PodCompleted"),
        ]
        phase = "Succeeded" if run.exit_code == 0 else "Failed"
        state = {"terminated": terminated}
        status = _pod_status(run, phase, conditions, state, ready=False)
        if run.evicted:
            status.update(phase="Failed", reason="Evicted", message=run.evicted)
        self._patch_status(run, status)
        if run.evicted:
            self._event(run, "Evicted", run.evicted)

    def _delete_for_good(self, run: _Run) -> None:
        """Delete the pod object at once, as a kubelet does once a deleted pod's containers
        are gone; only that pod (its uid), not a new one of the same name."""
        log.info("pod %s/%s on %s deleted for good", run.namespace, run.name, run.node)
        self._call(
            "DELETE",
            self._pod_path(run),
            {
                "apiVersion": "v1",
                "kind": "DeleteOptions",
                "gracePeriodSeconds": 0,
                "preconditions": {"uid": run.uid},
            },
        )

    def _event(self, run: _Run, reason: str, message: str) -> None:
        """Record a Warning event about the pod, from the kubelet of its node."""
        now = now_iso()
        self._call(
            "POST",
            f"/api/v1/namespaces/{run.namespace}/events",
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {
                    "name": f"{run.name}.{uuid.uuid4().hex[:16]}",
                    "namespace": run.namespace,
                },
                "involvedObject": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": run.name,
                    "namespace": run.namespace,
                    "uid": run.uid,
                },
                "reason": reason,
                "message": message,
                "type": "Warning",
                "count": 1,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "source": {"component": "kubelet", "host": run.node},
            },
        )

    def _call(self, method: str, path: str, body: dict, content_type: str = JSON) -> None:
        """One write, retried while the apiserver cannot be reached or fails (up to about a
        minute); an object that is gone or has been replaced (404, 409, 422) ends it quietly."""
        delay = 0.2
        for _ in range(15):
            if self._stopping.is_set():
                return
            try:
                self.api.request(method, path, body, content_type=content_type)
                return
            except ApiError as error:
                if error.status in (404, 409, 422):
                    log.debug("%s %s: %s", method, path, error)
                    return
                if error.status < 500 and error.status != 429:
                    log.warning("%s %s: %s", method, path, error)
                    return
                problem: Exception = error
            except (urllib3.exceptions.HTTPError, OSError) as error:
                problem = error
            log.debug("%s %s: %s; again in %.1f s", method, path, problem, delay)
            self._stopping.wait(delay)
            delay = min(delay * 2, 5)
        log.warning("%s %s: given up", method, path)


def _node_of(pod: dict) -> str | None:
    """The node the pod is bound to, if any."""
    return (pod.get("spec") or {}).get("nodeName")


def _grace(pod: dict) -> int:
    """The grace period a deleted pod's process gets: its deletionGracePeriodSeconds, else its
    spec's terminationGracePeriodSeconds."""
    grace = pod["metadata"].get("deletionGracePeriodSeconds")
    if grace is None:
        grace = pod.get("spec", {}).get("terminationGracePeriodSeconds")
    return DEFAULT_GRACE_SECONDS if grace is None else int(grace)


def _pod_status(run: _Run, phase: str, conditions: list, state: dict, *, ready: bool) -> dict:
    """A pod status as a kubelet reports it, its one container in `state`."""
    return {
        "phase": phase,
        "conditions": conditions,
        "hostIP": ADDRESS,
        "podIP": ADDRESS,
        "podIPs": [{"ip": ADDRESS}],
        "startTime": run.started_at or run.finished_at,
        "containerStatuses": [
            {
                "name": run.container,
                "image": run.image,
                "imageID": "",
                "containerID": run.container_id,
                "ready": ready,
                "started": ready,
                "restartCount": 0,
                "state": state,
            }
        ],
    }


def _condition(kind: str, true: bool, reason: str = "") -> dict:
    """A pod condition, changed now."""
    condition = {
        "type": kind,
        "status": "True" if true else "False",
        "lastProbeTime": None,
        "lastTransitionTime": now_iso(),
    }
    if reason:
        condition["reason"] = reason
    return condition


def _control(sim: SimKubelet, done: threading.Event) -> None:
    """Commands from stdin (module docstring), until it ends."""
    for line in sys.stdin:
        words = line.split()
        try:
            if words[:1] == ["die"] and len(words) in (2, 3):
                sim.die(words[1], kill_processes=words[2:] != ["keep-processes"])
            elif words[:1] == ["revive"] and len(words) == 2:
                sim.revive(words[1])
            elif words[:1] == ["evict"] and len(words) == 2 and "/" in words[1]:
                sim.evict(*words[1].split("/", 1))
            elif words == ["stop"]:
                done.set()
            elif words:
                raise ValueError(
                    "commands: die NODE [keep-processes], revive NODE, evict NAMESPACE/POD, stop"
                )
            else:
                continue
            print("ok", *words, flush=True)
        except (KeyError, ValueError) as error:
            print("error", *words, f"({error})", flush=True)


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring): run the nodes until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    names = parser.add_mutually_exclusive_group(required=True)
    names.add_argument("--nodes", help="node names, comma-separated")
    names.add_argument("--count", type=int, help="this many nodes, PREFIX1..PREFIXn")
    parser.add_argument("--prefix", default="sim")
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--cpu", default="16")
    parser.add_argument("--memory", default="64Gi")
    parser.add_argument("--max-pods", type=int, default=110)
    parser.add_argument("--log-dir", help="where the pods' logs and working directories go")
    parser.add_argument("--heartbeat-seconds", type=float, default=2)
    parser.add_argument("--status-report-seconds", type=float, default=300)
    parser.add_argument("--delete-nodes-on-exit", action="store_true")
    parser.add_argument("--control-stdin", action="store_true")
    parser.add_argument("--kubelet-port", type=int, default=0, help="the log server's; 0: any")
    parser.add_argument("--no-serve-logs", action="store_true", help="no log server")
    parser.add_argument("--tls-cert", help="the log server's certificate (else one is made)")
    parser.add_argument("--tls-key")
    parser.add_argument(
        "--ca-cert", help="the CA of the apiserver's --kubelet-certificate-authority ..."
    )
    parser.add_argument("--ca-key", help="... and its key: they sign the log server's certificate")
    parser.add_argument(
        "--cleanup",
        action="store_true",
        help="kill the processes an earlier simulator of these nodes left, exit",
    )
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if args.nodes:
        node_names = [n for n in args.nodes.split(",") if n]
    else:
        node_names = [f"{args.prefix}{i}" for i in range(1, args.count + 1)]
    if args.cleanup:
        print(f"killed {kill_marked(set(node_names))} processes")
        return 0
    if not args.kubeconfig or not args.log_dir:
        parser.error("--kubeconfig (or KUBECONFIG) and --log-dir are required")
    labels = dict(item.split("=", 1) for item in args.label)
    specs = [
        NodeSpec(name, args.gpus, labels, args.cpu, args.memory, args.max_pods)
        for name in node_names
    ]
    sim = SimKubelet(
        args.kubeconfig,
        specs,
        args.log_dir,
        heartbeat_seconds=args.heartbeat_seconds,
        status_report_seconds=args.status_report_seconds,
        delete_nodes_on_exit=args.delete_nodes_on_exit,
        serve_logs=not args.no_serve_logs,
        kubelet_port=args.kubelet_port,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        ca_cert=args.ca_cert,
        ca_key=args.ca_key,
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    try:
        sim.start()
        print(f"simkubelet: {len(specs)} nodes up, kubelet port {sim.kubelet_port}", flush=True)
        if args.control_stdin:
            threading.Thread(target=_control, args=(sim, done), daemon=True).start()
        while not done.wait(5):
            pass
    finally:
        sim.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
