"""The portal on a real Slurm cluster, side by side with Slurm alone and with the portal on its
own agents, all in one run on this machine.

    python bench/slurm.py [--runs 3] [--quick] [--keep]

Starts, all on 127.0.0.1: its own Slurm (scripts/slurm_up.sh with SLURM_DIR
/tmp/gpu-portal-slurm-bench, SLURM_PORT_BASE 19817, 4 nodes × 8 h100; stopped and started again
before each of the first two parts of a run, so each begins with an empty cluster; stopped at
the end), and with bench/soak.py's machinery a scratch PostgreSQL database `portal_slurm_bench`
(or SLURM_BENCH_DATABASE; dropped and re-created for each portal part, dropped at the end),
Redis REDIS_URL (default redis://127.0.0.1:6379/11, flushed), the production server
(`gpu-portal-server web`, as soak.py starts it: uvicorn, 2 processes, 8 database connections
each), its Celery worker and beat (a cycle every second). Two shares, as the tests' world:
`vision` (LEND, 8 h100) of the owner, `research` (LEND_AND_BORROW, 8 h100) of the borrower,
grace 2 s; the churn breaker off (a borrower may be the victim of every reclaim); one admin,
lead of both teams, submits with its API token.

Each run has three parts:

1. Slurm alone. Latency: --latency-jobs jobs of 1 GPU, one every --interval s, submitted with
   sbatch; each job's own process writes time.time() (`date +%s.%N`) to a file named after the
   job when it starts, then sleeps --job-seconds. Latency = that time − time.time() taken just
   before sbatch runs. Throughput: --sbatch-jobs trivial 1-GPU jobs (`--wrap true`) submitted
   by a shell loop of sbatch (one client: what one script gets), then the same number spread
   over --sbatch-clients such loops at once; jobs/s = jobs ÷ the loops' wall time.
2. The portal on Slurm: the connector (`python -m scheduler.agent slurm`) brings the 4 Slurm
   nodes to the portal. Latency: the same sample over POST /api/v1/jobs/ (the job writes the
   time into $CHECKPOINT_DIR/started; submit time is taken just before the POST). Reclaim:
   4 borrower jobs of 8 GPUs in `research` (scripts/demo_job.py, which writes time.time() to
   $CHECKPOINT_DIR/sigterm-N on SIGTERM and exits) fill the 32 GPUs; then, --reclaims times,
   the owner submits an 8-GPU job (`sleep 1`) to `vision`: reclaim = the borrower's SIGTERM
   time − time.time() just before the owner's POST. Before each, the owner's last job has
   ended and every borrower runs again (its attempt's process has started). Throughput:
   --portal-jobs trivial 1-GPU jobs (`true`) POSTed by --clients threads as fast as each gets
   its answers; submits/s = jobs accepted (201) ÷ the threads' wall time. The jobs are real:
   they then run on Slurm, and the time until every one has ended is shown (capped at
   --drain-seconds). The connector's CPU seconds (its sbatch/squeue/scancel children included)
   from its nodes' registration to the end of the part.
3. The portal on its own agents: a fresh database, the connector stopped (its Slurm idle), and
   4 fake-GPU agents (`--fake-gpus 8 --gpu-type h100`) instead: the same latency sample,
   reclaims and throughput.

Before each latency sample one job runs unmeasured (the first job after a start is slower).
Prints each run's figures, then one table: each figure as the median of the runs (each run's
value), the goal, met or missed. Goals: the portal on Slurm accepts at least 2× the jobs per
second one sbatch client gets; reclaim on Slurm p50 ≤ 1 s; submit → running p50 on Slurm no
more than 0.5 s above Slurm alone's. --quick: 10 latency jobs, 50 throughput jobs, 3 reclaims,
1 run (for development). Everything it started is stopped, also on errors and Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import kueue_baseline  # noqa: E402 — its report helpers; it sets soak's constants, reset below
import soak  # noqa: E402

GRACE = 2
GPU_TYPE = "h100"
NODES = 4
GPUS_PER_NODE = 8
SLURM_SETTINGS = {
    "SLURM_DIR": "/tmp/gpu-portal-slurm-bench",
    "SLURM_PORT_BASE": "19817",
    "SLURM_NODES": str(NODES),
    "SLURM_GPUS": str(GPUS_PER_NODE),
    "SLURM_GRES_TYPE": GPU_TYPE,
}
SLURM_UP = ROOT / "scripts" / "slurm_up.sh"
PARTITION = "gpu"

# soak.py takes its database, its Redis and its shares from module constants: this bench's own.
soak.DB_NAME = os.environ.get("SLURM_BENCH_DATABASE", "portal_slurm_bench")
soak.REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/11")
soak.SHARES = [
    ("vision", "LEND", {GPU_TYPE: 8}, {"grace_seconds": GRACE}),
    ("research", "LEND_AND_BORROW", {GPU_TYPE: 8}, {"grace_seconds": GRACE}),
]
OWNER_SHARE, BORROWER_SHARE = "vision", "research"


def started_command(path: str, seconds: float) -> str:
    """A job whose process writes time.time() to `path` as it starts, then sleeps."""
    return f"date +%s.%N > {path}; sleep {seconds:g}"


def read_time(path: Path) -> float | None:
    """The time a job wrote to `path`; None until it is there (and whole)."""
    try:
        return float(path.read_text())
    except (OSError, ValueError):
        return None


def wait_for(check: Callable[[], object], timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)
    return value


def latency_sample(submit: Callable[[int], Path], count: int, interval: float,
                   timeout: float) -> tuple[list[float], int]:  # fmt: skip
    """Job i submitted at t0 + i × interval by submit(i), which returns the file its process
    writes its start time to. Returns the latencies (start − the time just before the submit)
    and how many never started within `timeout` after the last submit."""
    t0 = time.monotonic()
    submitted: list[tuple[float, Path]] = []
    for i in range(count):
        delay = t0 + i * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        before = time.time()
        submitted.append((before, submit(i)))
    deadline = time.monotonic() + timeout
    latencies: list[float] = []
    waiting = list(submitted)
    while waiting and time.monotonic() < deadline:
        still = []
        for before, path in waiting:
            started = read_time(path)
            if started is None:
                still.append((before, path))
            else:
                latencies.append(started - before)
        waiting = still
        time.sleep(0.05)
    return latencies, len(waiting)


def percentiles(figures: dict[str, float], prefix: str, values: list[float]) -> None:
    figures[f"{prefix} p50"] = soak.percentile(values, 0.5)
    figures[f"{prefix} p99"] = soak.percentile(values, 0.99)


# --- Slurm ---------------------------------------------------------------------------------------


class Slurm:
    """This bench's own cluster, through scripts/slurm_up.sh and Slurm's client commands."""

    def __init__(self) -> None:
        self.env = {**os.environ, **SLURM_SETTINGS}
        self.env.pop("SLURM_CONF", None)
        self.conf = ""

    def script(self, command: str) -> str:
        done = subprocess.run(["bash", str(SLURM_UP), command], env=self.env, text=True,
                              capture_output=True, timeout=180)  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"slurm_up.sh {command}: {(done.stderr or done.stdout)[-2000:]}")
        return done.stdout

    def restart(self) -> None:
        """A fresh cluster: no job, job ids from 1 again, every node idle."""
        self.script("stop")
        last = self.script("start").strip().splitlines()[-1]
        self.conf = last.removeprefix("export SLURM_CONF=").strip()
        self.env["SLURM_CONF"] = self.conf

    def stop(self) -> None:
        self.script("stop")

    def sbatch(self, name: str, wrap: str, gpus: int = 1) -> str:
        done = subprocess.run(
            ["sbatch", "--parsable", "-p", PARTITION, f"--gres=gpu:{gpus}", "-J", name,
             "-o", "/dev/null", "--wrap", wrap],
            env=self.env, text=True, capture_output=True, timeout=60,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"sbatch: {done.stderr.strip()}")
        return done.stdout.strip().split(";")[0]

    def active(self) -> int:
        """Jobs pending, running or completing."""
        done = subprocess.run(["squeue", "-h", "-o", "%i"], env=self.env, text=True,
                              capture_output=True, timeout=60)  # fmt: skip
        return len(done.stdout.split()) if done.returncode == 0 else -1

    def cancel_all(self) -> None:
        """Every job cancelled (what the connector left behind when it stopped)."""
        subprocess.run(["scancel", f"--partition={PARTITION}"], env=self.env,
                       capture_output=True, timeout=60)  # fmt: skip
        self.wait_idle()

    def wait_idle(self, timeout: float = 120) -> None:
        wait_for(lambda: self.active() == 0, timeout, "Slurm's queue to empty")

    def sbatch_rate(self, jobs: int, clients: int) -> float:
        """Jobs/s of `clients` shell loops of sbatch at once, `jobs` in all."""
        loops = []
        began = time.perf_counter()
        for k in range(clients):
            count = jobs // clients + (1 if k < jobs % clients else 0)
            loop = (
                f"for i in $(seq 1 {count}); do sbatch --parsable -p {PARTITION} --gres=gpu:1 "
                f"-J tput-{k} -o /dev/null --wrap true >/dev/null || exit 1; done"
            )
            loops.append(subprocess.Popen(["bash", "-c", loop], env=self.env))
        codes = [loop.wait() for loop in loops]
        elapsed = time.perf_counter() - began
        if any(codes):
            raise RuntimeError(f"an sbatch loop failed ({codes})")
        return jobs / elapsed


def slurm_alone(slurm: Slurm, args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    slurm.restart()
    out = tmp / "slurm-alone"
    out.mkdir(parents=True, exist_ok=True)
    slurm.sbatch("warm-up", started_command(str(out / "started-warm-up"), 0))
    wait_for(lambda: read_time(out / "started-warm-up"), 60, "Slurm's warm-up job")

    def submit(i: int) -> Path:
        path = out / f"started-latency-{i}"
        slurm.sbatch(f"latency-{i}", started_command(str(path), args.job_seconds))
        return path

    latencies, missing = latency_sample(submit, args.latency_jobs, args.interval, 60)
    figures: dict[str, float] = {"slurm alone latency missing": missing}
    percentiles(figures, "slurm alone latency", latencies)
    slurm.wait_idle()
    figures["sbatch 1"] = slurm.sbatch_rate(args.sbatch_jobs, 1)
    slurm.wait_idle()
    figures[f"sbatch {args.sbatch_clients}"] = slurm.sbatch_rate(
        args.sbatch_jobs, args.sbatch_clients
    )
    slurm.wait_idle()
    return figures


# --- The portal ----------------------------------------------------------------------------------


def close_django_connections() -> None:
    """The last part's connections are to the database the next one drops."""
    if "django" in sys.modules:
        from django.db import connections

        connections.close_all()


def drop_database() -> None:
    import psycopg

    close_django_connections()
    with psycopg.connect(soak.ADMIN_URL, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{soak.DB_NAME}" WITH (FORCE)')


def stop_tree(processes: list[psutil.Process]) -> None:
    """SIGTERM to what is still alive of `processes`, SIGKILL after 5 s."""
    alive = []
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.terminate()
            alive.append(process)
    _, left = psutil.wait_procs(alive, timeout=5)
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.kill()


class PortalPart(soak.Soak):
    """One portal part of a run: soak.Soak's processes, on Slurm (the connector) or on 4
    fake-GPU agents."""

    def __init__(self, args: argparse.Namespace, slurm: Slurm | None) -> None:
        super().__init__(
            argparse.Namespace(
                agents=0 if slurm else NODES, sqlite=False, keep=args.keep, seed=1,
                minutes=60.0, clients=args.clients, jobs=args.portal_jobs,
            )
        )  # fmt: skip
        self.bench = args
        self.slurm = slurm
        self.kind = "slurm" if slurm else "agents"
        self.checkpoints = self.tmp / "checkpoints"
        self.session = requests.Session()
        self.connector_cpu0 = 0.0

    def start_agent(self, name: str) -> None:
        self.agent_specs[name] = (GPU_TYPE, GPUS_PER_NODE)
        super().start_agent(name)

    def start_connector(self) -> None:
        self.agents["connector"] = self.spawn(
            "connector",
            [soak.PYTHON, "-m", "scheduler.agent", "slurm", "--portal", self.url,
             "--join-token", soak.JOIN_TOKEN, "--partition", PARTITION, "--name", "slurm-bench",
             "--poll-wait", "5", "--log-level", "INFO",
             "--work-dir", str(self.tmp / "connector"),
             "--checkpoint-root", str(self.checkpoints)],
            SLURM_CONF=self.slurm.conf,
        )  # fmt: skip

    def connector_cpu(self) -> float:
        process = self.agents.get("connector")
        if process is None:
            return math.nan
        with contextlib.suppress(psutil.Error):
            return soak.process_cpu(psutil.Process(process.pid))
        return math.nan

    def stop_everything(self) -> None:
        tree: list[psutil.Process] = []
        with contextlib.suppress(psutil.Error):
            tree = psutil.Process().children(recursive=True)
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

    def latency_job(self, name: str, seconds: float) -> int:
        return self.post(BORROWER_SHARE, 1, started_command('"$CHECKPOINT_DIR/started"', seconds),
                         name)  # fmt: skip

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
        self.start()
        if self.slurm is not None:
            self.start_connector()
        self.setup_django()
        from scheduler.models import ClusterSettings, Node

        settings = ClusterSettings.load()
        # One borrower may be reclaimed again and again (it has lost the least work): the
        # churn breaker would hold it off borrowed GPUs after its third, and the reclaims wait.
        settings.churn_preemptions = 0
        settings.save()
        wait_for(lambda: Node.objects.filter(state=Node.State.READY).count() == NODES, 120,
                 f"the {NODES} nodes READY")  # fmt: skip
        self.connector_cpu0 = self.connector_cpu()
        figures: dict[str, float] = {}

        warm_up = self.latency_job("warm-up", 0)
        wait_for(lambda: read_time(self.started_file(warm_up)), 60, "the warm-up job")
        ids: list[int] = []

        def submit(i: int) -> Path:
            ids.append(self.latency_job(f"latency-{i}", self.bench.job_seconds))
            return self.started_file(ids[-1])

        args = self.bench
        latencies, missing = latency_sample(submit, args.latency_jobs, args.interval, 60)
        figures[f"{self.kind} latency missing"] = missing
        percentiles(figures, f"{self.kind} latency", latencies)
        if not self.wait_final([warm_up, *ids], 60):
            raise RuntimeError("the latency jobs did not all end")

        percentiles(figures, f"{self.kind} reclaim", self.reclaims())
        figures.update(self.throughput())
        figures[f"{self.kind} connector cpu"] = self.connector_cpu() - self.connector_cpu0
        return figures

    def reclaims(self) -> list[float]:
        from scheduler.models import Job, JobAttempt
        from tests.live import job_command

        # Checkpoints every 0.5 s, runs for ever; on SIGTERM writes sigterm-N and exits.
        borrowers = [
            self.post(BORROWER_SHARE, GPUS_PER_NODE, job_command(10**7, 0.5), f"borrower-{i}")
            for i in range(NODES)
        ]

        def borrowers_running() -> bool:
            for job_id in borrowers:
                attempt = JobAttempt.objects.filter(job_id=job_id, ended_at__isnull=True).first()
                if attempt is None or Job.objects.get(pk=job_id).state != Job.State.RUNNING:
                    return False
                start = self.checkpoints / f"job-{job_id}" / f"attempt-{attempt.number}.start"
                if not start.exists():
                    return False
            return True

        samples = []
        for i in range(self.bench.reclaims):
            wait_for(borrowers_running, 90, "every borrower running")
            time.sleep(0.3)  # the borrowers' SIGTERM handlers are set just after attempt-N.start
            before = time.time()
            owner = self.post(OWNER_SHARE, GPUS_PER_NODE, "sleep 1", f"owner-{i}")
            victim = wait_for(
                lambda owner=owner: JobAttempt.objects.filter(preempted_for_id=owner).first(), 60,
                "a borrower's stop order",
            )  # fmt: skip
            sigterm = self.checkpoints / f"job-{victim.job_id}" / f"sigterm-{victim.number}"
            samples.append(wait_for(lambda s=sigterm: read_time(s), 60, "the SIGTERM") - before)
            if not self.wait_final([owner], 90):
                raise RuntimeError(f"the owner's job {owner} did not end")
        for job_id in borrowers:
            self.session.post(f"{self.url}/api/v1/jobs/{job_id}/cancel/", timeout=60)
        if not self.wait_final(borrowers, 60):
            raise RuntimeError("the borrowers did not end when cancelled")
        return samples

    def throughput(self) -> dict[str, float]:
        from scheduler.models import Job

        args = self.bench
        bodies = [
            {"name": f"throughput-{i}", "share": BORROWER_SHARE, "gpu_type": GPU_TYPE, "gpus": 1,
             "nodes": 1, "command": "true"}
            for i in range(args.portal_jobs)
        ]  # fmt: skip
        token = self.session.headers["Authorization"].removeprefix("Token ")
        self.accepted, self.submit_latencies, self.submit_errors = [], [], {}
        # soak.Soak.submitter at an unbounded rate: each thread submits as its answers come.
        parts = [bodies[k :: args.clients] for k in range(args.clients)]
        threads = [
            threading.Thread(target=self.submitter, args=(token, part, math.inf), daemon=True)
            for part in parts
        ]
        began = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - began
        drained = self.wait_final(list(self.accepted), args.drain_seconds)
        drain = time.perf_counter() - began if drained else math.nan
        succeeded = Job.objects.filter(pk__in=self.accepted, state=Job.State.SUCCEEDED).count()
        return {
            f"{self.kind} rate": len(self.accepted) / elapsed,
            f"{self.kind} refused": sum(self.submit_errors.values()),
            f"{self.kind} submit p50 ms": soak.percentile(self.submit_latencies, 0.5) * 1000,
            f"{self.kind} submit p99 ms": soak.percentile(self.submit_latencies, 0.99) * 1000,
            f"{self.kind} drain": drain,
            f"{self.kind} succeeded": succeeded,
        }


def portal_part(args: argparse.Namespace, slurm: Slurm | None, parts: list) -> dict[str, float]:
    part = PortalPart(args, slurm)
    parts.append(part)
    try:
        close_django_connections()
        return part.run_part()
    finally:
        part.stop_everything()
        if args.keep:
            print(f"  logs and files of the portal on {part.kind} kept in {part.tmp}")
        else:
            shutil.rmtree(part.tmp, ignore_errors=True)


# --- Report --------------------------------------------------------------------------------------


def derived(figures: dict[str, float], clients: int) -> None:
    f = figures
    f["ratio 1"] = f["slurm rate"] / f["sbatch 1"]
    f["ratio n"] = f["slurm rate"] / f[f"sbatch {clients}"]
    f["over p50"] = f["slurm latency p50"] - f["slurm alone latency p50"]
    f["over p99"] = f["slurm latency p99"] - f["slurm alone latency p99"]
    f["reclaim ratio"] = f["slurm reclaim p50"] / f.get("agents reclaim p50", math.nan)


def rows(args: argparse.Namespace) -> list[tuple[str, str, str, tuple[str, float] | None]]:
    """The table: label, key, unit, goal."""
    n = args.sbatch_clients
    return [
        ("Slurm alone: sbatch, 1 client (jobs/s)", "sbatch 1", "s", None),
        (f"Slurm alone: sbatch, {n} clients at once (jobs/s)", f"sbatch {n}", "s", None),
        ("Slurm alone: submit → running p50 (s)", "slurm alone latency p50", "s", None),
        ("Slurm alone: submit → running p99 (s)", "slurm alone latency p99", "s", None),
        (f"portal on Slurm: accepted submits/s ({args.clients} clients)", "slurm rate", "s",
         None),
        ("portal on Slurm ÷ sbatch 1 client (×)", "ratio 1", "s", (">=", 2.0)),
        (f"portal on Slurm ÷ sbatch {n} clients (×)", "ratio n", "s", None),
        ("portal on Slurm: submit → running p50 (s)", "slurm latency p50", "s", None),
        ("portal on Slurm: submit → running p99 (s)", "slurm latency p99", "s", None),
        ("  p50 above Slurm alone's (s)", "over p50", "s", ("<=", 0.5)),
        ("  p99 above Slurm alone's (s)", "over p99", "s", None),
        ("portal on Slurm: owner's submit → borrower's SIGTERM p50 (s)", "slurm reclaim p50",
         "s", ("<=", 1.0)),
        ("portal on Slurm: owner's submit → borrower's SIGTERM p99 (s)", "slurm reclaim p99",
         "s", None),
        ("portal on Slurm: first throughput submit → all ended (s)", "slurm drain", "s", None),
        ("portal on agents: accepted submits/s", "agents rate", "s", None),
        ("portal on agents: submit → running p50 (s)", "agents latency p50", "s", None),
        ("portal on agents: submit → running p99 (s)", "agents latency p99", "s", None),
        ("portal on agents: owner's submit → borrower's SIGTERM p50 (s)", "agents reclaim p50",
         "s", None),
        ("portal on agents: owner's submit → borrower's SIGTERM p99 (s)", "agents reclaim p99",
         "s", None),
        ("reclaim p50, Slurm ÷ agents (×)", "reclaim ratio", "s", None),
        ("portal on agents: first throughput submit → all ended (s)", "agents drain", "s", None),
        ("connector CPU seconds (its Slurm commands included)", "slurm connector cpu", "s",
         None),
    ]  # fmt: skip


def run_line(index: int, f: dict[str, float], args: argparse.Namespace) -> str:
    n, num = args.sbatch_clients, kueue_baseline.number
    return "\n".join(
        [
            f"run {index}: Slurm alone: submit → running p50/p99 "
            f"{num(f['slurm alone latency p50'], 's')}/{num(f['slurm alone latency p99'], 's')} "
            f"s ({f['slurm alone latency missing']:.0f} never started); sbatch "
            f"{num(f['sbatch 1'], 's')} jobs/s (1 client), {num(f[f'sbatch {n}'], 's')} "
            f"({n} clients)",
            *(
                f"  portal on {kind}: submit → running p50/p99 "
                f"{num(f[f'{kind} latency p50'], 's')}/{num(f[f'{kind} latency p99'], 's')} s "
                f"({f[f'{kind} latency missing']:.0f} never started); reclaim p50/p99 "
                f"{num(f[f'{kind} reclaim p50'], 's')}/{num(f[f'{kind} reclaim p99'], 's')} s; "
                f"{num(f[f'{kind} rate'], 's')} submits/s accepted ({f[f'{kind} refused']:.0f} "
                f"refused; submit p50/p99 {num(f[f'{kind} submit p50 ms'], 'ms')}/"
                f"{num(f[f'{kind} submit p99 ms'], 'ms')} ms), "
                f"{f[f'{kind} succeeded']:.0f} of them SUCCEEDED after "
                f"{num(f[f'{kind} drain'], 's')} s"
                for kind in ("slurm", "agents")
                if f"{kind} rate" in f
            ),
            f"  connector CPU {num(f['slurm connector cpu'], 's')} s",
        ]
    )


def report(runs: list[dict[str, float]], args: argparse.Namespace) -> str:
    lines = [
        "",
        f"slurm bench: {len(runs)} run(s); Slurm {NODES} nodes × {GPUS_PER_NODE} {GPU_TYPE}; "
        f"latency {args.latency_jobs} jobs of 1 GPU, one every {args.interval:g} s, running "
        f"{args.job_seconds:g} s; throughput {args.sbatch_jobs} sbatch, {args.portal_jobs} "
        f"portal submits from {args.clients} clients; {args.reclaims} reclaims (grace {GRACE} "
        f"s); value = median (each run)",
        "",
    ]
    table = [("figure", "value", "goal", "")]
    for label, key, unit, goal in rows(args):
        if not any(key in run for run in runs):
            continue
        judged = kueue_baseline.median([run.get(key, math.nan) for run in runs])
        verdict, goal_text = "", "—"
        if goal is not None:
            op, target = goal
            goal_text = f"{'≥' if op == '>=' else '≤'} {target:g}"
            met = judged >= target if op == ">=" else judged <= target
            verdict = "—" if math.isnan(judged) else ("met" if met else "MISSED")
        table.append((label, kueue_baseline.live_cell(runs, key, unit), goal_text, verdict))
    widths = [max(len(row[column]) for row in table) for column in range(4)]
    for number, row in enumerate(table):
        cells = (cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        lines.append("  ".join(cells).rstrip())
        if number == 0:
            lines.append("  ".join("-" * width for width in widths))
    lines.append(f"machine: {os.cpu_count()} CPUs")
    return "\n".join(lines)


# --- Main ----------------------------------------------------------------------------------------


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latency-jobs", type=int, default=40)
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between submits")
    parser.add_argument("--job-seconds", type=float, default=2.0, help="a latency job's run")
    parser.add_argument("--sbatch-jobs", type=int, default=300)
    parser.add_argument("--sbatch-clients", type=int, default=4)
    parser.add_argument("--portal-jobs", type=int, default=600)
    parser.add_argument("--clients", type=int, default=8, help="portal submit threads")
    parser.add_argument("--reclaims", type=int, default=10)
    parser.add_argument("--drain-seconds", type=float, default=300.0,
                        help="longest wait for the throughput jobs to end")  # fmt: skip
    parser.add_argument("--no-agents", action="store_true", help="skip the portal on agents")
    parser.add_argument("--quick", action="store_true", help="small counts, 1 run")
    parser.add_argument("--keep", action="store_true", help="keep logs and files")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.latency_jobs, args.sbatch_jobs = 1, 10, 50
        args.portal_jobs, args.reclaims, args.drain_seconds = 50, 3, 120.0
    return args


def main() -> int:
    args = parse()
    # A plain `kill` cleans up as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
    slurm = Slurm()
    parts: list[PortalPart] = []
    runs: list[dict[str, float]] = []
    try:
        for index in range(1, args.runs + 1):
            figures = slurm_alone(slurm, args, tmp)
            print(f"[run {index}] Slurm alone done", flush=True)
            slurm.restart()
            figures.update(portal_part(args, slurm, parts))
            print(f"[run {index}] the portal on Slurm done", flush=True)
            slurm.cancel_all()
            if not args.no_agents:
                figures.update(portal_part(args, None, parts))
                print(f"[run {index}] the portal on agents done", flush=True)
            derived(figures, args.sbatch_clients)
            runs.append(figures)
            print(run_line(index, figures, args), flush=True)
        print(report(runs, args), flush=True)
        return 0
    finally:
        for part in parts:
            part.stop_everything()
        with contextlib.suppress(Exception):
            slurm.stop()
        with contextlib.suppress(Exception):
            drop_database()
        with contextlib.suppress(Exception):
            import redis

            redis.Redis.from_url(soak.REDIS_URL).flushdb()
        if args.keep:
            print(f"Slurm's files in {SLURM_SETTINGS['SLURM_DIR']}, the bench's in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(SLURM_SETTINGS["SLURM_DIR"], ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
