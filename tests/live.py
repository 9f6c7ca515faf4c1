"""Real processes for end-to-end tests: a web server (`manage.py runserver --noreload`, or the
production server's, on a free port), a Celery worker with embedded beat, and node agents with
fake GPUs (the one stand-in: no GPU machine runs these tests). They share the test database
(its settings are passed through DATABASE_URL) and the Redis of REDIS_URL."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import requests
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent
JOB_SCRIPT = ROOT / "scripts" / "demo_job.py"
JOIN_TOKEN = "live-test-join-token"


def database_url() -> str:
    """The test database (pytest-django has created it) as a URL for the subprocesses."""
    db = settings.DATABASES["default"]
    if db["ENGINE"] == "django.db.backends.sqlite3":
        return f"sqlite:///{db['NAME']}"
    user = db.get("USER") or ""
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    auth = f"{user}{password}@" if user else ""
    return f"postgres://{auth}{db.get('HOST') or '127.0.0.1'}:{db.get('PORT') or 5432}/{db['NAME']}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check: Callable[[], object], *, timeout: float = 30, what: str = "condition"):
    """Poll `check` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def job_command(steps: int, step_seconds: float, *extra: str) -> str:
    args = " ".join(extra)
    return f"{sys.executable} {JOB_SCRIPT} --steps {steps} --step-seconds {step_seconds} {args}"


class LiveSystem:
    def __init__(self, tmp: Path, **env: str) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.checkpoints = tmp / "checkpoints"
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url(),
            # The same Redis as this test process (the embedded one by default), not one
            # under the temporary var directory.
            "REDIS_URL": settings.REDIS_URL,
            "PORTAL_VAR_DIR": str(tmp / "var"),
            "CYCLE_INTERVAL_SECONDS": "1",
            "AGENT_JOIN_TOKEN": JOIN_TOKEN,
            "PYTHONUNBUFFERED": "1",
            **env,
        }
        (tmp / "var").mkdir(parents=True, exist_ok=True)
        self.web: subprocess.Popen | None = None
        self.worker: subprocess.Popen | None = None
        self.workers: dict[str, subprocess.Popen] = {}
        self.agents: dict[str, subprocess.Popen] = {}

    def _spawn(
        self, name: str, command: list[str], *, cwd: Path = ROOT, stdin=None, **env: str
    ) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 — closed with the process
        return subprocess.Popen(
            command, cwd=cwd, env={**self.env, **env}, stdin=stdin, stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip

    def start_web(self, *, production: bool = False, **env: str) -> None:
        """Django's development server, or (`production`) the production server's web
        process (`gpu-portal-server web`: uvicorn, DEBUG off, plain HTTP)."""
        if production:
            command = [sys.executable, "-m", "portal.server", "web"]
            env = {"PORTAL_ADDRESS": f"127.0.0.1:{self.port}", "DEBUG": "0",
                   "SECRET_KEY": "live-test-secret-key-" + "x" * 40, "SECURE_SSL_REDIRECT": "0",
                   "WEB_WORKERS": "1", "LOG_FORMAT": "json", **env}  # fmt: skip
        else:
            command = [sys.executable, "manage.py", "runserver", f"127.0.0.1:{self.port}",
                       "--noreload"]  # fmt: skip
        self.web = self._spawn("web", command, **env)
        wait_for(self._healthy, timeout=30, what="the web server")

    def _healthy(self) -> bool:
        try:
            return requests.get(f"{self.url}/health/", timeout=1).ok
        except requests.RequestException:
            return False

    def stop_web(self) -> None:
        stop(self.web)
        self.web = None

    def start_worker(self, name: str = "worker", **env: str) -> None:
        """A Celery worker with its embedded beat (a child process); several may run, each
        with its own name and beat schedule file. `env` overrides the system's environment.
        The worker is the portal's, with the test hooks of tests/live_worker.py."""
        process = self._spawn(
            name,
            [sys.executable, "-m", "celery", "-A", "tests.live_worker", "worker", "-B",
             "--pool", "solo", "-n", f"{name}@%h", "-l", "info",
             "-s", str(self.tmp / "var" / f"{name}-beat-schedule")],
            **env,
        )  # fmt: skip
        self.workers[name] = process
        if name == "worker":
            self.worker = process

    def kill_worker(self, name: str = "worker") -> None:
        """SIGKILL the worker and its embedded beat at once, like a machine that dies."""
        import psutil

        process = self.workers.pop(name)
        if name == "worker":
            self.worker = None
        with contextlib.suppress(psutil.NoSuchProcess):
            tree = psutil.Process(process.pid)
            for child in tree.children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()
        process.kill()
        process.wait(10)

    def start_agent(
        self,
        name: str,
        gpus: int = 8,
        gpu_type: str = "h100",
        *,
        module: str = "scheduler.agent",
        program: list[str] | None = None,
        **env: str,
    ) -> None:
        """A node agent with fake GPUs; `module` runs another entry point with the same flags
        (e.g. an agent whose clock is off), `program` another program (e.g. an installed
        `gpu-agent`, run outside the checkout)."""
        command = program or [sys.executable, "-m", module]
        self.agents[name] = self._spawn(
            f"agent-{name}",
            [*command, "--portal", self.url, "--name", name,
             "--fake-gpus", str(gpus), "--gpu-type", gpu_type, "--poll-wait", "5",
             "--work-dir", str(self.tmp / "agents" / name),
             "--checkpoint-root", str(self.checkpoints)],
            cwd=self.tmp if program else ROOT,
            **env,
        )  # fmt: skip

    def start_connector(
        self, slurm_conf: str, *, name: str = "slurm", partition: str = "gpu", **env: str
    ) -> None:
        """The Slurm connector (`gpu-agent slurm`) of the real Slurm cluster at `slurm_conf`
        (tests/slurm/conftest.py), its work and checkpoint directories under this system's."""
        self.agents[name] = self._spawn(
            f"connector-{name}",
            [sys.executable, "-m", "scheduler.agent", "slurm", "--portal", self.url,
             "--partition", partition, "--name", name, "--poll-wait", "5",
             "--work-dir", str(self.tmp / "connectors" / name),
             "--checkpoint-root", str(self.checkpoints), "--log-level", "DEBUG"],
            SLURM_CONF=slurm_conf,
            **env,
        )  # fmt: skip

    def start_kubernetes_connector(
        self, kubeconfig: str, *, image: str, name: str = "k8s", namespace: str = "gpu-portal",
        **env: str,
    ) -> None:  # fmt: skip
        """The Kubernetes connector (`gpu-agent kubernetes`) of the real cluster of
        `kubeconfig` (tests/kubernetes/conftest.py): host-network pods (the test cluster has no
        pod network) with this system's checkpoint directory as their hostPath; the nodes'
        GPU product, NVIDIA-H100-80GB-HBM3, is the portal's h100."""
        self.agents[name] = self._spawn(
            f"connector-{name}",
            [sys.executable, "-m", "scheduler.agent", "kubernetes", "--portal", self.url,
             "--name", name, "--namespace", namespace, "--image", image, "--host-network",
             "--gpu-product", "NVIDIA-H100-80GB-HBM3=h100",
             "--poll-wait", "5", "--work-dir", str(self.tmp / "connectors" / name),
             "--checkpoint-root", str(self.checkpoints), "--log-level", "DEBUG"],
            KUBECONFIG=kubeconfig,
            **env,
        )  # fmt: skip

    def kill_agent(self, name: str) -> None:
        """SIGKILL the agent, like a machine that dies (its jobs die with it)."""
        process = self.agents.pop(name)
        process.kill()
        process.wait(10)
        for pgid_file in (self.tmp / "agents" / name / "running").glob("*.pgid"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.killpg(int(pgid_file.read_text()), signal.SIGKILL)

    def checkpoint_dir(self, job_id: int) -> Path:
        return self.checkpoints / f"job-{job_id}"

    def start(self, agents: dict[str, tuple[int, str]]) -> None:
        self.start_web()
        self.start_worker()
        for name, (gpus, gpu_type) in agents.items():
            self.start_agent(name, gpus, gpu_type)

    def logs(self) -> str:
        return "\n".join(
            f"===== {path.name}\n{path.read_text(errors='replace')[-4000:]}"
            for path in sorted(self.tmp.glob("*.log"))
        )

    def stop_all(self) -> None:
        for process in self.agents.values():
            stop(process)
        self.agents.clear()
        for process in self.workers.values():
            stop(process)
        self.workers.clear()
        self.worker = None
        stop(self.web)


def stop(process: subprocess.Popen | None) -> None:
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)
