"""Many node agents on one portal: N simulated agents, all held by this one asyncio process,
against the production server on PostgreSQL, under a workload that keeps the cluster busy and
its owners reclaiming.

    python bench/agents.py [--agents 250,1000,2000] [--seconds 60] [--warmup 120] [--runs 1]
                           [--wave 40] [--job-scale auto] [--heartbeat-timeout S] [--seed 1]
                           [--keep]

Each run (one per N of --agents, times --runs) starts from nothing, all on 127.0.0.1: a scratch
PostgreSQL database `portal_agents` (AGENTS_DATABASE; dropped and re-created, dropped after),
Redis AGENTS_REDIS_URL (default redis://127.0.0.1:6379/15, flushed), and the production server
as `gpu-portal-server serve` runs it (portal/server.py: `setup`, then uvicorn on portal.asgi with
WEB_WORKERS=2 and DATABASE_POOL_SIZE=8, the Celery worker with -c 2, and beat), DEBUG off, JSON
logs, the server's defaults for everything else (--heartbeat-timeout sets
NODE_HEARTBEAT_TIMEOUT_SECONDS, which caps a poll's wait at a third of it). The bench runs at
niceness -5 where it may and starts the server at 0: the agents stand for machines of their own.

The agents, N nodes of 8 h100 GPUs, do what scheduler/agent/core.py does, but start no
processes: they register with the join token (64 at a time, a fleet coming up), then each
long-polls (asking for a 20 s wait) with what it runs (its claims included) and stops and the
events it has to report, asking for grants; "runs" at once a run order its poll's answer granted
(a one-node attempt's) if it acts on the answer within GRANT_FRESH_SECONDS, and asks to start
every other new run order (POST start/, beside its polls, one request at a time); "runs" what
is granted for the job's runtime (its command is `sleep S`), with a log tail every 15 s; reports
by POST report/ what happens while its poll waits; keeps every event until the portal
acknowledged it and sends it again if not; backs off (up to 10 s) after a failure and registers
again on a 401. A stop order is obeyed after a short simulated checkpoint (0.2-1 s, within the
share's grace; SIGKILL's -9 past it): the exit is reported with `signalled: true`. Each agent
has its own kept-alive connections, as a real one.

The workload: 8 client coroutines (two per share, each with its team's user token) submit over
POST /api/v1/jobs/ to four shares of the cluster's GPUs. train (LEND, 35 %) and serve (LEND,
25 %) are owners that submit in waves: for half of each --wave seconds their demand is their
whole limit, for the other half a fifth of it (serve half a wave after train), so every half wave
one of them reclaims the GPUs it lent by preempting borrowers. research (LEND_AND_BORROW, 25 %,
borrow_limit 100 %) and batch (LEND_AND_BORROW, 15 %, no cap) are borrowers that keep 50 % and
60 % of the cluster's GPUs submitted, and so fill whatever is idle. Jobs take 1-64 GPUs (up to 8
whole nodes) at N=250; at larger N the whole-node jobs span N/250 times as many nodes
(--job-scale auto), so that the jobs and submits are about as many at every N and what grows is
the agents' own traffic (with --job-scale 1 the sizes stay, and a large cluster takes more
submits to fill than a small server may answer in --warmup). An owner's job runs 0.25-0.75
waves, a borrower's 1-3 waves (resumed where it was preempted). Nothing is cancelled.

Once every agent is registered, the clients fill the cluster: the window starts when 90 % of its
GPUs are busy (after 10 s at least, --warmup s at most; the output says whether it filled). The
figures are those of the next --seconds (then submits stop, and the agents poll 15 s more for the
last stop orders):

- web peak RSS: the sum over uvicorn's processes (shared pages count in each), sampled with
  psutil every 0.25 s while the server runs;
- PostgreSQL connections: the peak of pg_stat_activity's rows for the scratch database, of those
  not idle (in use) and of those waiting on a lock, sampled every 0.25 s while the server runs
  (the bench's own sampling and vacuum connections left out);
- stop order → agent: for each node of each attempt whose stop_requested_at falls in the window,
  the moment its agent read the stop order in a poll answer minus stop_requested_at (which the
  cycle writes in its transaction, before the commit: the figure includes the rest of that
  cycle); "from the commit": minus the time of the cycle's "cycle: placed ..." log line, which
  it writes right after its commit and its wake-ups (so it can be a few ms below zero); a node
  whose agent had ended the attempt there before the stop was ordered (its process exited, as
  a gang's nodes do one by one at its end) has no stop to hear and is not counted; any other
  node whose agent never read the stop is "never received"; an attempt preempted before any
  agent was granted its start, which the cycle ended at once (started_at unset, ended_at equal
  to stop_requested_at), had no stop order to hear: it is counted apart ("ended at once");
- submit latency p50 / p99 of the submits sent in the window (refused ones included);
- placing cycle: median and max over the cycles in the window that placed a job, each from when
  it could take the cycle lock (its Celery task's start, the worker's "succeeded in" line minus
  the runtime it gives, or the end of the cycle before it if that was later: two worker
  processes take turns) to its "cycle: placed" line after the commit; with the wait for the lock
  on the run's own line;
- errors: every non-2xx answer, exception and timeout of every request of the run (registration
  and filling included), by endpoint and kind;
- and: GPUs busy (mean over the window, of the simulated jobs running), jobs, attempts placed,
  preemptions, stop orders received and never received, the lag of this process's event loop
  (it delays every time the bench takes), WARNING/ERROR lines of the server's logs, CPU seconds
  of each part in the window. --keep keeps the logs and each stop order's times (stops.csv).

The baseline is the smallest N of the same invocation: the table gives each figure at every N
and its ratio to the smallest N's; beside them the goals at N=2000, judged when N=2000 ran.
With --runs R each figure is the median of R runs (each printed too); the default is one run.
Needs PostgreSQL (BENCH_ADMIN_DATABASE_URL, default postgres://postgres@127.0.0.1:5432/postgres)
and Redis; on a PostgreSQL server whose autovacuum is off, VACUUM (ANALYZE) runs every 30 s in its
place, as in bench/soak.py, and the output says so.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import math
import os
import random
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import psutil
import uvloop

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import soak  # noqa: E402

from portal import server  # noqa: E402
from scheduler.agent.core import (  # noqa: E402
    GRANT_FRESH_SECONDS,
    LOG_EVERY_SECONDS,
    REPORT_WAIT_SECONDS,
    Backoff,
)
from scheduler.agent.gpus import fake_gpus  # noqa: E402
from scheduler.agent.protocol import (  # noqa: E402
    ANSWER_SECONDS,
    END_EXIT,
    END_NEVER_STARTED,
    EVENT_EXITED,
    EVENT_LOG,
    LOG_TAIL_CHARS,
    POLL_ANSWER_SECONDS,
    POLL_PATH,
    REGISTER_PATH,
    REPORT_PATH,
    START_PATH,
)

# soak.py's database helpers take the database's name from its module: this bench's own.
DB_NAME = os.environ.get("AGENTS_DATABASE", "portal_agents")
soak.DB_NAME = DB_NAME
REDIS_URL = os.environ.get("AGENTS_REDIS_URL", "redis://127.0.0.1:6379/15")
JOIN_TOKEN = "agents-bench-join-token-0123456789"
SECRET_KEY = "agents-bench-secret-key-not-for-production-use-0123456789"
JOBS_PATH = "/api/v1/jobs/"

GPU_TYPE = "h100"
GPUS_PER_NODE = 8
POLL_WAIT_SECONDS = 20.0  # what each agent asks for; the portal caps it
REGISTER_AT_ONCE = 64
KEEPALIVE_SECONDS = 60.0  # below uvicorn's 75 s, so the server never closes a connection under us
CHECKPOINT_SECONDS = (0.2, 1.0)  # how long a stopped job takes to exit
DRAIN_SECONDS = 15.0  # after the window: the agents keep polling for its last stop orders
SAMPLE_SECONDS = 0.25
BENCH_APPLICATION = "bench-agents"  # application_name of the bench's own connections
# The agents stand for machines of their own: the bench runs at a higher priority than the
# server's processes (started at the usual one), so that the moments it reads (a stop order's
# receipt, a submit's answer) wait on its own work, not on a CPU the server or others hold.
BENCH_NICENESS = -5

# Job sizes at SIZES_AGENTS agents: (GPUs, nodes, weight). With --job-scale auto a whole-node job
# spans N/SIZES_AGENTS times as many nodes at N agents, so that the number of jobs (and of
# submits, and the cycle's queue) stays about the same at every N, and what grows with N is the
# agents' own traffic; with --job-scale 1 every N gets these sizes (more jobs at larger N).
SIZES = ((1, 1, 4), (2, 1, 4), (4, 1, 7), (8, 1, 35), (16, 2, 20), (32, 4, 18), (64, 8, 12))
SIZES_AGENTS = 250
# The window starts once this fraction of the GPUs is busy (after MIN_WARMUP_SECONDS at least,
# after --warmup at most).
FILLED = 0.9
MIN_WARMUP_SECONDS = 10.0
OWNER_LOW = 0.2  # an owner's demand outside its wave, as a fraction of its limit
CLIENTS_PER_SHARE = 2
# A job's log: a line a second, of which the agent sends the last LOG_TAIL_CHARS.
LOG_LINE = "step 001234 loss 1.2345 lr 3.0e-04 grad 0.98 tokens/s 123456\n"
LOG_TEXT = LOG_LINE * (LOG_TAIL_CHARS // len(LOG_LINE) + 1)


@dataclass(frozen=True)
class ShareSpec:
    name: str
    strategy: str
    fraction: float  # its limit, as a fraction of the cluster's GPUs
    grace: int
    borrow_limit: int = -1  # percent of the limit; -1: no cap (LEND_AND_BORROW only)
    wave_phase: float | None = None  # an owner: where in the wave it starts
    demand: float = 0.0  # a borrower: GPUs kept submitted, as a fraction of the cluster's

    def limit(self, capacity: int) -> int:
        return max(1, round(self.fraction * capacity))

    def runtime(self, rng: random.Random, wave: float) -> float:
        low, high = (0.25, 0.75) if self.wave_phase is not None else (1.0, 3.0)
        return round(rng.uniform(low, high) * wave, 1)


SHARES = (
    ShareSpec("train", "LEND", 0.35, grace=2, wave_phase=0.0),
    ShareSpec("serve", "LEND", 0.25, grace=2, wave_phase=0.5),
    ShareSpec("research", "LEND_AND_BORROW", 0.25, grace=2, borrow_limit=100, demand=0.5),
    ShareSpec("batch", "LEND_AND_BORROW", 0.15, grace=1, demand=0.6),
)

# The table: key, label, unit. Then the goals at GOAL_AGENTS: key, comparison, value.
FIGURES = (
    ("web rss", "web peak RSS", "MiB"),
    ("pg connections", "PostgreSQL connections, peak", ""),
    ("pg active", "  of them in use (not idle), peak", ""),
    ("stop p50", "stop order → agent p50", "ms"),
    ("stop p99", "stop order → agent p99", "ms"),
    ("commit p50", "  from the cycle's commit p50", "ms"),
    ("commit p99", "  from the cycle's commit p99", "ms"),
    ("submit p50", "submit latency p50", "ms"),
    ("submit p99", "submit latency p99", "ms"),
    ("cycle median", "placing cycle median", "s"),
    ("cycle max", "placing cycle max", "s"),
    ("errors", "errors (non-2xx, exceptions, timeouts)", ""),
    ("busy", "GPUs busy (mean)", "%"),
    ("preemptions", "preemptions (attempts PREEMPTED)", ""),
    ("stops", "stop orders received (per node)", ""),
    ("lag p99", "bench event loop lag p99", "ms"),
)
GOAL_AGENTS = 2000
GOALS = {
    "errors": ("<=", 0),
    "stop p99": ("<=", 1000.0),
    "pg connections": ("<=", 40),
    "web rss": ("<=", 1024.0),
    "cycle max": ("<=", 0.5),
}
# Judged on the worst of the runs; the others on their median.
WORST = {"web rss", "pg connections", "pg active", "errors"}


def median(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else math.nan


# --- The simulated agent -----------------------------------------------------------------------


@dataclass
class SimProcess:
    """A job "running" on a simulated agent: timers instead of a process."""

    attempt: int
    job: int
    gpus: int
    started: float  # loop time
    exit_timer: asyncio.TimerHandle | None = None
    log_timer: asyncio.TimerHandle | None = None
    term_sent_at: float | None = None


class SimAgent:
    """One node agent, as scheduler.agent.core.Agent behaves: the poller's long polls, the main
    thread's work (applying an answer, starting and stopping) one at a time under `main`, the
    starter's requests to start (one at a time, beside the polls; the claims that come while
    one is on its way go with the next), and the reporter's reports of what happens while the
    poll waits."""

    def __init__(self, run: Run, name: str) -> None:
        self.run = run
        self.name = name
        self.loop = asyncio.get_running_loop()
        self.session: aiohttp.ClientSession | None = None
        self.headers: dict[str, str] = {}
        self.processes: dict[int, SimProcess] = {}
        self.finished: set[int] = set()  # attempts done here; never started again
        self.claims: dict[int, dict] = {}  # run orders to ask to start (attempt → order)
        self.starter: asyncio.Task | None = None  # the request to start on its way
        self.outbox: list[dict] = []  # events not yet acknowledged by the portal, in order
        self.in_flight: set[int] = set()  # id() of the outbox events a request carries now
        self.outbox_filled = asyncio.Event()
        self.poll_due = False  # an answer is being applied: the next poll carries the events
        self.poll_sent = asyncio.Event()  # set when poll_due ends
        self.main = asyncio.Lock()
        self.claim_backoff = Backoff()
        self.report_backoff = Backoff()
        self.claim_retry: asyncio.TimerHandle | None = None
        self.stops_seen: set[int] = set()

    async def live(self, gate: asyncio.Semaphore) -> None:
        connector = aiohttp.TCPConnector(limit=3, keepalive_timeout=KEEPALIVE_SECONDS)
        self.session = aiohttp.ClientSession(connector=connector, trace_configs=[self.run.trace])
        reporter = None
        try:
            async with gate:
                await self.register()
            self.run.registered += 1
            reporter = asyncio.create_task(self.reporter())
            await self.poller()
        finally:
            if reporter is not None:
                # Let it end before the session closes under it (asking again: a cancel that
                # lands as a wait_for inside it times out can be lost).
                while not reporter.done():
                    reporter.cancel()
                    await asyncio.wait({reporter}, timeout=1)
            if self.claim_retry is not None:
                self.claim_retry.cancel()
            for process in self.processes.values():
                for timer in (process.exit_timer, process.log_timer):
                    if timer is not None:
                        timer.cancel()
            await self.session.close()

    # --- Talking to the portal ---------------------------------------------------------------

    async def register(self) -> None:
        backoff = Backoff()
        body = {
            "join_token": JOIN_TOKEN,
            "name": self.name,
            "gpu_type": GPU_TYPE,
            "gpus": GPUS_PER_NODE,
            "gpu_details": [gpu.as_json() for gpu in fake_gpus(GPUS_PER_NODE, GPU_TYPE)],
            "asks_to_start": True,  # as the real agent: it starts only what is granted
        }
        while True:
            status, answer = await self.run.post(
                self.session, "register", REGISTER_PATH, body, timeout=ANSWER_SECONDS, ok=201
            )
            if status == 201 and answer is not None:
                self.headers = {"Authorization": f"Node {answer['token']}"}
                self.run.poll_wait_cap = answer.get("poll_wait_seconds")
                return
            if status is not None and 400 <= status < 500:
                raise SystemExit(f"registration refused ({status})")
            backoff.failed()
            await asyncio.sleep(backoff.delay)

    def _take_events(self) -> list[dict]:
        events = [e for e in self.outbox if id(e) not in self.in_flight]
        self.in_flight.update(id(e) for e in events)
        return events

    def _events_sent(self, events: list[dict], *, delivered: bool) -> None:
        ids = {id(e) for e in events}
        self.in_flight -= ids
        if delivered:
            self.outbox = [e for e in self.outbox if id(e) not in ids]

    def _poll_body(self, events: list[dict]) -> dict:
        pending = {e["attempt"] for e in self.outbox if e["type"] == EVENT_EXITED}
        stopping = {a for a, p in self.processes.items() if p.term_sent_at is not None}
        body = {
            "running": sorted(set(self.processes) | set(self.claims) | pending),
            "stopping": sorted(stopping | pending),
            "wait": POLL_WAIT_SECONDS,
            "grants": True,
        }
        if events:
            body["events"] = events
        return body

    async def poller(self) -> None:
        backoff = Backoff()
        while True:
            events = self._take_events()
            self.poll_due = False
            self.poll_sent.set()
            sent = time.time()
            status, answer = await self.run.post(
                self.session, "poll", POLL_PATH, self._poll_body(events),
                timeout=POLL_WAIT_SECONDS + POLL_ANSWER_SECONDS, headers=self.headers,
            )  # fmt: skip
            self._events_sent(events, delivered=status == 200 and "results" in (answer or {}))
            if status == 200 and answer is not None:
                self.run.results.update(answer.get("results", []))
            if status == 401:
                await self.register()
                continue
            if status != 200 or answer is None:
                backoff.failed()
                await asyncio.sleep(backoff.delay)
                continue
            backoff.succeeded()
            self._stops_received(answer.get("stop", []), sent, "poll")
            self.poll_due = True
            received = time.monotonic()
            async with self.main:
                await self.apply(answer, received)

    async def flush(self) -> None:
        if not self.report_backoff.ready():
            return
        events = self._take_events()
        if not events:
            return
        status, answer = await self.run.post(
            self.session, "report", REPORT_PATH, {"events": events}, timeout=ANSWER_SECONDS,
            headers=self.headers,
        )  # fmt: skip
        if status == 200:
            self.report_backoff.succeeded()
            self.run.results.update((answer or {}).get("results", []))
        else:
            self.report_backoff.failed()
            kinds = " ".join(f"{e['type']}:{e['attempt']}" for e in events)
            self.run.failed_reports.append((time.time(), self.name, kinds))
        self._events_sent(events, delivered=status == 200)

    async def reporter(self) -> None:
        """Report events as they come, unless a poll is about to carry them; events kept after a
        failure are tried again at least every REPORT_WAIT_SECONDS."""
        while True:
            if self.outbox:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.outbox_filled.wait(), REPORT_WAIT_SECONDS)
            else:
                await self.outbox_filled.wait()
            if self.poll_due:
                # The real reporter looks again every 10 ms; this one waits for the poll to go.
                self.poll_sent.clear()
                await self.poll_sent.wait()
                continue
            self.outbox_filled.clear()
            await self.flush()

    # --- Orders ------------------------------------------------------------------------------

    async def apply(self, orders: dict, received: float) -> None:
        # As the real agent: a grant it acts on too late (a lagging event loop here) is asked
        # for instead.
        fresh = time.monotonic() - received <= GRANT_FRESH_SECONDS
        granted = []
        for order in orders.get("run", []):
            attempt = order["attempt"]
            if attempt in self.processes or attempt in self.finished:
                continue
            if order.get("granted") and fresh:
                granted.append(order)
            else:
                self.claims[attempt] = order
        for order in orders.get("stop", []):
            self._stop(order)
        for order in granted:
            self.claims.pop(order["attempt"], None)
            self.start(order)
        self.claim()

    def _stop(self, order: dict) -> None:
        attempt = order["attempt"]
        self.claims.pop(attempt, None)
        process = self.processes.get(attempt)
        if process is not None:
            if process.term_sent_at is None:
                self.terminate(process, float(order.get("grace_seconds", 0)))
        elif attempt not in self.finished:
            self._end(attempt, end=END_NEVER_STARTED, detail="stopped before it started")

    def _stops_received(self, orders: list[dict], sent: float, via: str) -> None:
        """The stop orders an answer brought (`via` a poll, or a start for the attempts it
        refused), at their first receipt here, with when the request that brought them went."""
        received = time.time()
        for order in orders:
            if order["attempt"] not in self.stops_seen:
                self.stops_seen.add(order["attempt"])
                self.run.stop_received[order["attempt"], self.name] = (received, sent, via)

    def claim(self) -> None:
        """Hand the claims to the starter, unless its request is on its way (then they go with
        the next one)."""
        if self.starter is not None or not self.claims:
            return
        if not self.claim_backoff.ready():
            self._claim_later()
            return
        self.starter = self.run.spawn(self.ask_to_start(sorted(self.claims)))

    async def ask_to_start(self, attempts: list[int]) -> None:
        sent = time.time()
        status, answer = await self.run.post(
            self.session, "start", START_PATH, {"attempts": attempts}, timeout=ANSWER_SECONDS,
            headers=self.headers,
        )  # fmt: skip
        async with self.main:
            self.starter = None
            if status != 200 or answer is None:
                self.claim_backoff.failed()
                self._claim_later()
                return
            self.claim_backoff.succeeded()
            granted = set(answer.get("start", []))
            stops = [order for order in answer.get("stop", []) if order["attempt"] in attempts]
            self._stops_received(stops, sent, "start")
            stopped = {order["attempt"] for order in stops}
            for attempt in attempts:
                # None: its stop came meanwhile, and it never starts.
                order = self.claims.pop(attempt, None)
                if order is not None and attempt in granted:
                    self.start(order)
                elif order is not None and attempt not in stopped:
                    self.finished.add(attempt)  # it ended at the portal: nothing to report
            for order in stops:
                self._stop(order)
            self.claim()  # those that came meanwhile

    def _claim_later(self) -> None:
        """The real agent's main loop asks again at a later turn, once its backoff allows."""
        if self.claim_retry is None:
            self.claim_retry = self.loop.call_later(
                max(0.1, self.claim_backoff.next_try - time.monotonic()), self._claim_again
            )

    def _claim_again(self) -> None:
        self.claim_retry = None

        async def again() -> None:
            async with self.main:
                self.claim()

        self.run.spawn(again())

    def start(self, order: dict) -> None:
        attempt, job = order["attempt"], order["job"]
        seconds = self.run.remaining.get(job) or float(order["command"].split()[1])
        process = SimProcess(attempt, job, len(order["gpu_indices"]), self.loop.time())
        process.exit_timer = self.loop.call_later(seconds, self._exited, attempt, 0)
        process.log_timer = self.loop.call_later(LOG_EVERY_SECONDS, self._log, attempt)
        self.processes[attempt] = process
        self.run.started_on[attempt] += 1

    def terminate(self, process: SimProcess, grace: float) -> None:
        """SIGTERM: the job checkpoints and exits, or is killed when its grace is over."""
        process.term_sent_at = self.loop.time()
        process.exit_timer.cancel()
        checkpoint = self.run.rng.uniform(*CHECKPOINT_SECONDS)
        code = -15 if checkpoint <= grace else -9
        process.exit_timer = self.loop.call_later(
            min(checkpoint, grace), self._exited, process.attempt, code
        )

    def _exited(self, attempt: int, code: int) -> None:
        process = self.processes.pop(attempt, None)
        if process is None:
            return
        process.log_timer.cancel()
        ran = self.loop.time() - process.started
        signalled = process.term_sent_at is not None
        if signalled:
            self.run.job_stopped(process.job, attempt, ran)
        else:
            self.run.job_finished(process.job)
        self._end(attempt, end=END_EXIT, exit_code=code, signalled=signalled, log_tail=_tail(ran))

    def _log(self, attempt: int) -> None:
        process = self.processes.get(attempt)
        if process is None or process.term_sent_at is not None:
            return
        self._event(type=EVENT_LOG, attempt=attempt,
                    log_tail=_tail(self.loop.time() - process.started))  # fmt: skip
        process.log_timer = self.loop.call_later(LOG_EVERY_SECONDS, self._log, attempt)

    def _end(self, attempt: int, *, end: str, exit_code: int | None = None,
             signalled: bool = False, log_tail: str = "", detail: str = "") -> None:  # fmt: skip
        self.finished.add(attempt)
        self.run.ended_here.setdefault((attempt, self.name), time.time())
        self._event(type=EVENT_EXITED, attempt=attempt, end=end, exit_code=exit_code,
                    signalled=signalled, log_tail=log_tail, detail=detail)  # fmt: skip

    def _event(self, **event) -> None:
        self.outbox.append(event)
        self.outbox_filled.set()


def _tail(seconds_run: float) -> str:
    """The last LOG_TAIL_CHARS of a log that grows by a line a second."""
    length = min(LOG_TAIL_CHARS, int(seconds_run) * len(LOG_LINE))
    return LOG_TEXT[:length]


# --- One run: the server, the agents, the workload -----------------------------------------------


@dataclass
class Cycle:
    """One run of the worker's cycle task, as its log lines tell it (Unix times)."""

    start: float  # the task's start: its "succeeded in" line's time minus the runtime it gives
    end: float  # its "cycle: placed" line, right after the commit; else the task's end
    placed: int = 0
    preempted: int = 0
    logged: bool = False  # it wrote a "cycle: placed" line
    own: float = math.nan  # seconds from when it could take the cycle lock to its end


class Run:
    """One N, from an empty database to its figures."""

    def __init__(self, args: argparse.Namespace, agents: int, index: int) -> None:
        self.args = args
        self.agents = agents
        self.capacity = agents * GPUS_PER_NODE
        auto = args.job_scale == "auto"
        self.job_scale = max(1, agents // SIZES_AGENTS) if auto else int(args.job_scale)
        self.rng = random.Random(args.seed * 1_000_003 + agents * 101 + index)
        self.tmp = Path(tempfile.mkdtemp(prefix="portal-agents-"))
        self.port = soak.free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "DATABASE_URL": soak.database_url(None),
            "REDIS_URL": REDIS_URL,
            "PORTAL_ADDRESS": f"127.0.0.1:{self.port}",
            "DEBUG": "0",
            "SECRET_KEY": SECRET_KEY,
            "SECURE_SSL_REDIRECT": "0",
            "WEB_WORKERS": "2",
            "DATABASE_POOL_SIZE": "8",
            "LOG_FORMAT": "json",
            "PORTAL_VAR_DIR": str(self.tmp / "var"),
            "DJANGO_SETTINGS_MODULE": "portal.settings",
            "PYTHONUNBUFFERED": "1",
        }
        if args.heartbeat_timeout:
            self.env["NODE_HEARTBEAT_TIMEOUT_SECONDS"] = str(args.heartbeat_timeout)
        self.processes: dict[str, subprocess.Popen] = {}
        self.sampler: Sampler | None = None
        self.tokens: dict[str, str] = {}
        # Filled by the agents and clients (all on the event loop).
        self.registered = 0
        self.poll_wait_cap: float | None = None
        self.errors: Counter[str] = Counter()
        self.results: Counter[str] = Counter()  # what the portal answered for each event
        self.connections: Counter[str] = Counter()  # the agents' connections: opened, reused
        self.trace = aiohttp.TraceConfig()
        self.trace.on_connection_create_end.append(self._count("opened"))
        self.trace.on_connection_reuseconn.append(self._count("reused"))
        self.job_states: dict[str, int] = {}
        self.error_samples: dict[str, str] = {}
        # (attempt, node) → (when its agent read the stop order, when it sent that poll)
        self.stop_received: dict[tuple[int, str], tuple[float, float, str]] = {}
        # With --keep: each report that failed (when, node, its events' types and attempts),
        # and on how many nodes each attempt started (a gang's are many).
        self.failed_reports: list[tuple[float, str, str]] = []
        self.started_on: Counter[int] = Counter()
        # When each node's agent ended each attempt there (its process exited, or it never
        # started): a stop ordered after that has nothing to stop on that node.
        self.ended_here: dict[tuple[int, str], float] = {}
        self.submits: list[tuple[float, float]] = []  # (sent at, seconds)
        self.jobs: dict[int, tuple[str, int]] = {}  # open jobs: id → (share, GPUs)
        self.remaining: dict[int, float] = {}  # job → seconds it still has to run
        self.stopped_attempts: set[int] = set()
        self.outstanding = {share.name: 0 for share in SHARES}  # GPUs submitted, not finished
        self.sending = {share.name: 0 for share in SHARES}  # GPUs of submits on the way
        self.accepted = 0
        self.submitting = True
        self.lags: list[tuple[float, float]] = []
        self.busy: list[tuple[float, float]] = []
        self.crashes: list[str] = []
        self.tasks: set[asyncio.Task] = set()
        self.window = (math.nan, math.nan)
        self.cpu: dict[str, float] = {}
        self.agent_set: list[SimAgent] = []
        self.t_ready = math.nan
        self.t_end = math.inf  # the agents stopped: later log lines are the shutdown's
        self.registration_seconds = math.nan
        self.fill_seconds = math.nan
        self.filled = False
        self.never_received: list[int] = []

    # --- HTTP ----------------------------------------------------------------------------------

    async def post(
        self, session, endpoint: str, path: str, body: dict, *, timeout: float,
        headers: dict | None = None, ok: int = 200,
    ) -> tuple[int | None, dict | None]:  # fmt: skip
        """POST JSON; counts every answer but `ok` and every failure to get one as an error."""
        try:
            async with session.post(
                self.url + path, json=body, headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as response:  # fmt: skip
                status = response.status
                content = await response.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            self.error(endpoint, type(error).__name__, str(error))
            return None, None
        if status != ok:
            self.error(endpoint, str(status), content[:300].decode(errors="replace"))
        try:
            return status, json.loads(content)
        except ValueError:
            if status == ok:
                self.error(endpoint, "not JSON", content[:300].decode(errors="replace"))
            return status, None

    def _count(self, what: str):
        async def count(*_args) -> None:
            self.connections[what] += 1

        return count

    def error(self, endpoint: str, kind: str, sample: str) -> None:
        key = f"{endpoint} {kind}"
        self.errors[key] += 1
        self.error_samples.setdefault(key, sample)

    def spawn(self, coroutine) -> asyncio.Task:
        """A task kept until it ends; one that fails is counted as a crash of the bench."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.crashes.append(repr(task.exception()))

    # --- The workload --------------------------------------------------------------------------

    def demand(self, share: ShareSpec, now: float) -> float:
        """GPUs the share wants submitted now."""
        if share.wave_phase is None:
            return share.demand * self.capacity
        phase = ((now - self.t_ready) / self.args.wave + share.wave_phase) % 1.0
        return share.limit(self.capacity) * (1.0 if phase < 0.5 else OWNER_LOW)

    def job_size(self) -> tuple[int, int]:
        """GPUs and nodes of a job: SIZES, whole-node jobs grown with the cluster, none on more
        than an eighth of its nodes."""
        scale = self.job_scale
        sizes = [
            (gpus * scale, nodes * scale, weight)
            if nodes > 1 or gpus == GPUS_PER_NODE
            else (gpus, nodes, weight)
            for gpus, nodes, weight in SIZES
        ]
        sizes = [size for size in sizes if size[1] <= max(1, self.agents // 8)]
        ((gpus, nodes, _),) = self.rng.choices(sizes, [weight for *_, weight in sizes])
        return gpus, nodes

    async def client(self, share: ShareSpec, number: int) -> None:
        headers = {"Authorization": f"Token {self.tokens[share.name]}"}
        async with aiohttp.ClientSession(headers=headers) as session:
            while self.submitting:
                wanted = self.demand(share, time.time())
                if self.outstanding[share.name] + self.sending[share.name] >= wanted:
                    await asyncio.sleep(0.25)
                    continue
                gpus, nodes = self.job_size()
                seconds = share.runtime(self.rng, self.args.wave)
                body = {
                    "share": share.name,
                    "gpu_type": GPU_TYPE,
                    "gpus": gpus,
                    "nodes": nodes,
                    "command": f"sleep {seconds:g}",
                    "name": f"{share.name}-{number}-{len(self.submits)}",
                }
                self.sending[share.name] += gpus
                sent_at, began = time.time(), time.perf_counter()
                status, answer = await self.post(session, "submit", JOBS_PATH, body, timeout=60,
                                                 ok=201)  # fmt: skip
                self.submits.append((sent_at, time.perf_counter() - began))
                self.sending[share.name] -= gpus
                if status == 201 and answer is not None:
                    self.accepted += 1
                    self.jobs[answer["id"]] = (share.name, gpus)
                    self.remaining[answer["id"]] = seconds
                    self.outstanding[share.name] += gpus
                else:
                    await asyncio.sleep(1.0)

    def job_finished(self, job: int) -> None:
        """A node of the job's attempt ran it to its end (the first of a gang's counts)."""
        entry = self.jobs.pop(job, None)
        self.remaining.pop(job, None)
        if entry is not None:
            share, gpus = entry
            self.outstanding[share] -= gpus

    def job_stopped(self, job: int, attempt: int, ran: float) -> None:
        """Preempted after `ran` seconds: the job resumes from its checkpoint."""
        if attempt not in self.stopped_attempts and job in self.remaining:
            self.stopped_attempts.add(attempt)
            self.remaining[job] = max(1.0, self.remaining[job] - ran)

    async def monitor(self) -> None:
        """The event loop's lag every 0.1 s, and the GPUs busy every second."""
        loop = asyncio.get_running_loop()
        next_busy = loop.time()
        while True:
            before = loop.time()
            await asyncio.sleep(0.1)
            now = loop.time()
            self.lags.append((time.time(), now - before - 0.1))
            if now >= next_busy:
                next_busy = now + 1.0
                busy = sum(p.gpus for agent in self.agent_set for p in agent.processes.values()
                           if p.term_sent_at is None)  # fmt: skip
                self.busy.append((time.time(), busy / self.capacity))

    async def drive(self) -> None:
        """Register the agents, fill the cluster, measure the window, drain."""
        gate = asyncio.Semaphore(REGISTER_AT_ONCE)
        self.agent_set = [SimAgent(self, f"node-{i:04d}") for i in range(self.agents)]
        for agent in self.agent_set:
            self.spawn(agent.live(gate))
        self.spawn(self.monitor())
        began = time.monotonic()
        while self.registered < self.agents:
            if self.crashes:
                raise SystemExit(f"the bench failed: {self.crashes[0]}")
            if time.monotonic() - began > 120 + self.agents / 10:
                raise SystemExit(f"only {self.registered} of {self.agents} agents registered")
            await asyncio.sleep(0.2)
        self.t_ready = time.time()
        self.registration_seconds = time.monotonic() - began
        for share in SHARES:
            for number in range(CLIENTS_PER_SHARE):
                self.spawn(self.client(share, number))
        filling = time.monotonic()
        await asyncio.sleep(MIN_WARMUP_SECONDS)
        while time.monotonic() - filling < self.args.warmup and (
            not self.busy or self.busy[-1][1] < FILLED
        ):
            await asyncio.sleep(0.5)
        self.fill_seconds = time.monotonic() - filling
        self.filled = bool(self.busy) and self.busy[-1][1] >= FILLED
        print(f"  {self.agents} agents registered in {self.registration_seconds:.1f} s; "
              f"{'filled' if self.filled else 'not filled'} in {self.fill_seconds:.0f} s; "
              f"{self.args.seconds:.0f} s measured", flush=True)  # fmt: skip
        start = time.time()
        cpu_start = self.cpu_times()
        await asyncio.sleep(self.args.seconds)
        end = time.time()
        cpu_end = self.cpu_times()
        self.window = (start, end)
        self.cpu = {part: cpu_end[part] - cpu_start[part] for part in cpu_start}
        self.submitting = False
        await asyncio.sleep(DRAIN_SECONDS)
        self.t_end = time.time()
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)

    # --- The server ----------------------------------------------------------------------------

    def start_server(self) -> None:
        """`gpu-portal-server serve`, one process at a time: setup, then web, worker and beat."""
        soak.create_database()
        import redis

        redis.Redis.from_url(REDIS_URL).flushdb()
        with open(self.tmp / "setup.log", "wb") as log:
            setup = [*LAUNCHER, sys.executable, "-m", "portal.server", "setup"]
            subprocess.run(setup, env=self.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                           check=True)  # fmt: skip
        self.populate()
        self.sampler = Sampler(self)
        self.sampler.start()
        for name, argv in server.commands(self.env).items():
            log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 — closed with the process
            self.processes[name] = subprocess.Popen(
                [*LAUNCHER, *argv], env=self.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
            )
            self.sampler.watch(name, self.processes[name].pid)
            if name == "web" and not server.wait_until_answering(f"{self.url}/health/"):
                raise SystemExit(f"the web server did not answer; see {self.tmp / 'web.log'}")

    def populate(self) -> None:
        """The join token, and per share a team, a member with a token, and the share."""
        from django.contrib.auth import get_user_model
        from django.db import connections
        from rest_framework.authtoken.models import Token

        from scheduler.models import ClusterSettings
        from shares.models import Membership, Team
        from shares.services import share_create

        ClusterSettings.objects.update_or_create(pk=1, defaults={"agent_join_token": JOIN_TOKEN})
        for share in SHARES:
            team = Team.objects.create(name=share.name, slug=share.name)
            user = get_user_model().objects.create_user(f"{share.name}-user")
            Membership.objects.create(team=team, user=user)
            extra = {"grace_seconds": share.grace}
            if share.strategy == "LEND_AND_BORROW":
                extra["borrow_limit"] = share.borrow_limit
            limits = {GPU_TYPE: share.limit(self.capacity)}
            share_create(
                name=share.name, team=team, strategy=share.strategy, capacity_limits=limits, **extra
            )
            self.tokens[share.name] = Token.objects.create(user=user).key
        connections.close_all()

    def stop_server(self) -> None:
        children = []
        for process in self.processes.values():
            with contextlib.suppress(psutil.NoSuchProcess):
                children += psutil.Process(process.pid).children(recursive=True)
            if process.poll() is None:
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        # uvicorn's and Celery's worker processes too, should one outlive its parent.
        _, alive = psutil.wait_procs(children, timeout=5)
        for child in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        if self.sampler is not None:
            self.sampler.close()

    def cpu_times(self) -> dict[str, float]:
        parts = {"web": 0.0, "worker and beat": 0.0}
        for name, process in self.processes.items():
            part = "web" if name == "web" else "worker and beat"
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(process.pid)
                for p in [root, *root.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        parts[part] += soak.process_cpu(p)
        bench = os.times()
        parts["bench (agents and clients)"] = bench.user + bench.system
        parts["PostgreSQL (all databases)"] = soak.postgres_cpu()
        machine = psutil.cpu_times()
        busy = ("user", "system", "nice", "irq", "softirq")
        parts["machine"] = sum(getattr(machine, name, 0.0) for name in busy)
        return parts

    # --- Figures -------------------------------------------------------------------------------

    def figures(self) -> dict[str, float]:
        from django.db import connections
        from django.db.models import Count

        from scheduler.models import Job, JobAttempt

        start, end = self.window
        window = (datetime.fromtimestamp(start, UTC), datetime.fromtimestamp(end, UTC))
        stops = list(
            JobAttempt.objects.filter(stop_requested_at__gte=window[0],
                                      stop_requested_at__lt=window[1])
            .values_list("pk", "stop_requested_at", "allocations", "started_at", "ended_at")
        )  # fmt: skip
        placed = JobAttempt.objects.filter(
            scheduled_at__gte=window[0], scheduled_at__lt=window[1]
        ).count()
        preempted = JobAttempt.objects.filter(
            outcome=JobAttempt.Outcome.PREEMPTED, ended_at__gte=window[0], ended_at__lt=window[1]
        ).count()
        self.job_states = dict(
            Job.objects.values_list("state").annotate(n=Count("pk")).order_by("state")
        )
        connections.close_all()

        cycles = worker_cycles(self.tmp / "worker.log")
        commits = sorted(c.end for c in cycles if c.preempted)
        latencies, from_commit, never, later_poll, by_start, samples = [], [], [], 0, 0, []
        ended_before = ended_at_once = 0
        for attempt, stop_at, allocations, started_at, ended_at in stops:
            if started_at is None and ended_at == stop_at:
                # Preempted before any agent was granted its start: the cycle ended it at once
                # (scheduler.cycle.apply._end_unstarted); there is no stop order to hear.
                ended_at_once += 1
                continue
            ordered = stop_at.timestamp()
            following = bisect.bisect_left(commits, ordered)
            commit = commits[following] if following < len(commits) else math.nan
            for allocation in allocations:
                receipt = self.stop_received.get((attempt, allocation["node"]))
                if receipt is None:
                    ended = self.ended_here.get((attempt, allocation["node"]))
                    if ended is not None and ended < ordered:
                        ended_before += 1  # its process there had ended: nothing to stop
                    else:
                        never.append(attempt)
                    continue
                received, sent, via = receipt
                latencies.append(received - ordered)
                if not math.isnan(commit):
                    from_commit.append(received - commit)
                # The agent was not waiting in a poll when the stop was committed (it was busy
                # with its previous answer: its start request, say).
                later_poll += via == "poll" and sent > (ordered if math.isnan(commit) else commit)
                by_start += via == "start"
                samples.append((attempt, allocation["node"], ordered, commit, sent, received, via))
        if self.args.keep:
            with open(self.tmp / "stops.csv", "w") as dump:
                dump.write("attempt,node,stop_requested_at,commit_logged_at,sent,received,via\n")
                dump.writelines(",".join(map(str, sample)) + "\n" for sample in samples)
            with open(self.tmp / "failed_reports.csv", "w") as dump:
                dump.write("at,node,events (type:attempt),nodes its attempts started on\n")
                for at, node, kinds in self.failed_reports:
                    attempts = {int(kind.split(":")[1]) for kind in kinds.split()}
                    nodes = " ".join(str(self.started_on[a]) for a in sorted(attempts))
                    dump.write(f"{at},{node},{kinds},{nodes}\n")
        placing = [c for c in cycles if c.placed and start <= c.end < end]
        own = [c.own for c in placing]
        waited = [c.end - c.start for c in placing]
        submits = [seconds for sent, seconds in self.submits if start <= sent < end]
        lags = [lag for at, lag in self.lags if start <= at < end]
        busy = [fraction for at, fraction in self.busy if start <= at < end]
        peaks = self.sampler.peaks
        self.never_received = sorted(set(never))
        return {
            "web rss": peaks["web rss"] / 2**20,
            "worker rss": peaks["worker rss"] / 2**20,
            "pg connections": peaks["pg connections"],
            "pg active": peaks["pg active"],
            "pg lock waits": peaks["pg lock waits"],
            "stop p50": soak.percentile(latencies, 0.5) * 1000,
            "stop p99": soak.percentile(latencies, 0.99) * 1000,
            "stop max": max(latencies, default=math.nan) * 1000,
            "commit p50": soak.percentile(from_commit, 0.5) * 1000,
            "commit p99": soak.percentile(from_commit, 0.99) * 1000,
            "submit p50": soak.percentile(submits, 0.5) * 1000,
            "submit p99": soak.percentile(submits, 0.99) * 1000,
            "submits": len(submits),
            "cycle median": median(own),
            "cycle max": max(own, default=math.nan),
            "cycle with lock wait median": median(waited),
            "cycle with lock wait max": max(waited, default=math.nan),
            "placing cycles": len(placing),
            "errors": sum(self.errors.values()),
            "busy": 100 * statistics.fmean(busy) if busy else math.nan,
            "placed": placed,
            "preemptions": preempted,
            "stops": len(latencies),
            "never received": len(never),
            "ended before": ended_before,
            "ended at once": ended_at_once,
            "later poll": later_poll,
            "by start": by_start,
            "lag p99": soak.percentile(lags, 0.99) * 1000,
            "lag max": max(lags, default=math.nan) * 1000,
        }

    def log_problems(self) -> list[str]:
        """WARNING and worse lines of the server's logs until the agents stopped: a count by
        process and level, and the first message of each."""
        lines = []
        for name in self.processes:
            levels: Counter[str] = Counter()
            first: dict[str, str] = {}
            for entry in json_lines(self.tmp / f"{name}.log"):
                if datetime.fromisoformat(entry["time"]).timestamp() > self.t_end:
                    break
                level = entry.get("level", "")
                if level in ("WARNING", "ERROR", "CRITICAL"):
                    levels[level] += 1
                    first.setdefault(level, f"{entry.get('logger')}: {entry.get('message')}"[:240])
            for level, count in sorted(levels.items()):
                lines.append(f"{name} log: {count} {level} line(s), the first: {first[level]}")
        return lines


def json_lines(path: Path):
    """The JSON objects of a log, one a line (other lines skipped)."""
    with contextlib.suppress(FileNotFoundError), open(path, errors="replace") as log:
        for line in log:
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    yield json.loads(line)


CYCLE_LINE = re.compile(r"cycle: placed (\d+), preempted (\d+)")
TASK_LINE = re.compile(r"Task scheduler\.tasks\.cycle\[[^\]]*\] succeeded in ([0-9.e+-]+)s")


def worker_cycles(path: Path) -> list[Cycle]:
    """Every cycle task of the worker's log, in the order they ended. Cycles take one lock, so
    a cycle that started while another ran waited for it: its own time runs from the end of the
    one before it (or from its start, if later) to its end."""
    cycles: list[Cycle] = []
    logged: dict[int, tuple[float, int, int]] = {}  # worker process → its last cycle's line
    for entry in json_lines(path):
        message = entry.get("message", "")
        at = datetime.fromisoformat(entry["time"]).timestamp()
        if match := CYCLE_LINE.match(message):
            logged[entry.get("process")] = (at, int(match[1]), int(match[2]))
        elif match := TASK_LINE.match(message):
            cycle = Cycle(start=at - float(match[1]), end=at)
            if (line := logged.pop(entry.get("process"), None)) is not None:
                cycle.end, cycle.placed, cycle.preempted = line
                cycle.logged = True
            cycles.append(cycle)
    cycles.sort(key=lambda c: c.end)
    previous_end = -math.inf
    for cycle in cycles:
        cycle.own = cycle.end - max(cycle.start, previous_end)
        previous_end = cycle.end
    return cycles


class Sampler(threading.Thread):
    """Peak RSS of the web server's processes and of the worker's and beat's, and peak
    connections to the scratch database, every SAMPLE_SECONDS; VACUUM (ANALYZE) every 30 s on a
    thread of its own where the server's autovacuum is off."""

    TREE_SECONDS = 5.0  # how often the process trees are listed again (a scan of all of /proc)

    def __init__(self, run: Run) -> None:
        super().__init__(name="sampler", daemon=True)
        self.stop = threading.Event()
        self.roots: dict[str, int] = {}
        self.peaks = {"web rss": 0, "worker rss": 0, "pg connections": 0, "pg active": 0,
                      "pg lock waits": 0}  # fmt: skip
        self.lock_waits: Counter[str] = Counter()  # statements seen waiting on a lock
        self.vacuums: int | None = None if soak.autovacuum_on() else 0
        self.vacuum_thread = threading.Thread(target=self.vacuumer, name="vacuumer", daemon=True)

    def watch(self, name: str, pid: int) -> None:
        self.roots[name] = pid

    def close(self) -> None:
        self.stop.set()
        self.join()
        if self.vacuum_thread.is_alive():
            self.vacuum_thread.join()

    def run(self) -> None:
        import psycopg

        if self.vacuums is not None:
            self.vacuum_thread.start()
        url = soak.database_url(None)
        trees: dict[str, list[psutil.Process]] = {}
        listed = -math.inf
        with psycopg.connect(url, autocommit=True, application_name=BENCH_APPLICATION) as db:
            while not self.stop.wait(SAMPLE_SECONDS):
                if time.monotonic() - listed >= self.TREE_SECONDS:
                    trees = {name: process_tree(pid) for name, pid in dict(self.roots).items()}
                    listed = time.monotonic()
                rss = {name: sum(rss_of(p) for p in tree) for name, tree in trees.items()}
                web = rss.pop("web", 0)
                self.peaks["web rss"] = max(self.peaks["web rss"], web)
                self.peaks["worker rss"] = max(self.peaks["worker rss"], sum(rss.values()))
                row = db.execute(
                    "SELECT count(*), count(*) FILTER (WHERE state <> 'idle'),"
                    " count(*) FILTER (WHERE wait_event_type = 'Lock') FROM pg_stat_activity"
                    " WHERE datname = %s AND application_name <> %s",
                    [DB_NAME, BENCH_APPLICATION],
                ).fetchone()
                for key, value in zip(("pg connections", "pg active", "pg lock waits"), row,
                                      strict=True):  # fmt: skip
                    self.peaks[key] = max(self.peaks[key], value)
                if row[2]:
                    self.lock_waits.update(
                        query for (query,) in db.execute(
                            "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 90)"
                            " FROM pg_stat_activity WHERE datname = %s"
                            " AND wait_event_type = 'Lock'", [DB_NAME],
                        )
                    )  # fmt: skip

    def vacuumer(self) -> None:
        """Stands in for autovacuum, as bench/soak.py's Soak.vacuumer does (see there why)."""
        import psycopg

        url = soak.database_url(None)
        with psycopg.connect(url, autocommit=True, application_name=BENCH_APPLICATION) as db:
            while not self.stop.wait(soak.AUTOVACUUM_STANDIN_SECONDS):
                db.execute("VACUUM (ANALYZE)")
                self.vacuums += 1


def process_tree(pid: int) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    return []


def rss_of(process: psutil.Process) -> int:
    try:
        return process.memory_info().rss
    except psutil.Error:
        return 0


# What starts the server's processes: `nice` back to the usual priority when the bench raised
# its own (`nice` execs the command, which keeps its pid).
LAUNCHER: list[str] = []


def raise_priority() -> bool:
    """Run the bench at BENCH_NICENESS (needs root or CAP_SYS_NICE); False if it cannot."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, BENCH_NICENESS)
    except OSError:
        return False
    LAUNCHER[:] = ["nice", "-n", str(-BENCH_NICENESS)]
    return True


def setup_django(env: dict[str, str]) -> None:
    """Django in this process, for setting up each database and reading it after the run:
    without a pool (a pool would keep connections to the database the next run drops)."""
    from django.apps import apps

    if apps.ready:
        return
    os.environ.update({k: v for k, v in env.items() if k != "PYTHONUNBUFFERED"})
    os.environ["DATABASE_POOL_SIZE"] = "0"
    import django

    django.setup()


def drop_database() -> None:
    import psycopg

    with contextlib.suppress(Exception):
        from django.db import connections

        connections.close_all()
    with psycopg.connect(soak.ADMIN_URL, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')


def run_once(args: argparse.Namespace, agents: int, index: int) -> tuple[dict, Run]:
    run = Run(args, agents, index)
    setup_django(run.env)
    try:
        run.start_server()
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(run.drive())
        figures = run.figures()
    except BaseException:
        print(f"  logs in {run.tmp}", file=sys.stderr)
        raise
    finally:
        run.stop_server()
        drop_database()
    if args.keep:
        print(f"  logs kept in {run.tmp}")
    else:
        shutil.rmtree(run.tmp, ignore_errors=True)
    return figures, run


# --- Report ------------------------------------------------------------------------------------


def number(value: float, unit: str = "") -> str:
    if value is None or math.isnan(value):
        return "—"
    if unit == "s":
        return f"{value:.3f}"
    if unit in ("", "MiB", "%") or abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}"


def run_lines(agents: int, figures: dict, run: Run) -> list[str]:
    f = figures
    cpu = ", ".join(f"{part} {seconds:.0f}" for part, seconds in run.cpu.items()
                    if part != "machine")  # fmt: skip
    wait = f"min({POLL_WAIT_SECONDS:.0f}, the portal's cap {run.poll_wait_cap})"
    lines = [
        f"N={agents} (jobs ×{run.job_scale}): registered in {run.registration_seconds:.1f} s, "
        f"{'filled' if run.filled else 'NOT filled'} ({FILLED:.0%} busy) in {run.fill_seconds:.0f}"
        f" s; polls wait {wait} s; {run.accepted} jobs accepted over the run, {f['submits']} "
        "submits in the window",
        f"  web RSS {number(f['web rss'])} MiB, worker+beat {number(f['worker rss'])} MiB; "
        f"PostgreSQL connections {f['pg connections']} ({f['pg active']} in use, "
        f"{f['pg lock waits']} waiting on a lock); GPUs busy "
        f"{number(f['busy'], '%')} %",
        f"  stop → agent p50/p99/max {number(f['stop p50'], 'ms')}/{number(f['stop p99'], 'ms')}/"
        f"{number(f['stop max'], 'ms')} ms over {f['stops']} receipts ({f['never received']} "
        f"never received, {f['ended before']} nodes not counted whose process of the attempt "
        f"had ended before the stop; {f['ended at once']} attempts preempted before their start"
        f" was granted, ended at once with no stop order); from the commit p50/p99 "
        f"{number(f['commit p50'], 'ms')}/"
        f"{number(f['commit p99'], 'ms')} ms; {f['by start']} came with the answer to a start "
        f"(the attempt's stop came first), {f['later poll']} on a poll sent after the commit "
        "(the agent was busy with its last answer)",
        f"  submit p50/p99 {number(f['submit p50'], 'ms')}/{number(f['submit p99'], 'ms')} ms; "
        f"placing cycles {f['placing cycles']}, median {number(f['cycle median'], 's')} s, max "
        f"{number(f['cycle max'], 's')} s (from its task's start, the wait for the lock included:"
        f" {number(f['cycle with lock wait median'], 's')} s, max "
        f"{number(f['cycle with lock wait max'], 's')} s); attempts placed {f['placed']}, "
        f"preempted {f['preemptions']}",
        f"  bench loop lag p99/max {number(f['lag p99'], 'ms')}/{number(f['lag max'], 'ms')} ms, "
        f"its peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB; "
        f"CPU seconds in the window: {cpu}; machine busy {run.cpu.get('machine', 0):.0f} of "
        f"{os.cpu_count() * run.args.seconds:.0f} ({os.cpu_count()} CPUs, other users included)",
    ]
    states = ", ".join(f"{state} {count}" for state, count in run.job_states.items())
    results = ", ".join(f"{result} {count}" for result, count in sorted(run.results.items()))
    lines.append(f"  jobs at the end: {states}; the portal's results for the agents' events: "
                 f"{results}; agents' connections opened {run.connections['opened']}, reused "
                 f"{run.connections['reused']} times")  # fmt: skip
    errors = ", ".join(f"{kind}: {count}" for kind, count in sorted(run.errors.items()))
    lines.append(f"  errors: {errors or 'none'}")
    lines += [f"    {kind}: {run.error_samples[kind][:200]!r}" for kind in sorted(run.errors)]
    if run.sampler is not None and run.sampler.lock_waits:
        lines.append("  statements seen waiting on a lock (samples): " + "; ".join(
            f"{count} × {query}" for query, count in run.sampler.lock_waits.most_common(3)
        ))  # fmt: skip
    if run.never_received:
        lines.append(f"  attempts whose stop some node never received: {run.never_received[:10]}")
    if run.crashes:
        lines.append(f"  BENCH TASKS FAILED ({len(run.crashes)}): {run.crashes[0]}")
    if run.sampler is not None and run.sampler.vacuums is not None:
        lines.append(f"  autovacuum is off on this server: VACUUM (ANALYZE) every "
                     f"{soak.AUTOVACUUM_STANDIN_SECONDS:.0f} s instead ({run.sampler.vacuums} "
                     "times)")  # fmt: skip
    lines += [f"  {line}" for line in run.log_problems()]
    return lines


def report(results: dict[int, list[dict]], runs: int) -> list[str]:
    sizes = sorted(results)
    base = sizes[0]
    header = ["figure", *[f"N={n}" for n in sizes]]
    header += [f"N={n} ÷ N={base}" for n in sizes[1:]]
    header += [f"goal at N={GOAL_AGENTS}", ""]
    table = [header]
    for key, label, unit in FIGURES:
        values = {n: [r[key] for r in results[n]] for n in sizes}
        judged = {n: (max(v) if key in WORST else median(v)) for n, v in values.items()}
        row = [label + (f" ({unit})" if unit else "")]
        for n in sizes:
            cell = number(judged[n], unit)
            if runs > 1:
                cell += f" ({', '.join(number(v, unit) for v in values[n])})"
            row.append(cell)
        for n in sizes[1:]:
            ratio = judged[n] / judged[base] if judged[base] else math.nan
            row.append("—" if math.isnan(ratio) else f"{ratio:.2f}")
        if key in GOALS:
            op, goal = GOALS[key]
            row.append(f"{'≤' if op == '<=' else '≥'} {number(goal, unit)}"
                       + (f" {unit}" if unit else ""))  # fmt: skip
            value = judged.get(GOAL_AGENTS, math.nan)
            met = value <= goal if op == "<=" else value >= goal
            row.append("—" if math.isnan(value) else ("met" if met else "MISSED"))
        else:
            row += ["", ""]
        table.append(row)
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = []
    for row in table:
        lines.append(" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
        if row is header:
            lines.append("-+-".join("-" * w for w in widths))
    how = (
        "each figure the median, errors and peaks the worst run"
        if runs > 1
        else "one run each, no median (--runs R for the median of R)"
    )
    lines.append(f"({runs} run(s) per N: {how}; baseline: N={base}, measured in this invocation)")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", default="250,1000,2000",
                        help="comma-separated numbers of agents, one run each")  # fmt: skip
    parser.add_argument("--seconds", type=float, default=60.0, help="measured, per N")
    parser.add_argument("--warmup", type=float, default=120.0,
                        help="longest wait (s) for the cluster to fill")  # fmt: skip
    parser.add_argument("--wave", type=float, default=40.0, help="owners' wave period (s)")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--job-scale", default="auto",
                        help="whole-node jobs span this many times their nodes; auto: "
                             f"N/{SIZES_AGENTS} (as many jobs at every N)")  # fmt: skip
    parser.add_argument("--heartbeat-timeout", type=float, default=None,
                        help="NODE_HEARTBEAT_TIMEOUT_SECONDS (default: the portal's)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="keep the server's logs")
    args = parser.parse_args()
    sizes = sorted({int(n) for n in args.agents.split(",")})
    if args.job_scale != "auto" and not (args.job_scale.isdigit() and int(args.job_scale) >= 1):
        parser.error("--job-scale: auto or a whole number ≥ 1")
    if sizes[0] < 8:
        parser.error("--agents: at least 8 each")
    # A plain `kill` cleans up as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    # Every agent holds up to three connections, and the server one for each.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    priority = (
        f"the bench at niceness {BENCH_NICENESS}, the server at 0"
        if raise_priority()
        else "the bench could not raise its priority: it competes with the server for CPU"
    )
    print(
        f"agents bench: N = {', '.join(map(str, sizes))} agents × {GPUS_PER_NODE} {GPU_TYPE}; "
        f"filling (≤ {args.warmup:.0f} s), then {args.seconds:.0f} s measured per run, {args.runs} "
        f"run(s) per N, waves of {args.wave:.0f} s; {os.cpu_count()} CPUs; {priority}",
        flush=True,
    )
    results: dict[int, list[dict]] = {}
    for agents in sizes:
        for index in range(args.runs):
            print(f"N={agents}, run {index + 1} of {args.runs}:", flush=True)
            figures, run = run_once(args, agents, index)
            results.setdefault(agents, []).append(figures)
            print("\n".join(run_lines(agents, figures, run)), flush=True)
    print()
    print("\n".join(report(results, args.runs)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
