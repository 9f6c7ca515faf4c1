"""Kueue's scheduler performance test ("baseline" configuration) on the portal: live, and
through the simulator as the policy's own figures.

    python bench/kueue_baseline.py [--scale 1.0] [--runs 3] [--minutes 15] [--seed 1] [--keep]

Kueue's test (test/performance/scheduler, configs/baseline) translated: its 5 cohorts are 5 GPU
types (a100, h100, h200, l4, l40s); its 6 ClusterQueues per cohort are 6 shares per type
(`h100-1` .. `h100-6`), each on a team of its own, with a limit of 20 GPUs of its type (the
nominal quota), LEND_AND_BORROW with borrow_limit 500 (a percent of the limit: Kueue's
borrowingLimit of 100), in-share preemption (withinClusterQueue: LowerPriority) and grace 0.
Two fake-GPU agents of 60 GPUs per type hold the 6 × 20 GPUs. Per share: 350 small jobs (1 GPU,
`sleep 0.2`, priority 50, one every 0.1 s), 100 medium (5 GPUs, `sleep 0.5`, priority 100, one
every 0.5 s) and 50 large (20 GPUs, `sleep 1`, priority 200, one every 1.2 s): 15,000 jobs.
--scale multiplies each class's count (rounded half up, at least 1; the intervals stay);
--seed only decides the order the client threads start in (the schedule has no chance in it).

Each run starts, with bench/soak.py's machinery and all on 127.0.0.1: a scratch PostgreSQL database
`portal_kueue` (dropped and re-created), Redis REDIS_URL (default redis://127.0.0.1:6379/10,
flushed), the production server (`gpu-portal-server web`: uvicorn, 2 processes, a pool of 8 database
connections each; its Celery worker, 2 processes, and beat, a cycle every second), and the 10
agents. Once every agent is READY, 90 client threads (one per share and class, each with its own
session) submit over POST /api/v1/jobs/: job i of a class at t0 + i × its interval, the same t0 for
all (a late submit is followed at once by the next). A run ends when every client is done and every
accepted job has ended, or at --minutes from its start; then every process is stopped and the books
are read from the database and from the agents' work dirs.

The same workload goes once through scheduler.simulator (submits at the schedule's times,
durations = the sleeps): what the policy itself gives, to divide the live figures by.

Prints each run's figures, then one table (the median of the runs and each run's value, the
policy's, live ÷ policy, Kueue's published baseline, the goal, met or missed): first submit →
last finish, mean time to admission of each class, submit latency p99, GPU busy fraction, lost
jobs, double-booked GPUs, attempts started after their stop order. Then: time to admission
p50/p90, submit p50, CPU seconds of web, worker, agents (with their jobs), the bench itself and
PostgreSQL, CPU per job, the whole machine's busy CPU, dispatch delays (a GPU's release → its
next admission; admission → process start), what each class held while large jobs were still
being submitted (live and policy: the medium jobs get what the large ones leave), late process
starts, preemptions, jobs by state.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import re
import shutil
import signal
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import soak  # noqa: E402

GPU_TYPES = ("a100", "h100", "h200", "l4", "l40s")
# (GPU type, GPUs) of each agent; agent i is soak-i.
AGENTS = [(gpu_type, 60) for gpu_type in GPU_TYPES for _ in range(2)]
SHARES_PER_TYPE = 6
SHARE_LIMIT = 20
SHARE_SETTINGS = {"borrow_limit": 500, "in_share_preemption": True, "grace_seconds": 0}
SHARES = [
    (f"{gpu_type}-{k}", "LEND_AND_BORROW", {gpu_type: SHARE_LIMIT}, SHARE_SETTINGS)
    for gpu_type in GPU_TYPES
    for k in range(1, SHARES_PER_TYPE + 1)
]

# soak.py takes its database, its Redis and its shares from module constants: this bench's own.
soak.DB_NAME = "portal_kueue"
soak.REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/10")
soak.SHARES = SHARES


@dataclass(frozen=True)
class JobClass:
    name: str
    count: int  # jobs per share at --scale 1
    gpus: int
    seconds: float  # what the job sleeps
    priority: int
    interval: float  # seconds between two submits of one share


CLASSES = (
    JobClass("large", 50, 20, 1.0, 200, 1.2),
    JobClass("medium", 100, 5, 0.5, 100, 0.5),
    JobClass("small", 350, 1, 0.2, 50, 0.1),
)


@dataclass(frozen=True)
class Stream:
    """What one client thread submits: `count` jobs of one class to one share."""

    share: str
    gpu_type: str
    job_class: JobClass
    count: int

    def body(self, number: int) -> dict:
        return {
            "name": f"{self.job_class.name}-{self.share}-{number}",
            "share": self.share,
            "gpu_type": self.gpu_type,
            "gpus": self.job_class.gpus,
            "nodes": 1,
            "priority": self.job_class.priority,
            "command": f"sleep {self.job_class.seconds:g}",
        }

    def submit_at(self, number: int) -> float:
        """Seconds after t0."""
        return round(number * self.job_class.interval, 3)


def class_of(job_name: str) -> str:
    return job_name.split("-", 1)[0]


def streams(scale: float) -> list[Stream]:
    return [
        Stream(
            name, next(iter(limits)), job_class, max(1, math.floor(job_class.count * scale + 0.5))
        )
        for name, _, limits, _ in SHARES
        for job_class in CLASSES
    ]


# The headline figures: key, label, unit, Kueue's published baseline, goal, whether the policy
# (simulator) has the figure too. Counts are judged on the worst run, the rest on the median.
HEADLINE = [
    ("makespan", "first submit → last finish", "s", 351.0, ("<=", 120.0), True),
    ("admission large mean", "time to admission, large (mean)", "s", 16.5, ("<=", 5.0), True),
    ("admission medium mean", "time to admission, medium (mean)", "s", 76.8, ("<=", 40.0), True),
    ("admission small mean", "time to admission, small (mean)", "s", 215.0, ("<=", 80.0), True),
    ("submit p99", "submit latency p99", "ms", None, ("<=", 250.0), False),
    ("gpu busy", "GPU busy fraction", "%", None, (">=", 80.0), False),
    ("lost", "lost jobs", "", None, ("<=", 0), False),
    ("double", "double-booked GPUs", "", None, ("<=", 0), False),
    ("after stop", "attempts started after their stop order", "", None, ("<=", 0), False),
]
COUNTS = {"lost", "double", "after stop"}


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def admission_figures(waits: dict[str, list[float]]) -> dict[str, float]:
    """Mean, p50 and p90 of the time to admission of each class."""
    figures = {}
    for name, values in waits.items():
        figures[f"admission {name} mean"] = mean(values)
        figures[f"admission {name} p50"] = soak.percentile(values, 0.5)
        figures[f"admission {name} p90"] = soak.percentile(values, 0.9)
    return figures


def class_shares(
    held: list[tuple[str, float, float]], submits: list[tuple[str, float]]
) -> dict[str, float]:
    """What each class held while large jobs were still being submitted: `held` is (class,
    admission, end) of every attempt, `submits` (class, submit time) of every job. From the
    first submit to the last large one, each class's GPU-seconds held as a part (%) of all the
    cluster's GPU-seconds: the policy leaves the medium jobs what the large ones do not take,
    and a live run leaves them that less its dispatch overhead on the large ones."""
    start = min(at for _, at in submits)
    end = max(at for name, at in submits if name == "large")
    if end <= start:  # every large job submitted at the first moment (a small --scale)
        return {f"share {c.name}": math.nan for c in CLASSES}
    gpus = {c.name: c.gpus for c in CLASSES}
    total = sum(count for _, count in AGENTS) * (end - start)
    figures = {f"share {c.name}": 0.0 for c in CLASSES}
    for name, admitted, ended in held:
        overlap = min(ended, end) - max(admitted, start)
        if overlap > 0:
            figures[f"share {name}"] += 100 * gpus[name] * overlap / total
    return figures


# --- The policy: the simulator -------------------------------------------------------------


def policy_figures(plan: list[Stream]) -> dict[str, float]:
    """Figures 1 and 2 (and the preemptions) of the same workload through the simulator."""
    from scheduler.simulator import parse_scenario, simulate

    jobs = [
        {
            "id": body["name"],
            "share": stream.share,
            "gpu_type": stream.gpu_type,
            "gpus": stream.job_class.gpus,
            "submit": stream.submit_at(number),
            "duration": stream.job_class.seconds,
            "priority": stream.job_class.priority,
        }
        for stream in plan
        for number in range(stream.count)
        for body in [stream.body(number)]
    ]
    scenario = parse_scenario(
        {
            "nodes": [
                {"name": f"soak-{i}", "gpu_type": gpu_type, "gpus": gpus}
                for i, (gpu_type, gpus) in enumerate(AGENTS)
            ],
            "shares": [
                {"name": name, "capacity_limits": limits, "strategy": strategy, **extra}
                for name, strategy, limits, extra in SHARES
            ],
            "jobs": jobs,
        },
        source="kueue baseline",
    )
    began = time.perf_counter()
    data = simulate(scenario).data
    result = data["jobs"]
    # Each job of the result has its submit time, its first start ("started": the simulator
    # places and starts a job at once, so that is its admission) and its end ("finished").
    waits: dict[str, list[float]] = {c.name: [] for c in CLASSES}
    for job in result:
        if job["started"] is not None:
            waits[class_of(job["id"])].append(job["started"] - job["submitted"])
    ended = [job["finished"] for job in result if job["finished"] is not None]
    # Each start holds its GPUs until the job's next finish, preemption (grace 0) or failure.
    held, since = [], {}
    for event in data["events"]:
        if event["type"] == "start":
            since[event["job"]] = event["t"]
        elif event["job"] in since:
            held.append((class_of(event["job"]), since.pop(event["job"]), event["t"]))
    figures = {
        "makespan": max(ended) - min(job["submitted"] for job in result),
        "preemptions": sum(job["preemptions"] for job in result),
        "not admitted": sum(1 for job in result if job["started"] is None),
        "seconds": time.perf_counter() - began,
    }
    figures.update(admission_figures(waits))
    figures.update(class_shares(held, [(class_of(job["id"]), job["submitted"]) for job in result]))
    return figures


# --- The live system ---------------------------------------------------------------------------

LOG_NAME = re.compile(r"job-(\d+)-attempt-(\d+)\.log")


class LiveRun(soak.Soak):
    """One live run: soak.Soak's processes and CPU accounting, with this bench's cluster, load
    and books."""

    def __init__(self, args: argparse.Namespace, plan: list[Stream]) -> None:
        super().__init__(
            argparse.Namespace(
                agents=len(AGENTS), sqlite=False, minutes=args.minutes, keep=args.keep,
                seed=args.seed, clients=len(plan), jobs=sum(s.count for s in plan),
            )
        )  # fmt: skip
        self.plan = plan
        self.refusal_samples: dict[str, str] = {}  # a body of each refusal's status
        self.cpu_base: dict[str, dict[int, float]] = {}
        self.finished_all = False

    def start_agent(self, name: str) -> None:
        # soak.Soak.start names its agents soak-0, soak-1, ... and gives them its own mix of
        # nodes; agent i is AGENTS[i] here.
        self.agent_specs[name] = AGENTS[int(name.removeprefix("soak-"))]
        super().start_agent(name)

    def kill_leftover_jobs(self) -> None:
        """The jobs of an agent that had to be SIGKILLed die with it (PR_SET_PDEATHSIG); this
        is for a system where that does not hold. Only processes in this run's own
        checkpoint directories (a job's cwd) are killed."""
        for pgid_file in (self.tmp / "agents").glob("*/running/*.pgid"):
            with contextlib.suppress(psutil.Error, OSError, ValueError):
                pgid = int(pgid_file.read_text())
                if psutil.Process(pgid).cwd().startswith(str(self.tmp)):
                    os.killpg(pgid, signal.SIGKILL)

    # --- Load ----------------------------------------------------------------------------------

    def client(self, token: str, stream: Stream, t0: float) -> None:
        session = requests.Session()
        session.headers["Authorization"] = f"Token {token}"
        for number in range(stream.count):
            delay = t0 + stream.submit_at(number) - time.monotonic()
            if (delay > 0 and self.stop.wait(delay)) or self.stop.is_set():
                return
            begin = time.perf_counter()
            try:
                response = session.post(
                    f"{self.url}/api/v1/jobs/", json=stream.body(number), timeout=60
                )
                status = str(response.status_code)
            except requests.RequestException as error:
                response, status = None, type(error).__name__
            elapsed = time.perf_counter() - begin
            with self.lock:
                # Every submit's latency, refused ones included.
                self.submit_latencies.append(elapsed)
                if response is not None and response.status_code == 201:
                    self.accepted.append(response.json()["id"])
                else:
                    self.submit_errors[status] = self.submit_errors.get(status, 0) + 1
                    if response is not None:
                        self.refusal_samples.setdefault(status, response.text[:200])

    def run_once(self, rng: random.Random) -> dict[str, float]:
        started = time.monotonic()
        deadline = started + self.args.minutes * 60
        token = self.prepare()
        self.start()
        self.setup_django()
        from scheduler.models import Job, Node

        while Node.objects.filter(state=Node.State.READY).count() < len(AGENTS):
            if time.monotonic() > deadline:
                raise SystemExit("the agents did not all register before --minutes")
            self.check_portal_alive()
            time.sleep(1)
        self.ready_after = time.monotonic() - started
        print(f"[{self.ready_after:5.0f} s] {len(AGENTS)} agents registered", flush=True)

        # CPU is counted from here: start-up (imports, migrations) is no part of the figures.
        self.sample_cpu()
        self.cpu_base = {part: dict(seen) for part, seen in self.cpu_seen.items()}
        self.cpu_start = (os.times(), psutil.cpu_times(), soak.postgres_cpu(), time.monotonic())
        t0 = time.monotonic() + 0.5
        clients = [
            threading.Thread(target=self.client, args=(token, stream, t0), daemon=True)
            for stream in self.plan
        ]
        helpers = [threading.Thread(target=self.rss_sampler, daemon=True)]
        if not soak.autovacuum_on():
            self.vacuums = 0
            helpers.append(threading.Thread(target=self.vacuumer, daemon=True))
        # The seed only decides the order the clients start in; they share t0.
        for thread in rng.sample(clients, len(clients)) + helpers:
            thread.start()

        next_line = time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(1)
            self.check_portal_alive()
            submitting = any(thread.is_alive() for thread in clients)
            open_jobs = Job.objects.exclude(state__in=Job.FINAL_STATES).count()
            done = not submitting and open_jobs == 0
            if time.monotonic() >= next_line or done:
                next_line += 5
                with self.lock:
                    accepted = len(self.accepted)
                print(
                    f"[{time.monotonic() - started:5.0f} s] accepted {accepted}, open {open_jobs}",
                    flush=True,
                )
            if done:
                self.finished_all = True
                break
        self.stop.set()
        self.sample_cpu()
        self.cpu_end = (os.times(), psutil.cpu_times(), soak.postgres_cpu(), time.monotonic())
        # Stop everything first: the books are read from a database nobody writes to any more.
        self.stop_all()
        self.kill_leftover_jobs()
        return self.books()

    # --- The books -------------------------------------------------------------------------------

    def process_starts(self) -> dict[tuple[int, int], float]:
        """When each attempt's process started, by (job, attempt number): the agent opens the
        attempt's log file just before it spawns the process, and `sleep` never writes to it,
        so its mtime is its creation time."""
        starts: dict[tuple[int, int], float] = {}
        for log in (self.tmp / "agents").glob("*/logs/job-*-attempt-*.log"):
            match = LOG_NAME.fullmatch(log.name)
            if match:
                key = (int(match[1]), int(match[2]))
                mtime = log.stat().st_mtime
                starts[key] = min(mtime, starts.get(key, mtime))
        return starts

    def books(self) -> dict[str, float]:
        from django.db.models import F

        from scheduler.models import GpuAssignment, Job, JobAttempt

        figures: dict[str, float] = {}
        accepted = set(self.accepted)
        jobs = {
            pk: (name, gpus, state, submitted.timestamp(), cancel)
            for pk, name, gpus, state, submitted, cancel in Job.objects.values_list(
                "pk", "name", "gpus", "state", "submitted_at", "cancel_requested"
            )
        }

        def seconds(moment) -> float | None:
            return None if moment is None else moment.timestamp()

        attempts = [
            (job, number, *(seconds(m) for m in moments), outcome)
            for job, number, *moments, outcome in JobAttempt.objects.values_list(
                "job_id", "number", "scheduled_at", "started_at", "stop_requested_at",
                "ended_at", "outcome",
            ).order_by("job_id", "number")
        ]  # fmt: skip
        open_attempts = {job for job, _, _, _, _, ended, _ in attempts if ended is None}

        # Lost, as soak.py counts them: accepted but missing, or placed without an open attempt.
        missing = accepted - set(jobs)
        placed_without_attempt = [
            pk for pk, (_, _, state, _, cancel) in jobs.items()
            if state in Job.PLACED_STATES and pk not in open_attempts and not cancel
        ]  # fmt: skip
        figures["lost"] = len(missing) + len(placed_without_attempt)
        figures["not final"] = sum(
            1 for pk in accepted if pk in jobs and jobs[pk][2] not in Job.FINAL_STATES
        )
        figures["accepted"] = len(accepted)
        figures["refused"] = sum(self.submit_errors.values())
        for state in Job.State.values:
            figures[f"jobs {state}"] = sum(1 for job in jobs.values() if job[2] == state)

        # 1. Makespan: the earliest Job.submitted_at to the latest end of a job, which is its
        # last attempt's JobAttempt.ended_at. A run stopped at the cap ran at least until then.
        last_end: dict[int, float | None] = {}
        first_scheduled: dict[int, float] = {}
        for job, _, scheduled, _, _, ended, _ in attempts:
            last_end[job] = ended  # ordered by number: the last one stays
            first_scheduled.setdefault(job, scheduled)
        ends = [end for end in last_end.values() if end is not None]
        first = min((job[3] for job in jobs.values()), default=float("nan"))
        makespan = (max(ends) if ends else float("nan")) - first
        if not self.finished_all:
            makespan = max(makespan, self.cpu_end[3] - self.cpu_start[3])
        figures["makespan"] = makespan

        # 2. Time to admission: the first attempt's scheduled_at − the job's submitted_at.
        waits: dict[str, list[float]] = {c.name: [] for c in CLASSES}
        for pk, scheduled in first_scheduled.items():
            name, _, _, submitted, _ = jobs[pk]
            waits[class_of(name)].append(scheduled - submitted)
        figures.update(admission_figures(waits))
        figures["not admitted"] = len(jobs) - len(first_scheduled)

        # 3. Submit latency, client side.
        figures["submit p50"] = soak.percentile(self.submit_latencies, 0.5) * 1000
        figures["submit p99"] = soak.percentile(self.submit_latencies, 0.99) * 1000

        # 4. CPU seconds from the first submit to the end of the run.
        figures.update(self.cpu_figures(len(accepted)))

        # 5. GPU busy: GPU-seconds the processes ran over GPU-seconds the attempts held GPUs.
        # A process runs from its start on its agent (its log file's creation, as for 6b: not
        # started_at, which one portal records when the agent reports the start and another
        # when it grants it) to the attempt's ended_at; an attempt whose process never started
        # held its GPUs for nothing.
        process_starts = self.process_starts()
        running = held = 0.0
        for job, number, scheduled, _, _, ended, _ in attempts:
            if ended is not None:
                gpus = jobs[job][1]
                held += gpus * (ended - scheduled)
                start = process_starts.get((job, number))
                if start is not None:
                    running += gpus * max(0.0, ended - start)
        figures["gpu busy"] = 100 * running / held if held else float("nan")
        figures.update(
            class_shares(
                [
                    (class_of(jobs[job][0]), scheduled, ended)
                    for job, _, scheduled, _, _, ended, _ in attempts
                    if ended is not None
                ],
                [(class_of(name), submitted) for name, _, _, submitted, _ in jobs.values()],
            )
        )

        # 6a and 7: each GPU's attempts in the order they were admitted. Two that overlap are a
        # double booking (soak.py's check); the gap from one's end to the next one's admission
        # is the dispatch delay of a released GPU.
        rows = (
            GpuAssignment.objects.annotate(
                scheduled=F("attempt__scheduled_at"), ended=F("attempt__ended_at")
            )
            .order_by("node_id", "gpu_index", "scheduled")
            .values_list("node_id", "gpu_index", "scheduled", "ended", "attempt__allocations")
        )
        double, gaps = 0, []
        last: dict[tuple[int, int], tuple[float | None, int]] = {}
        for node_id, index, scheduled, ended, allocations in rows.iterator():
            scheduled, ended = seconds(scheduled), seconds(ended)
            previous = last.get((node_id, index))
            if previous is not None:
                previous_end, previous_nodes = previous
                # A gang releases each node's GPUs when that node's process ends, which may be
                # before the whole attempt ends: only single-node attempts are timed exactly.
                if previous_nodes == 1 and (previous_end is None or scheduled < previous_end):
                    double += 1
                if previous_end is not None and scheduled - previous_end >= 0:
                    gaps.append(scheduled - previous_end)
            last[(node_id, index)] = (ended, len(allocations))
        figures["double"] = double
        figures["release→admission p50"] = soak.percentile(gaps, 0.5)
        figures["release→admission p90"] = soak.percentile(gaps, 0.9)

        # 6b: admission → the process's start (its log file's creation).
        delays = [
            process_starts[job, number] - scheduled
            for job, number, scheduled, *_ in attempts
            if (job, number) in process_starts
        ]
        figures["admission→start p50"] = soak.percentile(delays, 0.5)
        figures["admission→start p90"] = soak.percentile(delays, 0.9)
        figures["processes started"] = len(process_starts)

        # 7: a process that started although its stop was ordered before the portal knew of the
        # start; and, for information, processes that started after the stop order at all.
        after_stop, late = 0, []
        for job, number, _, started, stop, _, _ in attempts:
            if stop is None or (job, number) not in process_starts:
                continue
            if started is None or stop < started:
                after_stop += 1
            if process_starts[job, number] > stop:
                late.append(process_starts[job, number] - stop)
        figures["after stop"] = after_stop
        figures["late starts"] = len(late)
        figures["largest lateness"] = max(late, default=0.0)

        # 8. Preemptions.
        figures["preemptions"] = sum(
            1 for *_, outcome in attempts if outcome == JobAttempt.Outcome.PREEMPTED
        )
        return figures

    def cpu_figures(self, accepted: int) -> dict[str, float]:
        (bench0, machine0, pg0, t0), (bench1, machine1, pg1, t1) = self.cpu_start, self.cpu_end
        parts = {
            f"cpu {part}": sum(
                seconds - self.cpu_base.get(part, {}).get(pid, 0.0) for pid, seconds in seen.items()
            )
            for part, seen in self.cpu_seen.items()
        }
        parts["cpu bench"] = (bench1.user + bench1.system) - (bench0.user + bench0.system)
        parts["cpu postgres"] = pg1 - pg0

        def busy(times) -> float:
            return sum(
                getattr(times, name, 0.0) for name in ("user", "system", "nice", "irq", "softirq")
            )

        figures = dict(parts)
        figures["cpu per job ms"] = 1000 * sum(parts.values()) / accepted if accepted else math.nan
        figures["machine busy"] = busy(machine1) - busy(machine0)
        figures["machine available"] = os.cpu_count() * (t1 - t0)
        return figures


# --- Report --------------------------------------------------------------------------------------


def median(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else float("nan")


def number(value: float, unit: str = "") -> str:
    if value is None or math.isnan(value):
        return "—"
    if unit == "":
        return f"{value:.0f}"
    if unit == "ms" or abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def live_cell(runs: list[dict[str, float]], key: str, unit: str = "") -> str:
    values = [run.get(key, math.nan) for run in runs]
    cell = number(median(values), unit)
    if len(runs) > 1:
        cell += f" ({', '.join(number(v, unit) for v in values)})"
    return cell


def run_summary(index: int, figures: dict[str, float], elapsed: float, finished: bool) -> str:
    f = figures
    ending = "all jobs ended" if finished else "stopped at --minutes"
    return "\n".join(
        [
            f"run {index}: {elapsed:.0f} s ({ending}); accepted {f['accepted']:.0f}, refused "
            f"{f['refused']:.0f}, not final {f['not final']:.0f}",
            f"  makespan {number(f['makespan'], 's')} s; admission mean large "
            f"{number(f['admission large mean'], 's')} s, medium "
            f"{number(f['admission medium mean'], 's')} s, small "
            f"{number(f['admission small mean'], 's')} s; submit p50/p99 "
            f"{number(f['submit p50'], 'ms')}/{number(f['submit p99'], 'ms')} ms; GPU busy "
            f"{number(f['gpu busy'], '%')} %",
            f"  lost {f['lost']:.0f}, double-booked {f['double']:.0f}, started after stop "
            f"{f['after stop']:.0f}; preemptions {f['preemptions']:.0f}; CPU per job "
            f"{number(f['cpu per job ms'], 'ms')} ms",
        ]
    )


def report(runs: list[dict[str, float]], policy: dict[str, float], plan: list[Stream]) -> str:
    jobs = sum(s.count for s in plan)
    lines = [
        "",
        f"kueue baseline: {len(AGENTS)} agents × 60 GPUs ({len(GPU_TYPES)} types), "
        f"{len(SHARES)} shares, {len(plan)} clients, {jobs} jobs per run, {len(runs)} run(s), "
        f"{os.cpu_count()} CPUs; live = median (each run)",
        "",
    ]
    header = ("figure", "live", "policy", "live ÷ policy", "Kueue", "goal", "")
    table = [header]
    for key, label, unit, kueue, (op, goal), has_policy in HEADLINE:
        values = [run.get(key, math.nan) for run in runs]
        judged = max(values) if key in COUNTS else median(values)
        policy_value = policy.get(key, math.nan) if has_policy else math.nan
        ratio = judged / policy_value if has_policy and policy_value else math.nan
        met = judged <= goal if op == "<=" else judged >= goal
        suffix = f" {unit}" if unit else ""
        table.append(
            (
                label + (f" ({unit})" if unit else ""),
                live_cell(runs, key, unit),
                number(policy_value, unit) if has_policy else "—",
                "—" if math.isnan(ratio) else f"{ratio:.2f}",
                "—" if kueue is None else number(kueue, unit),
                f"{'≤' if op == '<=' else '≥'} {number(goal, unit)}{suffix}",
                "—" if math.isnan(judged) else ("met" if met else "MISSED"),
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        lines.append(" | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)))
        if row is header:
            lines.append("-+-".join("-" * width for width in widths))
    lines.append(
        "(lost, double-booked and started after stop are judged on the worst run, the rest on "
        "the median)"
    )

    admission = "; ".join(
        f"{c.name} {live_cell(runs, f'admission {c.name} p50', 's')} / "
        f"{live_cell(runs, f'admission {c.name} p90', 's')} (policy "
        f"{number(policy[f'admission {c.name} p50'], 's')} / "
        f"{number(policy[f'admission {c.name} p90'], 's')})"
        for c in CLASSES
    )
    cpu = ", ".join(
        f"{label} {live_cell(runs, key, 's')}"
        for key, label in (
            ("cpu web", "web"),
            ("cpu worker", "worker"),
            ("cpu agents", "agents (with their jobs)"),
            ("cpu bench", "load generator"),
            ("cpu postgres", "PostgreSQL (all databases)"),
        )
    )
    states = ", ".join(
        f"{state} {live_cell(runs, key)}"
        for key in sorted({k for run in runs for k in run if k.startswith("jobs ")})
        if any(run.get(key) for run in runs)
        for state in [key.removeprefix("jobs ")]
    )
    lines += [
        "",
        f"time to admission p50 / p90 (s): {admission}",
        f"not admitted at the end:         {live_cell(runs, 'not admitted')} (policy "
        f"{policy['not admitted']:.0f})",
        f"submit latency p50:              {live_cell(runs, 'submit p50', 'ms')} ms",
        f"CPU seconds (first submit → end): {cpu}",
        f"CPU per job:                     {live_cell(runs, 'cpu per job ms', 'ms')} ms (all of "
        "the above ÷ jobs accepted)",
        f"whole machine busy CPU-seconds:  {live_cell(runs, 'machine busy', 's')} of "
        f"{live_cell(runs, 'machine available', 's')} available ({os.cpu_count()} CPUs, other "
        "users included)",
        f"release → next admission (s):    p50 {live_cell(runs, 'release→admission p50', 's')}, "
        f"p90 {live_cell(runs, 'release→admission p90', 's')} (per GPU)",
        f"admission → process start (s):   p50 {live_cell(runs, 'admission→start p50', 's')}, "
        f"p90 {live_cell(runs, 'admission→start p90', 's')} "
        f"({live_cell(runs, 'processes started')} processes)",
        "GPUs held by each class while large jobs are submitted (% of the cluster's GPU-time): "
        + "; ".join(
            f"{c.name} {live_cell(runs, f'share {c.name}', '%')} (policy "
            f"{number(policy[f'share {c.name}'], '%')})"
            for c in CLASSES
        ),
        f"not final when the run ended:    {live_cell(runs, 'not final')}",
        f"processes started after their stop order (log mtime > stop_requested_at): "
        f"{live_cell(runs, 'late starts')}, the latest by "
        f"{live_cell(runs, 'largest lateness', 's')} s",
        f"preemptions (attempts PREEMPTED): {live_cell(runs, 'preemptions')} (policy "
        f"{policy['preemptions']:.0f})",
        f"jobs by state:                   {states}",
        f"submits refused:                 {live_cell(runs, 'refused')}",
        f"policy: the simulator ran the workload in {policy['seconds']:.1f} s",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies each class's jobs")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--minutes", type=float, default=15.0, help="hard cap on each run")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep logs and files")
    args = parser.parse_args()
    # A plain `kill` cleans up as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    plan = streams(args.scale)
    policy = policy_figures(plan)
    print(
        f"policy (simulator): makespan {number(policy['makespan'], 's')} s; admission mean "
        + ", ".join(
            f"{c.name} {number(policy[f'admission {c.name} mean'], 's')} s" for c in CLASSES
        ),
        flush=True,
    )
    runs: list[dict[str, float]] = []
    for index in range(1, args.runs + 1):
        live = LiveRun(args, plan)
        try:
            if "django" in sys.modules:
                # The last run's connection is to the database this run drops.
                from django.db import connections

                connections.close_all()
            began = time.monotonic()
            figures = live.run_once(random.Random(args.seed + index))
            runs.append(figures)
            print(run_summary(index, figures, time.monotonic() - began, live.finished_all))
            for status, sample in sorted(live.refusal_samples.items()):
                print(f"  a refused submit ({status}): {sample}")
            if live.vacuums is not None:
                print(
                    f"  autovacuum is off on this server: VACUUM (ANALYZE) every "
                    f"{soak.AUTOVACUUM_STANDIN_SECONDS:.0f} s instead ({live.vacuums} times)"
                )
        except BaseException:
            live.stop.set()
            live.stop_all()
            live.kill_leftover_jobs()
            print(f"logs in {live.tmp}", file=sys.stderr)
            raise
        if args.keep:
            print(f"  logs and files kept in {live.tmp}")
        else:
            shutil.rmtree(live.tmp, ignore_errors=True)
    print(report(runs, policy, plan), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
