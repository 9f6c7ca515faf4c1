"""Soak: the whole system under a long mixed load, then its books checked.

    python bench/soak.py [--agents 64] [--jobs 20000] [--minutes 10] [--clients 16] [--sqlite]

Starts, all on 127.0.0.1: a scratch database (PostgreSQL `portal_soak` or SOAK_DATABASE, dropped and
re-created; or a SQLite file with --sqlite), the production server (`gpu-portal-server web`:
uvicorn, 2 processes, a pool of 8 database connections each; with --sqlite, which it does not serve,
gunicorn with 2 gthread workers), the Celery worker and beat as `gpu-portal-server worker` and
`beat` run them (a prefork worker of 2 processes, beat on its own; with --sqlite, the same as `make
run` starts them), and --agents node agents with fake GPUs (h100 ×8 and l4 ×4 nodes). Eight shares
of mixed strategies. Once every agent is READY, --clients threads submit --jobs jobs of mixed sizes
that each run `sleep X` (0.5-3 s; GPU types in proportion to the cluster's GPUs) over 60% of the
time cap, while a chaos thread edits shares (limits, strategy, lend_limit) and
restarts agents (SIGKILL, then start again under the same name). It stops when every job has
ended or at --minutes (counted from the start, startup included), whichever comes first,
then prints:

jobs submitted, finished, lost (must be 0), double placements (must be 0), preemptions,
p50/p99 submit latency, p50/p99 reclaim latency (stop order − reclaiming job's submit), peak
RSS of web and worker, /health/ latency measured in the same run as the baseline, what is
still open (by state, share and GPU type) when the cap stopped it, and the CPU seconds of
each part (web, worker, agents with their jobs, the soak itself, PostgreSQL).
Redis: REDIS_URL (default redis://127.0.0.1:6379/9, flushed at start). SOAK_LOG_LEVEL (default
WARNING) is the portal processes' log level: INFO logs every cycle and estimates refresh. On a
PostgreSQL server whose autovacuum is off, the soak runs VACUUM (ANALYZE) of its database every 30 s
in its place (see Soak.vacuumer) and says so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import psutil
import requests

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
GUNICORN = str(Path(PYTHON).parent / "gunicorn")
ADMIN_URL = os.environ.get(
    "BENCH_ADMIN_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"
)
DB_NAME = os.environ.get("SOAK_DATABASE", "portal_soak")
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/9")
JOIN_TOKEN = "soak-join-token-0123456789"
SHARES = [
    # name, strategy, {type: limit}, extra settings
    ("ml-train", "LEND_AND_BORROW", {"h100": 48}, {"grace_seconds": 2}),
    ("vision", "LEND", {"h100": 40}, {"grace_seconds": 2}),
    ("nlp", "LEND_AND_BORROW", {"h100": 32, "l4": 16}, {"borrow_limit": 50, "grace_seconds": 1}),
    ("infer", "RESERVE", {"l4": 24}, {}),
    ("speech", "LEND", {"l4": 24}, {"lend_limit": 8, "grace_seconds": 1}),
    ("robotics", "LEND_AND_BORROW", {"h100": 16, "l4": 8},
     {"in_share_preemption": True, "grace_seconds": 1}),
    ("research", "LEND_AND_BORROW", {"h100": 24}, {"weight": 2.0, "grace_seconds": 2}),
    ("batch", "LEND_AND_BORROW", {"l4": 16}, {"borrow_limit": 100, "grace_seconds": 0}),
]  # fmt: skip


def database_url(sqlite_path: Path | None) -> str:
    if sqlite_path is not None:
        return f"sqlite:///{sqlite_path}"
    return urlparse(ADMIN_URL)._replace(path=f"/{DB_NAME}").geturl()


def create_database() -> None:
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{DB_NAME}"')


SETUP = """
import json, os
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from shares.models import Membership, Team
from shares.services import share_create
admin = get_user_model().objects.create_superuser("soak-admin", password=None)
for name, strategy, limits, extra in json.loads(os.environ["SOAK_SHARES"]):
    team = Team.objects.create(name=name, slug=name)
    Membership.objects.create(team=team, user=admin, role="LEAD")
    share_create(name=name, team=team, capacity_limits=limits, strategy=strategy, **extra)
print(Token.objects.create(user=admin).key)
"""


# How often the soak vacuums and analyzes its database when the server's autovacuum is off.
AUTOVACUUM_STANDIN_SECONDS = 30.0


def autovacuum_on() -> bool:
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as connection:
        return connection.execute("SHOW autovacuum").fetchone()[0] == "on"


def process_cpu(process: psutil.Process) -> float:
    """CPU seconds of a process and of its children that have ended (and were waited for)."""
    times = process.cpu_times()
    return times.user + times.system + times.children_user + times.children_system


def postgres_cpu() -> float:
    """CPU seconds used so far by the PostgreSQL server (every database: other users of the
    server count too), its ended backends included; NaN when it cannot be read."""
    total, found = 0.0, False
    for process in psutil.process_iter(["name"]):
        if process.info["name"] not in ("postgres", "postmaster"):
            continue
        with contextlib.suppress(psutil.Error):
            if process.parent() is not None and process.parent().name() in (
                "postgres",
                "postmaster",
            ):
                continue
            total += process_cpu(process) + sum(
                p.cpu_times().user + p.cpu_times().system for p in process.children()
            )
            found = True
    return total if found else float("nan")


def offered_load(jobs: list[dict]) -> dict[str, float]:
    """GPU-seconds of work (the jobs' sleeps) by GPU type."""
    load: dict[str, float] = {}
    for job in jobs:
        seconds = float(job["command"].split()[1])
        load[job["gpu_type"]] = load.get(job["gpu_type"], 0.0) + job["gpus"] * seconds
    return load


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="portal-soak-"))
        self.sqlite = self.tmp / "soak.sqlite3" if args.sqlite else None
        self.server = "gunicorn" if args.sqlite else "uvicorn"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "DATABASE_URL": database_url(self.sqlite),
            "REDIS_URL": REDIS_URL,
            "DEBUG": "false",
            "SECRET_KEY": "soak-only-secret-key-not-for-production-use-0123456789abcdef",
            "SECURE_SSL_REDIRECT": "false",
            "SESSION_COOKIE_SECURE": "false",
            "CSRF_COOKIE_SECURE": "false",
            "LOG_LEVEL": os.environ.get("SOAK_LOG_LEVEL", "WARNING"),
            "AGENT_JOIN_TOKEN": JOIN_TOKEN,
            "CYCLE_INTERVAL_SECONDS": "1",
            "AGENT_POLL_MAX_WAIT_SECONDS": "5",
            "NODE_HEARTBEAT_TIMEOUT_SECONDS": "30",
            "PORTAL_VAR_DIR": str(self.tmp / "var"),
            "PYTHONUNBUFFERED": "1",
        }
        self.web: subprocess.Popen | None = None
        self.worker: subprocess.Popen | None = None
        self.beat: subprocess.Popen | None = None
        self.agents: dict[str, subprocess.Popen] = {}
        self.agent_specs: dict[str, tuple[str, int]] = {}
        self.lock = threading.Lock()
        self.submit_latencies: list[float] = []
        self.health_latencies: list[float] = []
        self.submit_errors: dict[str, int] = {}
        self.error_samples: set[str] = set()
        self.accepted: list[int] = []
        self.share_edits = 0
        self.agent_restarts = 0
        self.vacuums: int | None = None  # VACUUM (ANALYZE) runs standing in for autovacuum
        self.peak_rss = {"web": 0, "worker": 0}
        # CPU seconds by part of the system, the last value seen of each process (an agent
        # that is restarted keeps what it used).
        self.cpu_seen: dict[str, dict[int, float]] = {"web": {}, "worker": {}, "agents": {}}
        self.cpu_start = (os.times(), psutil.cpu_times(), postgres_cpu(), time.monotonic())
        self.cpu_end = self.cpu_start
        self.stop = threading.Event()
        self.ready_after = float("nan")  # seconds from the start until every agent was READY
        self.offered: dict[str, float] = {}
        self.window = float("nan")

    # --- Processes ---------------------------------------------------------------------------

    def spawn(self, name: str, command: list[str], **env: str) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "ab")  # noqa: SIM115 — closed with the process
        return subprocess.Popen(
            command, cwd=ROOT, env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT
        )

    def prepare(self) -> str:
        if self.sqlite is None:
            create_database()
        import redis

        redis.Redis.from_url(REDIS_URL).flushdb()
        manage = [PYTHON, str(ROOT / "manage.py")]
        subprocess.run([*manage, "migrate", "--no-input", "-v0"], check=True, env=self.env,
                       cwd=ROOT)  # fmt: skip
        shares = json.dumps([[n, s, limits, extra] for n, s, limits, extra in SHARES])
        result = subprocess.run(
            [*manage, "shell", "-c", SETUP], check=True, env={**self.env, "SOAK_SHARES": shares},
            cwd=ROOT,
            capture_output=True, text=True,
        )  # fmt: skip
        return result.stdout.strip().splitlines()[-1]

    def start(self) -> None:
        if self.sqlite is None:
            # The production server (uvicorn, 2 processes): a waiting long poll holds no thread
            # and no connection; each process has a pool of 8 database connections.
            self.web = self.spawn(
                "web",
                [PYTHON, "-m", "portal.server", "web"],
                PORTAL_ADDRESS=f"127.0.0.1:{self.port}", WEB_WORKERS="2", DATABASE_POOL_SIZE="8",
            )  # fmt: skip
        else:
            # The production server needs PostgreSQL. With gunicorn each worker needs a thread
            # for every agent whose long poll it may hold (an agent's keep-alive connection stays
            # on one worker) plus threads for everything else.
            threads = self.args.agents + 16
            self.web = self.spawn(
                "web",
                [GUNICORN, "portal.wsgi", "-k", "gthread", "-w", "2", "--threads", str(threads),
                 "-b", f"127.0.0.1:{self.port}", "--log-level", "warning", "--timeout", "60"],
            )  # fmt: skip
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(f"{self.url}/health/", timeout=1).ok:
                    break
            except requests.RequestException:
                time.sleep(0.2)
        else:
            raise SystemExit("the web server did not start")
        # The Celery worker and beat as the production server runs them (`gpu-portal-server
        # worker` and `beat`, one process each, as their systemd units: a prefork worker of
        # WORKER_CONCURRENCY processes), so that an estimates refresh in one worker process
        # never holds up a cycle. The production server does not run on SQLite: there, the
        # same worker and beat as `make run` starts them.
        if self.sqlite is None:
            worker = [PYTHON, "-m", "portal.server", "worker"]
            beat = [PYTHON, "-m", "portal.server", "beat"]
        else:
            (self.tmp / "var").mkdir(exist_ok=True)
            worker = [PYTHON, "-m", "celery", "-A", "portal", "worker", "-l", "warning", "-c", "2"]
            beat = [PYTHON, "-m", "celery", "-A", "portal", "beat", "-l", "warning",
                    "-s", str(self.tmp / "var" / "celerybeat-schedule")]  # fmt: skip
        self.worker = self.spawn("worker", worker)
        self.beat = self.spawn("beat", beat)
        for i in range(self.args.agents):
            # Three h100 nodes for every l4 node.
            spec = ("l4", 4) if i % 4 == 3 else ("h100", 8)
            self.agent_specs[f"soak-{i}"] = spec
            self.start_agent(f"soak-{i}")

    def start_agent(self, name: str) -> None:
        gpu_type, gpus = self.agent_specs[name]
        self.agents[name] = self.spawn(
            f"agent-{name}",
            [PYTHON, "-m", "scheduler.agent", "--portal", self.url, "--name", name,
             "--fake-gpus", str(gpus), "--gpu-type", gpu_type, "--poll-wait", "5",
             "--log-level", "WARNING", "--work-dir", str(self.tmp / "agents" / name),
             "--checkpoint-root", str(self.tmp / "checkpoints")],
        )  # fmt: skip

    def restart_agent(self, name: str) -> None:
        """SIGKILL the agent (its jobs die with it), then start it again under its name."""
        process = self.agents.pop(name)
        process.kill()
        process.wait(10)
        for pgid_file in (self.tmp / "agents" / name / "running").glob("*.pgid"):
            with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
                os.killpg(int(pgid_file.read_text()), signal.SIGKILL)
        self.start_agent(name)

    def check_portal_alive(self) -> None:
        """SystemExit, naming the process and its log, if the web server, the worker or beat has
        exited: the run would otherwise wait until --minutes for jobs nothing places."""
        for name, process in (("web", self.web), ("worker", self.worker), ("beat", self.beat)):
            if process is not None and process.poll() is not None:
                log = self.tmp / f"{name}.log"
                raise SystemExit(
                    f"the portal's {name} exited (code {process.returncode}); its log: {log}"
                )

    def stop_all(self) -> None:
        # The portal goes first: an agent that is stopped stops its jobs and reports them as
        # exited (code -15), which must not count against the run.
        for process in [self.web, self.beat, self.worker]:
            if process is not None and process.poll() is None:
                process.terminate()
                try:
                    process.wait(15)
                except subprocess.TimeoutExpired:
                    process.kill()
        for process in [*self.agents.values(), self.beat, self.worker, self.web]:
            if process is not None and process.poll() is None:
                process.terminate()
        for process in [*self.agents.values(), self.beat, self.worker, self.web]:
            if process is None:
                continue
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()

    # --- Load ----------------------------------------------------------------------------------

    def submitter(self, token: str, jobs: list[dict], rate: float) -> None:
        session = requests.Session()
        session.headers["Authorization"] = f"Token {token}"
        started = time.monotonic()
        for number, body in enumerate(jobs):
            if self.stop.is_set():
                return
            # Pace the submits so they spread over the submit window.
            delay = started + number / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            begin = time.perf_counter()
            try:
                response = session.post(f"{self.url}/api/v1/jobs/", json=body, timeout=60)
                status = str(response.status_code)
            except requests.RequestException as error:
                response, status = None, type(error).__name__
            elapsed = time.perf_counter() - begin
            with self.lock:
                if response is not None and response.status_code == 201:
                    self.submit_latencies.append(elapsed)
                    self.accepted.append(response.json()["id"])
                else:
                    self.submit_errors[status] = self.submit_errors.get(status, 0) + 1
                    if response is not None and len(self.error_samples) < 3:
                        self.error_samples.add(response.text[:200])

    def health_sampler(self) -> None:
        session = requests.Session()
        while not self.stop.wait(0.25):
            begin = time.perf_counter()
            try:
                if session.get(f"{self.url}/health/", timeout=30).ok:
                    with self.lock:
                        self.health_latencies.append(time.perf_counter() - begin)
            except requests.RequestException:
                pass

    def vacuumer(self) -> None:
        """Stands in for autovacuum on a server that runs without it (SHOW autovacuum: off).
        Nothing else would ever vacuum or analyze the soak's tables: the partial index of open
        attempts and the jobs' state index would keep an entry for every job ever run (their
        updates are not HOT), read by every poll and cycle, and the planner would plan without
        statistics; the cost of a job would grow with the number run before it, which no
        production database (autovacuum is on by default) shows. Its CPU counts as
        PostgreSQL's."""
        import psycopg

        with psycopg.connect(database_url(None), autocommit=True) as connection:
            while not self.stop.wait(AUTOVACUUM_STANDIN_SECONDS):
                connection.execute("VACUUM (ANALYZE)")
                self.vacuums += 1

    def rss_sampler(self) -> None:
        """Peak RSS of web and worker, and CPU of every part, every 2 s."""
        while not self.stop.wait(2.0):
            self.sample_cpu()

    def sample_cpu(self) -> None:
        for part, roots in (("web", [self.web]), ("worker", [self.worker, self.beat])):
            rss = 0
            for root in (root for root in roots if root is not None):
                with contextlib.suppress(psutil.Error):
                    tree = psutil.Process(root.pid)
                    for process in [tree, *tree.children(recursive=True)]:
                        with contextlib.suppress(psutil.Error):
                            self.cpu_seen[part][process.pid] = process_cpu(process)
                            rss += process.memory_info().rss
            self.peak_rss[part] = max(self.peak_rss[part], rss)
        # An agent's jobs are its children: their CPU is in its own once they have ended.
        for agent in list(self.agents.values()):
            with contextlib.suppress(psutil.Error):
                self.cpu_seen["agents"][agent.pid] = process_cpu(psutil.Process(agent.pid))

    def chaos(self, token: str, rng: random.Random) -> None:
        """Random share edits every few seconds, an agent restart every ~20 s."""
        session = requests.Session()
        session.headers["Authorization"] = f"Token {token}"
        originals = {name: (strategy, limits, extra) for name, strategy, limits, extra in SHARES}
        next_restart = time.monotonic() + 20
        while not self.stop.wait(rng.uniform(2, 5)):
            name = rng.choice(list(originals))
            strategy, limits, extra = originals[name]
            choice = rng.random()
            if choice < 0.4:
                factor = rng.choice((0.5, 1.0, 1.5))
                body = {"capacity_limits": {t: max(1, int(n * factor)) for t, n in limits.items()}}
            elif choice < 0.7 and "borrow_limit" not in extra:
                body = {"strategy": rng.choice(("LEND", "LEND_AND_BORROW", strategy))}
            else:
                body = {"lend_limit": rng.choice((None, 0, 2, 4))}
            try:
                response = session.patch(f"{self.url}/api/v1/shares/{name}/", json=body, timeout=60)
                if response.status_code == 200:
                    self.share_edits += 1
            except requests.RequestException:
                pass
            if time.monotonic() >= next_restart and self.args.agents > 1:
                self.restart_agent(rng.choice(sorted(self.agents)))
                self.agent_restarts += 1
                next_restart = time.monotonic() + rng.uniform(15, 25)

    def capacity(self) -> dict[str, int]:
        """GPUs of each type in the cluster."""
        gpus: dict[str, int] = {}
        for gpu_type, count in self.agent_specs.values():
            gpus[gpu_type] = gpus.get(gpu_type, 0) + count
        return gpus

    def workload(self, rng: random.Random) -> list[dict]:
        """Jobs of 1 GPU to two whole nodes, 0.5-3 s each. A job's GPU type is drawn in
        proportion to the GPUs of that type (over the mean size of its jobs), so that every
        type gets about the same share of its capacity; its share is one that has the type."""
        sizes = {"h100": (1, 1, 2, 2, 4, 8), "l4": (1, 1, 2, 4)}
        capacity = self.capacity()
        types = sorted(capacity)
        weights = [capacity[t] / (sum(sizes[t]) / len(sizes[t])) for t in types]
        jobs = []
        for number in range(self.args.jobs):
            (gpu_type,) = rng.choices(types, weights)
            name = rng.choice([name for name, _, limits, _ in SHARES if gpu_type in limits])
            per_node = max(sizes[gpu_type])
            gpus = rng.choice(sizes[gpu_type])
            nodes = 2 if gpus == per_node and rng.random() < 0.1 else 1
            jobs.append(
                {
                    "name": f"soak-{number}",
                    "share": name,
                    "gpu_type": gpu_type,
                    "gpus": gpus * nodes,
                    "nodes": nodes,
                    "priority": rng.choice((0, 0, 0, 10, 100)),
                    "command": f"sleep {rng.choice((0.5, 1, 1, 2, 2, 3))}",
                }
            )
        return jobs

    # --- Run and report --------------------------------------------------------------------------

    def run(self) -> int:
        rng = random.Random(self.args.seed)
        token = self.prepare()
        started = time.monotonic()
        deadline = started + self.args.minutes * 60
        self.start()
        self.setup_django()
        from scheduler.models import Job, Node

        # Submitting before the nodes exist would only collect 400s ("no h100 node").
        while Node.objects.filter(state=Node.State.READY).count() < self.args.agents:
            if time.monotonic() > deadline:
                raise SystemExit("the agents did not all register before --minutes")
            self.check_portal_alive()
            time.sleep(1)
        self.ready_after = time.monotonic() - started
        print(f"[{self.ready_after:5.0f} s] {self.args.agents} agents registered", flush=True)
        jobs = self.workload(rng)
        self.offered = offered_load(jobs)
        window = self.window = max(10.0, self.args.minutes * 60 * 0.6)
        clients = self.args.clients
        per_client = [jobs[i::clients] for i in range(clients)]
        threads = [
            threading.Thread(
                target=self.submitter, args=(token, part, len(part) / window), daemon=True
            )
            for part in per_client
        ]
        if self.sqlite is None and not autovacuum_on():
            self.vacuums = 0
            threads.append(threading.Thread(target=self.vacuumer, daemon=True))
        threads += [
            threading.Thread(target=self.health_sampler, daemon=True),
            threading.Thread(target=self.rss_sampler, daemon=True),
            threading.Thread(target=self.chaos, args=(token, rng), daemon=True),
        ]
        for thread in threads:
            thread.start()

        finished_all = False
        while time.monotonic() < deadline:
            time.sleep(5)
            self.check_portal_alive()
            submitting = any(t.is_alive() for t in threads[:clients])
            with self.lock:
                accepted = len(self.accepted)
            open_jobs = Job.objects.exclude(state__in=Job.FINAL_STATES).count()
            print(
                f"[{time.monotonic() - started:5.0f} s] accepted {accepted}, open {open_jobs}",
                flush=True,
            )
            if not submitting and open_jobs == 0:
                finished_all = True
                break
        self.stop.set()
        elapsed = time.monotonic() - started
        self.sample_cpu()
        self.cpu_end = (os.times(), psutil.cpu_times(), postgres_cpu(), time.monotonic())
        # Stop everything first: the books are read from a database nobody writes to any more.
        self.stop_all()
        report = self.report(elapsed, finished_all)
        print(report, flush=True)
        if not self.args.keep:
            shutil.rmtree(self.tmp, ignore_errors=True)
        else:
            print(f"logs and files kept in {self.tmp}")
        return 0

    def setup_django(self) -> None:
        os.environ.update({k: v for k, v in self.env.items() if k not in ("PYTHONUNBUFFERED",)})
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
        sys.path.insert(0, str(ROOT))
        import django

        django.setup()

    def report(self, elapsed: float, finished_all: bool) -> str:
        from django.db.models import Count, F

        from scheduler.models import GpuAssignment, Job, JobAttempt

        accepted = set(self.accepted)
        jobs = dict(Job.objects.values_list("pk", "state"))
        open_attempts = set(
            JobAttempt.objects.filter(ended_at__isnull=True).values_list("job_id", flat=True)
        )
        missing = accepted - set(jobs)
        placed_without_attempt = [
            pk
            for pk, state in jobs.items()
            if state in Job.PLACED_STATES and pk not in open_attempts
            and not Job.objects.filter(pk=pk, cancel_requested=True).exists()
        ]  # fmt: skip
        lost = len(missing) + len(placed_without_attempt)
        finished = sum(1 for state in jobs.values() if state in Job.FINAL_STATES)
        by_state: dict[str, int] = {}
        for state in jobs.values():
            by_state[state] = by_state.get(state, 0) + 1

        # Two attempts holding one GPU index of one node at overlapping times.
        double = 0
        rows = (
            GpuAssignment.objects.annotate(
                scheduled=F("attempt__scheduled_at"), ended=F("attempt__ended_at")
            )
            .order_by("node_id", "gpu_index", "scheduled")
            .values_list("node_id", "gpu_index", "attempt_id", "scheduled", "ended",
                         "attempt__allocations")
        )  # fmt: skip
        last: dict[tuple[int, int], tuple] = {}
        for node_id, index, attempt_id, scheduled, ended, allocations in rows.iterator():
            key = (node_id, index)
            previous = last.get(key)
            # A gang releases each node's GPUs when that node's process ends, which may be
            # before the whole attempt ends: only single-node attempts are timed exactly.
            if (
                previous is not None
                and previous[2] == 1
                and (previous[1] is None or scheduled < previous[1])
            ):
                double += 1
            last[key] = (attempt_id, ended, len(allocations))

        preempted = JobAttempt.objects.filter(outcome=JobAttempt.Outcome.PREEMPTED).count()
        reclaims = [
            (stop - submitted).total_seconds()
            for stop, submitted in JobAttempt.objects.filter(
                preempted_for__isnull=False, stop_requested_at__isnull=False
            ).values_list("stop_requested_at", "preempted_for__submitted_at")
        ]
        submit_p50 = percentile(self.submit_latencies, 0.5) * 1000
        health_p50 = percentile(self.health_latencies, 0.5) * 1000
        capacity = self.capacity()
        offered = "; ".join(
            f"{t} {seconds:.0f} GPU-s = {seconds / (capacity[t] * self.window):.0%} of its "
            f"{capacity[t]} GPUs over the submit window"
            for t, seconds in sorted(self.offered.items())
        )
        errors = ", ".join(f"{k}: {v}" for k, v in sorted(self.submit_errors.items())) or "none"
        lines = [
            f"soak: {self.args.agents} agents, {len(SHARES)} shares, {self.args.clients} "
            f"clients, {'SQLite' if self.sqlite else 'PostgreSQL'}, {os.cpu_count()} CPUs, "
            f"{elapsed:.0f} s ({'all jobs ended' if finished_all else 'stopped at --minutes'})",
            f"startup:               every agent READY after {self.ready_after:.0f} s; submits "
            f"spread over {self.window:.0f} s",
            f"offered work:          {offered}",
            f"jobs submitted:        {len(accepted)} of {self.args.jobs} (refused/errors: "
            f"{errors})",
            f"jobs finished:         {finished} ({', '.join(f'{k} {v}' for k, v in sorted(by_state.items()))})",  # noqa: E501
            f"jobs lost:             {lost} (must be 0; missing {len(missing)}, placed without "
            f"an attempt {len(placed_without_attempt)})",
            f"double placements:     {double} (must be 0)",
            f"preemptions:           {preempted} attempts PREEMPTED, {len(reclaims)} stop "
            "orders for a reclaim",
            f"share edits:           {self.share_edits}; agent restarts: {self.agent_restarts}",
            f"submit latency:        p50 {submit_p50:.1f} ms, p99 "
            f"{percentile(self.submit_latencies, 0.99) * 1000:.1f} ms",
            f"reclaim latency:       p50 {percentile(reclaims, 0.5):.2f} s, p99 "
            f"{percentile(reclaims, 0.99):.2f} s (reclaimer submitted → victim's stop order)",
            f"baseline /health/:     p50 {health_p50:.1f} ms, p99 "
            f"{percentile(self.health_latencies, 0.99) * 1000:.1f} ms; submit/health p50 "
            f"ratio {submit_p50 / health_p50:.1f}",
            f"peak RSS:              web {self.peak_rss['web'] / 2**20:.0f} MiB ({self.server}, "
            f"all workers), worker {self.peak_rss['worker'] / 2**20:.0f} MiB (celery + beat)",
        ]
        if self.vacuums is not None:
            lines.append(
                f"autovacuum:            off on this server; the soak ran VACUUM (ANALYZE) "
                f"every {AUTOVACUUM_STANDIN_SECONDS:.0f} s instead ({self.vacuums} times)"
            )
        if not finished_all:
            still_open = (
                Job.objects.exclude(state__in=Job.FINAL_STATES)
                .values_list("state", "share__name", "gpu_type")
                .annotate(n=Count("pk"))
                .order_by("state", "share__name", "gpu_type")
            )
            lines.append(
                "still open:            "
                + (", ".join(f"{state} {share}/{t} {n}" for state, share, t, n in still_open)
                   or "none")
            )  # fmt: skip
        lines.append(self.cpu_line())
        lines += [f"  a refused submit:    {sample}" for sample in sorted(self.error_samples)]
        return "\n".join(lines)

    def cpu_line(self) -> str:
        (soak0, machine0, pg0, t0), (soak1, machine1, pg1, t1) = self.cpu_start, self.cpu_end
        parts = {part: sum(seen.values()) for part, seen in self.cpu_seen.items()}
        parts["soak itself"] = (soak1.user + soak1.system) - (soak0.user + soak0.system)
        parts["PostgreSQL (all databases)"] = pg1 - pg0

        def busy(t) -> float:
            return sum(getattr(t, name, 0.0) for name in ("user", "system", "nice", "irq",
                                                           "softirq"))  # fmt: skip

        machine = busy(machine1) - busy(machine0)
        shares = ", ".join(f"{part} {seconds:.0f}" for part, seconds in parts.items())
        return (
            f"CPU seconds:           {shares}; the whole machine (other users included) "
            f"{machine:.0f} of {os.cpu_count() * (t1 - t0):.0f} ({os.cpu_count()} CPUs)"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=64)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--minutes", type=float, default=10.0, help="hard cap on the run")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--sqlite", action="store_true", help="a SQLite file, not PostgreSQL")
    parser.add_argument("--keep", action="store_true", help="keep logs and files")
    soak = Soak(parser.parse_args())
    try:
        return soak.run()
    except BaseException:
        soak.stop.set()
        soak.stop_all()
        print(f"logs in {soak.tmp}", file=sys.stderr)
        raise


if __name__ == "__main__":
    sys.exit(main())
