"""The agent's work: register, long-poll for orders, run and stop job processes, report.

Threads: the poller long-polls the portal and hands each answer to the main thread, which
alone starts and signals processes; the starter asks the portal to start the new run orders and
hands its answers to the main thread; the reporter sends what the main thread has to report
(unless the next poll is about to carry it). So the main thread never waits on the portal
while orders wait to be carried out, and a poll goes on while a start is being asked. Orders
are declarative (every attempt that should run here, every attempt to stop); the agent
reconciles them with what it runs. When the portal is unreachable, jobs keep running and events
wait in the outbox, retried with backoff and sent in order when the portal answers again."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import queue
import select
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from scheduler.agent.gpus import Gpu
from scheduler.agent.outbox import Backoff, EndedAttempts, Outbox
from scheduler.agent.protocol import (
    ANSWER_SECONDS,
    CHECKPOINT_DIR_UNUSABLE,
    CHECKPOINT_MARKER,
    END_EXIT,
    END_LOST,
    END_NEVER_STARTED,
    END_TIMEOUT,
    EVENT_CHECKPOINT,
    EVENT_EXITED,
    EVENT_LOG,
    EVENT_STARTED,
    LOG_TAIL_CHARS,
    POLL_ANSWER_SECONDS,
    POLL_PATH,
    REGISTER_PATH,
    REPORT_PATH,
    START_PATH,
    WORKING_DIR_MISSING,
    WORKING_DIR_UNREADABLE,
)
from scheduler.agent.transport import PortalClient, PortalUnreachable

logger = logging.getLogger("scheduler.agent")

SHUTDOWN_REPORT_SECONDS = 5.0  # how long a stopping agent keeps trying to report
LOG_EVERY_SECONDS = 15.0
CHECKPOINT_EVERY_SECONDS = 1.0  # how often the agent looks at a running job's marker
KEEP_LOGS_DAYS = 30.0  # job logs kept after they were last written (--keep-logs-days)
PRUNE_FILES_EVERY_SECONDS = 3600.0
DAY = 86400.0
# The main loop wakes at once when an answer comes or one of its processes ends (a pidfd,
# Linux 5.3+; elsewhere it notices exits at its next turn), else every turn for timeouts, grace
# periods and log tails.
STEP_BUSY_SECONDS = 0.1  # main loop turn while jobs run here
STEP_IDLE_SECONDS = 0.5  # main loop turn while none do
REPORT_WAIT_SECONDS = 0.5  # the reporter retries what it could not send at least this often
# Variables of the agent itself that a job must not see.
PRIVATE_ENV = ("AGENT_JOIN_TOKEN",)
SPAWN_THREADS = 4  # processes started at once (`Agent.start_all`)
# How long after its answer came a start granted in a poll's answer is started without asking
# (`Agent.apply`). The portal records the start when it grants it, and a stop ordered after
# that is not refused a start: an agent too loaded to act on the answer in time asks instead
# (`start/`), which refuses the start of an attempt whose stop was ordered meanwhile, so such a
# victim's process never begins.
GRANT_FRESH_SECONDS = 0.25
# Why an attempt never started where its CHECKPOINT_DIR exists but its job could not write
# there: it would lose its work at its first save, hours later maybe.
CHECKPOINT_DIR_UNWRITABLE = (
    "checkpoint directory {path} on node {node} cannot be written by the job (its permissions, "
    "or a read-only file system)"
)
# Why an attempt never started whose command is a script with a #! line exec cannot follow.
INTERPRETER_MISSING = (
    "could not start: {program} names on its #! line the interpreter {interpreter!r}, which is "
    "not an executable file on node {node}"
)


def _die_with_parent() -> None:
    """In the child before exec: its own process group, and SIGKILL when the agent dies (Linux),
    so a dead agent leaves no job holding GPUs behind."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


# util-linux's setpriv sets the same PR_SET_PDEATHSIG, then execs the command (same process:
# its pid, signals and exit code are the command's). Starting a job through it needs no Python
# in the child, so CPython spawns with vfork() rather than fork(), which copies the agent's
# memory map, at every job start (bench/soak.py). _die_with_parent otherwise.
PDEATHSIG_LAUNCHER = ("setpriv", "--pdeathsig", "KILL", "--")


def _pdeathsig_launcher() -> list[str] | None:
    """PDEATHSIG_LAUNCHER, resolved, if this machine's setpriv has --pdeathsig."""
    path = shutil.which(PDEATHSIG_LAUNCHER[0])
    if path is None:
        return None
    try:
        ok = subprocess.run([path, *PDEATHSIG_LAUNCHER[1:], "true"], capture_output=True,
                            timeout=10).returncode == 0  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return [path, *PDEATHSIG_LAUNCHER[1:]] if ok else None


def _executable_file(candidate: Path) -> bool:
    try:
        return candidate.is_file() and os.access(candidate, os.X_OK)
    except OSError:  # a name too long, a directory it may not search: exec fails too
        return False


def _executable(program: str, *, path: str, cwd: Path) -> Path | None:
    """The file exec would find for `program` (a name looked up in `path`, or a path from
    `cwd`), if it is an executable file."""
    if os.sep in program:
        return cwd / program if _executable_file(cwd / program) else None
    found = shutil.which(program, path=path)
    return None if found is None else Path(found)


def _missing_interpreter(script: Path, *, cwd: Path) -> str | None:
    """The interpreter the #! line of `script` names, if it is not an executable file: exec
    then fails as if the script itself were missing (a `#!/usr/bin/python` where only python3
    is, a line that ends in a carriage return)."""
    try:
        with open(script, "rb") as opened:
            head = opened.read(256)  # as much as the kernel reads of it
    except OSError:
        return None
    line, newline, _ = head.partition(b"\n")
    if not head.startswith(b"#!") or not newline:
        return None  # no #! line, or one too long to judge here
    interpreter = os.fsdecode(line[2:].lstrip(b" \t").split(b" ", 1)[0].split(b"\t", 1)[0])
    if not interpreter or _executable_file(cwd / interpreter):
        return None
    return interpreter


SHELL_SYNTAX = set("|&;<>()$`\\\"'*?[]#~=%{}\n")


def _argv(command: str) -> list[str]:
    """A plain command runs as is, so signals reach it directly and its exit code is its own;
    anything with shell syntax runs under /bin/sh."""
    if SHELL_SYNTAX & set(command):
        return ["/bin/sh", "-c", command]
    return shlex.split(command)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


# Every process of an attempt has this variable in its environment, and passes it on to what
# it starts: the agent finds by it the processes that left the attempt's process group (setsid,
# a daemon the job starts), to stop and kill them with the group, and a restarted agent finds
# what its previous run left. Its value is `attempt@work directory`: unique on the machine, and
# the same for a restarted agent. A process that takes it out of its environment, and what that
# process starts, is not found.
PROCESS_TAG = "GPU_AGENT_TAG"
KILL_ROUNDS = 5  # a process may start another between a look and its SIGKILL: look again
# A look through /proc costs about a millisecond per hundred processes: what outlives a job that
# exited by itself is looked for at most this often, for all the jobs that exited meanwhile (a
# node running many short jobs would otherwise look at every exit). A stop's SIGKILL at the end
# of its grace period looks at once.
SWEEP_EVERY_SECONDS = 1.0


def tagged_processes() -> dict[int, str]:
    """The processes (pid → tag) with PROCESS_TAG in their environment, as far as this user may
    read it (/proc, Linux; elsewhere none). A zombie has no environment left: only processes
    that still run are found."""
    prefix = f"{PROCESS_TAG}=".encode()
    found = {}
    try:
        entries = list(os.scandir("/proc"))
    except OSError:
        return found
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as environ:
                variables = environ.read()
        except OSError:  # another user's, or gone meanwhile
            continue
        if prefix not in variables:
            continue
        for variable in variables.split(b"\0"):
            if variable.startswith(prefix):
                found[int(entry.name)] = os.fsdecode(variable[len(prefix) :])
                break
    found.pop(os.getpid(), None)
    return found


def _signal_tagged(tags: set[str], sig: int) -> set[str]:
    """`sig` to every process whose tag is one of `tags` (SIGKILL: until none is left, or
    KILL_ROUNDS looks); the tags of the processes signalled."""
    tags = tags - {""}  # no tag: none of the agent's processes
    signalled: set[int] = set()
    tagged: set[str] = set()
    for _ in range(KILL_ROUNDS if sig == signal.SIGKILL else 1):
        found = {pid: tag for pid, tag in tagged_processes().items() if tag in tags}
        if not found.keys() - signalled:
            break
        for pid, tag in found.items():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
                signalled.add(pid)
                tagged.add(tag)
    return tagged


def _kill_attempt(pgid: int, tag: str) -> None:
    """SIGKILL to an attempt's process group and to its processes that left it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    _signal_tagged({tag}, signal.SIGKILL)


def _attempt_alive(pgid: int, tag: str) -> bool:
    """Whether a process of the attempt still runs, in its process group or not."""
    return _group_alive(pgid) or bool(tag) and tag in tagged_processes().values()


def _boot_time() -> float | None:
    """When this machine booted (epoch seconds, to the second), from /proc/stat."""
    try:
        with open("/proc/stat") as stat:
            for line in stat:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _started_at(pid: int, *, booted: float) -> float | None:
    """When the process started (epoch seconds; up to a second early: the boot time is rounded
    down), or None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None
    return booted + ticks / os.sysconf("SC_CLK_TCK")


def leftover_group(pgid: int, *, recorded_at: float) -> bool:
    """Whether process group `pgid`, recorded at `recorded_at` (epoch seconds) by a previous run
    of the agent, may still be the job's: not if the machine booted since (every number is
    free again), nor if its leader started after the record (the number was reused)."""
    booted = _boot_time()
    if booted is None:
        return True  # not Linux: the agent cannot tell, and kills it as it always did
    if recorded_at < booted:
        return False
    leader_started = _started_at(pgid, booted=booted)
    return leader_started is None or leader_started <= recorded_at


def checkpoint_saved_at(marker: Path | None, *, after: float) -> float | None:
    """When the checkpoint marker was last written, if later than `after` (epoch seconds)."""
    if marker is None:
        return None
    try:
        saved = marker.stat().st_mtime
    except OSError:
        return None
    return saved if saved > after else None


def checkpoint_dir_made(root: Path, job: int, *, where: str) -> tuple[Path, str]:
    """The job's CHECKPOINT_DIR under `root`, made if it is missing, and why it could not be
    (CHECKPOINT_DIR_UNUSABLE, saying `where`: a full disk, a file in its way), else "": then
    the attempt cannot start."""
    checkpoint_dir = root / f"job-{job}"
    try:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        return checkpoint_dir, CHECKPOINT_DIR_UNUSABLE.format(
            path=checkpoint_dir, where=where, error=error.strerror or error
        )
    return checkpoint_dir, ""


def log_tail(path: Path) -> str:
    """The last LOG_TAIL_CHARS of a job's log ("" if it cannot be read): at most that many
    bytes, as text (bytes that are no UTF-8 become U+FFFD), from the first character that
    starts within them (not the end of one cut in two)."""
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            start = max(0, log.tell() - LOG_TAIL_CHARS)  # bytes: no more characters
            log.seek(start)
            tail = log.read()
    except OSError:
        return ""
    if start:
        # Up to 3 continuation bytes (10xxxxxx) end a character that began before the tail.
        cut = next((i for i, byte in enumerate(tail[:3]) if byte & 0xC0 != 0x80), 0)
        tail = tail[cut:]
    return tail.decode(errors="replace")


class FileRetention:
    """The files named `*suffix` in `directory` are removed once they have not been written for
    `keep_seconds` (0 or less: kept for ever), looked at once an hour. For the job logs
    (`job-J-attempt-N.log`, `--keep-logs-days`): the portal keeps each attempt's last
    LOG_TAIL_CHARS, a node the whole log for that long, so that its disk does not fill with one
    file per attempt it ever ran; a running attempt's log is kept however old."""

    def __init__(self, directory: Path, *, suffix: str, keep_seconds: float) -> None:
        self.directory = directory
        self.suffix = suffix
        self.keep_seconds = keep_seconds
        self.pruned_at: float | None = None  # time.monotonic() of the last look

    def prune_when_due(self, in_use: Callable[[], set[Path] | None] = set) -> int:
        """Remove the files not written for `keep_seconds`, but those `in_use()` names, if an
        hour has passed since the last look; how many went. `in_use()` is None while the files
        in use are not all known: the look waits for the next call."""
        now = time.monotonic()
        if self.keep_seconds <= 0 or (
            self.pruned_at is not None and now - self.pruned_at < PRUNE_FILES_EVERY_SECONDS
        ):
            return 0
        keep = in_use()
        if keep is None:
            return 0
        self.pruned_at = now
        written_before = time.time() - self.keep_seconds
        removed = 0
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return 0  # nothing written there yet
        except OSError as error:
            logger.warning("cannot read %s: %s", self.directory, error)
            return 0
        for entry in entries:
            if not entry.name.endswith(self.suffix) or Path(entry.path) in keep:
                continue
            try:
                stat = entry.stat(follow_symlinks=False)
                if entry.is_file(follow_symlinks=False) and stat.st_mtime < written_before:
                    os.unlink(entry.path)
                    removed += 1
            except OSError:
                continue  # gone meanwhile, or not ours to remove
        if removed:
            logger.info("removed %d %s file(s) of %s not written for %g days", removed,
                        self.suffix, self.directory, self.keep_seconds / DAY)  # fmt: skip
        return removed


def log_retention(work_dir: Path, keep_logs_days: float) -> FileRetention:
    """The job logs of an agent's or a connector's work directory (`--keep-logs-days`)."""
    return FileRetention(work_dir / "logs", suffix=".log", keep_seconds=keep_logs_days * DAY)


@dataclass
class Process:
    attempt: int
    job: int
    popen: subprocess.Popen
    log_path: Path
    started: float  # time.monotonic()
    timeout: float | None
    grace: float
    pidfd: int | None = None  # readable once the process has ended
    tag: str = ""  # PROCESS_TAG's value in its processes' environment
    term_sent_at: float | None = None
    killed: bool = False
    timed_out: bool = False
    # Stopped because the agent itself shuts down (node maintenance): the job did nothing
    # wrong, so it is reported lost and the portal runs it again, like on a lost node.
    evicted: bool = False
    # Its checkpoint marker (CHECKPOINT_MARKER), and the latest modification time reported: a
    # marker older than the attempt's start is an earlier attempt's.
    marker: Path | None = None
    checkpoint_seen: float = field(default_factory=time.time)
    checkpoint_looked: float = field(default_factory=time.monotonic)
    last_log: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class _Launch:
    """How to start one attempt's process (`Agent._launch`)."""

    order: dict
    argv: list[str]
    env: dict[str, str]
    working_dir: Path
    log_path: Path
    marker: Path
    via_launcher: bool  # through PDEATHSIG_LAUNCHER; otherwise _die_with_parent in the child
    tag: str  # PROCESS_TAG's value


def _spawn(launch: _Launch) -> subprocess.Popen | OSError:
    """Start the process, its output to its log file (opened just before: its creation time
    is the start's); the error if it could not start."""
    try:
        with open(launch.log_path, "ab") as log:
            return subprocess.Popen(
                launch.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=launch.env,
                cwd=launch.working_dir,
                start_new_session=True,
                preexec_fn=None if launch.via_launcher else _die_with_parent,
            )
    except OSError as error:
        return error


class Agent:
    def __init__(
        self,
        *,
        portal: str,
        join_token: str,
        name: str,
        gpu_type: str,
        gpus: list[Gpu],
        work_dir: Path,
        checkpoint_root: Path,
        poll_wait: float = 10.0,
        keep_logs_days: float = KEEP_LOGS_DAYS,
    ) -> None:
        self.portal = portal.rstrip("/")
        self.join_token = join_token
        self.name = name
        self.gpu_type = gpu_type
        self.gpus = gpus
        self.work_dir = work_dir
        self.checkpoint_root = checkpoint_root
        self.poll_wait = poll_wait
        self.token: str | None = None
        self.processes: dict[int, Process] = {}
        # The tags of attempts that exited by themselves, whose processes outside their process
        # groups the next sweep kills (`supervise`), and when the last sweep was.
        self.unswept: set[str] = set()
        self.swept_at = 0.0
        self.finished = EndedAttempts()  # attempts done here; never started again
        # Run orders the agent has and is to ask the portal to start (attempt → order): it
        # starts one only once the portal grants it, so an attempt whose stop was ordered first
        # never runs. The main thread's alone.
        self.claims: dict[int, dict] = {}
        self.start_grants = True  # the portal grants starts (off for an older portal)
        self.claim_backoff = Backoff()
        # While the agent runs (`run`), the starter thread asks to start the claims: the main
        # thread hands it the attempts (`to_ask`; those on their way are in `asking`) and goes
        # on carrying out orders; the answers come back on `grants`. Without it (one call at a
        # time, as the tests make them) `claim` asks itself and waits for the answer.
        self.to_ask: queue.Queue[list[int]] | None = None
        self.asking: set[int] = set()
        self.grants: queue.Queue[tuple[list[int], dict | None]] = queue.Queue()
        # Attempts a previous run of this agent had started (their process groups were left
        # behind, and killed): the portal hears they are lost.
        self.previous_life: set[int] = set()
        # Events not yet acknowledged by the portal, in order.
        self.outbox = Outbox(self.finished)
        self.poll_events = True  # send events with polls (off if the portal does not take them)
        # (poll number, answer, when it came: time.monotonic())
        self.answers: queue.Queue[tuple[int, dict, float]] = queue.Queue()
        # The poller writes a byte here with each answer, to wake the main loop's wait.
        self.wake_read, self.wake_write = os.pipe()
        os.set_blocking(self.wake_read, False)
        os.set_blocking(self.wake_write, False)
        self.applied = threading.Event()
        self.poll_due = threading.Event()  # set while an answer is applied: a poll follows
        self.stopping = threading.Event()
        self.http = PortalClient(self.portal)
        self.pdeathsig_launcher = _pdeathsig_launcher()
        self._spawner: ThreadPoolExecutor | None = None  # made at the first batch of starts
        self.log_retention = log_retention(work_dir, keep_logs_days)
        (work_dir / "logs").mkdir(parents=True, exist_ok=True)
        (work_dir / "running").mkdir(parents=True, exist_ok=True)
        checkpoint_root.mkdir(parents=True, exist_ok=True)
        # PROCESS_TAG of attempt A is `A@` this.
        self.work_dir_tag = str(work_dir.resolve())

    # --- Talking to the portal ---------------------------------------------------------------

    def _headers(self) -> dict:
        return {"Authorization": f"Node {self.token}"}

    def register(self) -> None:
        """Register until the portal answers; a refused join token is fatal."""
        backoff = Backoff()
        body = {
            "join_token": self.join_token,
            "name": self.name,
            "gpu_type": self.gpu_type,
            "gpus": len(self.gpus),
            "gpu_details": [g.as_json() for g in self.gpus],
            "asks_to_start": True,  # it starts only what the portal grants (`claim`)
        }
        while not self.stopping.is_set():
            try:
                response = self.http.post(REGISTER_PATH, json=body, timeout=ANSWER_SECONDS)
            except PortalUnreachable as error:
                logger.warning("portal unreachable (%s); retrying", error)
            else:
                if response.status_code == 201:
                    self.token = response.json()["token"]
                    logger.info("registered as %s (%d × %s)", self.name, len(self.gpus),
                                self.gpu_type)  # fmt: skip
                    return
                if 400 <= response.status_code < 500:
                    raise SystemExit(f"registration refused: {response.text}")
                logger.warning("registration failed (%s); retrying", response.status_code)
            backoff.failed()
            self.stopping.wait(backoff.delay)

    def _poll_body(self, events: list[dict]) -> dict:
        # The main thread changes the claims and processes meanwhile: each is copied in one
        # step (a C call, which no other thread interrupts) before it is read. The claims
        # first: a claim leaves them only once its process is among the processes.
        claims = set(self.claims)
        processes = self.processes.copy()
        pending = self.outbox.pending_exits()
        body = {
            # The claims too: the agent has their orders, and the portal leaves out the run
            # orders of what the agent runs (a poll that goes while a start is being asked
            # would otherwise be answered at once with them). An attempt that ended at the
            # portal meanwhile comes back as a stop order.
            "running": sorted(set(processes) | claims | pending),
            "stopping": sorted(
                {a for a, p in processes.items() if p.term_sent_at is not None} | pending
            ),
            "wait": self.poll_wait,
            # The portal may grant the starts of one-node attempts in its answer (`apply`):
            # no request to start them, a round trip less before their processes run.
            "grants": self.start_grants,
        }
        if events:
            body["events"] = events
        return body

    def poller(self) -> None:
        """Long-poll for orders; hand each answer to the main thread and wait until applied."""
        backoff = Backoff()
        while not self.stopping.is_set():
            # What the main thread has to report goes with the poll (what it saw while it
            # applied the last answer), saving a report request of its own.
            events = self.outbox.take() if self.poll_events else []
            self.poll_due.clear()
            poll = self.finished.poll_sent()
            try:
                response = self.http.post(
                    POLL_PATH,
                    json=self._poll_body(events),
                    headers=self._headers(),
                    timeout=self.poll_wait + POLL_ANSWER_SECONDS,
                )
            except PortalUnreachable as error:
                self.outbox.sent(events, delivered=False)
                logger.warning("poll failed (%s); jobs keep running", error)
                backoff.failed()
                self.stopping.wait(backoff.delay)
                continue
            answer = response.answer() if response.status_code == 200 else {}
            if answer is None:  # not the portal's answer (a proxy's page): as if unreachable
                self.outbox.sent(events, delivered=False)
                backoff.failed()
                self.stopping.wait(backoff.delay)
                continue
            # A portal that answers without `results` did not apply the events (an older
            # one), and a refused poll may be refused for them: reports carry them from now on,
            # unless it named bad ones or found them too many (`Outbox.refused`).
            delivered = "results" in answer
            if delivered or not self.outbox.refused(events, response, what="poll"):
                self.outbox.sent(events, delivered=delivered, poll=poll)
                if events and not delivered and response.status_code in (200, 400):
                    logger.warning("the portal does not take events with polls; sending reports")
                    self.poll_events = False
            if response.status_code == 401:
                logger.warning("the portal no longer knows this node's token; registering again")
                self.register()
                continue
            if response.status_code != 200:
                logger.warning("poll answered %s: %s", response.status_code, response.text[:200])
                backoff.failed()
                self.stopping.wait(backoff.delay)
                continue
            backoff.succeeded()
            self.applied.clear()
            self.poll_due.set()
            self.answers.put((poll, answer, time.monotonic()))
            with contextlib.suppress(BlockingIOError):
                os.write(self.wake_write, b"!")
            while not self.applied.wait(0.5):
                if self.stopping.is_set():
                    return

    def flush(self, *, everything: bool = False) -> bool:
        """Report the oldest outbox events no poll carries (`everything`: the oldest), a batch
        of them (`Outbox.take`); on failure keep them and back off. Returns whether the portal
        took them."""
        return self.outbox.report(self.http, REPORT_PATH, self._headers, everything=everything)

    def _event(self, **event) -> None:
        self.outbox.add(event)

    def reporter(self) -> None:
        """Report the outbox's events as they come (those no poll carries), so that the main
        thread, which starts and stops the processes, never waits on the portal."""
        while not self.stopping.is_set():
            self.outbox.filled.wait(REPORT_WAIT_SECONDS)
            if self.poll_events and self.poll_due.is_set():
                # The poller polls again as soon as the main thread has applied its answer, and
                # carries them: one request, not two.
                self.stopping.wait(0.01)
                continue
            self.outbox.filled.clear()
            self.flush()

    # --- Orders ------------------------------------------------------------------------------

    def apply(
        self, orders: dict, *, answered: int | None = None, received: float | None = None
    ) -> None:
        """Reconcile with the portal's orders (the answer to poll number `answered`, which came
        at `received`, time.monotonic()). A run order the portal granted in the answer
        (`granted`, asked for with the poll's `grants`) starts at once, after the answer's stop
        orders, if the answer came at most GRANT_FRESH_SECONDS ago. Another run order the agent
        does not have yet is claimed (a stale grant too), and the agent asks the portal at once
        to start its claims (`claim`). A claim stays until its start is answered or its stop
        is ordered: the polls list it as running, so the portal leaves its run order out of
        their answers, and orders its stop if it ended there."""
        ordered = set()
        granted = []
        fresh = received is None or time.monotonic() - received <= GRANT_FRESH_SECONDS
        for order in orders.get("run", []):
            attempt = order["attempt"]
            ordered.add(attempt)
            if attempt in self.processes or attempt in self.finished:
                continue
            if self._lost_here(attempt, order):
                self._end(attempt, end=END_LOST, detail="the agent restarted")
            elif order.get("granted") and self.start_grants and fresh:
                granted.append(order)
            else:
                self.claims[attempt] = order
        for order in orders.get("stop", []):
            ordered.add(order["attempt"])
            self._stop(order)
        if answered is not None:
            self.finished.forget(answered=answered, keep=ordered)
        self.start_all([order for order in granted if order["attempt"] not in self.finished])
        self.claim()

    def _stop(self, order: dict) -> None:
        """Carry out a stop order: SIGTERM (then SIGKILL after the grace) to a process that
        runs; an attempt that never started here is reported so, and never starts."""
        attempt = order["attempt"]
        self.claims.pop(attempt, None)
        process = self.processes.get(attempt)
        if process is not None:
            if process.term_sent_at is None:
                process.grace = float(order.get("grace_seconds", 0))
                self.terminate(process)
        elif attempt not in self.finished:
            if self._lost_here(attempt, order):
                self._end(attempt, end=END_LOST, detail="the agent restarted")
            else:
                self._end(attempt, end=END_NEVER_STARTED, detail="stopped before it started")

    def claim(self) -> None:
        """Ask the portal to start the claims not yet asked about (START_PATH): the starter
        thread asks while the main thread goes on, or this call asks and waits. A portal that
        grants no starts (an older one) is not asked: the agent starts what it is ordered."""
        attempts = sorted(set(self.claims) - self.asking)
        if not attempts or not self.claim_backoff.ready():
            return
        if not self.start_grants:
            self.granted(attempts, {"start": attempts})
        elif self.to_ask is None:
            self.granted(attempts, self.ask_to_start(attempts))
        else:
            self.asking.update(attempts)
            self.to_ask.put(attempts)

    def ask_to_start(self, attempts: list[int]) -> dict | None:
        """The portal's answer to a request to start `attempts`; None if it gave none. A
        portal that does not know START_PATH (an older one) grants them all, and grants no
        more from now on."""
        try:
            response = self.http.post(
                START_PATH, json={"attempts": attempts}, headers=self._headers(),
                timeout=ANSWER_SECONDS,
            )  # fmt: skip
        except PortalUnreachable as error:
            logger.warning("could not ask to start %d attempt(s) (%s)", len(attempts), error)
            return None
        if response.status_code == 404:
            logger.warning("the portal grants no starts; starting what it orders")
            self.start_grants = False
            return {"start": attempts}
        if response.status_code != 200:
            logger.warning("start refused (%s): %s", response.status_code,
                           response.text[:200])  # fmt: skip
            return None
        return response.answer()  # None for a proxy's page: asked again later

    def starter(self) -> None:
        """Ask to start what the main thread hands over (those handed over meanwhile go
        together), and hand each answer back to it."""
        while not self.stopping.is_set():
            try:
                attempts = self.to_ask.get(timeout=0.5)
            except queue.Empty:
                continue
            with contextlib.suppress(queue.Empty):
                while True:
                    attempts += self.to_ask.get_nowait()
            try:
                answer = self.ask_to_start(attempts)
            except Exception:  # the thread goes on: without it the agent would start nothing
                logger.exception("asking to start %d attempt(s) failed", len(attempts))
                answer = None
            self.grants.put((attempts, answer))
            with contextlib.suppress(BlockingIOError):
                os.write(self.wake_write, b"!")

    def granted(self, attempts: list[int], answer: dict | None) -> None:
        """Carry out the answer to a request to start `attempts` (None: none came, so they are
        asked again once the backoff allows): start those granted that are still claimed (a
        stop order that came meanwhile took its claim, and the attempt never starts). One the
        portal refused had its stop ordered first (its stop order comes with the answer, and
        it is reported as never started at once) or ended there (it is done here, and the
        portal knows: a stop order a poll brings for it is not answered with a report)."""
        self.asking.difference_update(attempts)
        if answer is None:
            self.claim_backoff.failed()
            return
        self.claim_backoff.succeeded()
        granted = set(answer.get("start", []))
        stopped = {order.get("attempt") for order in answer.get("stop", [])}
        starting = []
        for attempt in attempts:
            order = self.claims.get(attempt)
            if order is None:
                continue
            if attempt in granted:
                starting.append(order)  # a claim until its process runs (`start_all`)
                continue
            del self.claims[attempt]
            if attempt not in stopped:
                self.finished.add(attempt)
                self.finished.acknowledged([attempt], poll=None)
        self.start_all(starting, report_start=not self.start_grants)
        for order in answer.get("stop", []):
            if order.get("attempt") in attempts:
                self._stop(order)

    def _lost_here(self, attempt: int, order: dict) -> bool:
        """Whether an attempt the agent does not run had been started here, by a previous run
        of this agent (an older portal, which grants no starts, says so with `started`)."""
        return attempt in self.previous_life or (
            not self.start_grants and bool(order.get("started"))
        )

    def _end(self, attempt: int, *, end: str, exit_code=None, signalled=False, log_tail="",
             detail="") -> None:  # fmt: skip
        self.finished.add(attempt)
        self._event(type=EVENT_EXITED, attempt=attempt, end=end, exit_code=exit_code,
                    signalled=signalled, log_tail=log_tail, detail=detail)  # fmt: skip

    def cuda_visible_devices(self, indices: list[int]) -> str | None:
        """CUDA_VISIBLE_DEVICES for the GPUs the portal assigned by index, in its order; None
        if one of them is not on this node."""
        by_index = {gpu.index: gpu for gpu in self.gpus}
        if not set(indices) <= by_index.keys():
            return None
        return ",".join(by_index[i].cuda_visible_id for i in indices)

    def start(self, order: dict, *, report_start: bool = False) -> None:
        """Start the attempt's process. `report_start`: tell the portal it started (a portal
        that grants starts recorded the start when it granted it)."""
        self.start_all([order], report_start=report_start)

    def start_all(self, orders: list[dict], *, report_start: bool = False) -> None:
        """Start the attempts' processes, in their order. Those that go through the launcher
        start several at a time (SPAWN_THREADS), each as soon as it is prepared: each start
        waits until its child has exec'd, which on a busy node waits for a CPU, and those waits
        overlap with each other and with preparing the next ones (bench/agent_starts.py). The
        others run Python in the child (fork, not vfork), one at a time. Every process exists
        when this returns."""
        launches: list[_Launch] = []
        spawning: dict[int, Future] = {}
        for order in orders:
            launch = self._launch(order)
            if launch is None:
                continue
            launches.append(launch)
            if launch.via_launcher and len(orders) > 1:
                if self._spawner is None:
                    self._spawner = ThreadPoolExecutor(SPAWN_THREADS, thread_name_prefix="spawn")
                spawning[order["attempt"]] = self._spawner.submit(_spawn, launch)
        for launch in launches:
            attempt = launch.order["attempt"]
            popen = spawning[attempt].result() if attempt in spawning else _spawn(launch)
            self._started(launch, popen, report_start=report_start)
        for order in orders:
            # Only now: the polls list an attempt as running from its claim until its process
            # is among the processes (or its end in the outbox), without a gap.
            self.claims.pop(order["attempt"], None)

    def _launch(self, order: dict) -> _Launch | None:
        """How to start the attempt; None if it cannot start here (reported never started)."""
        attempt, job = order["attempt"], order["job"]
        visible = self.cuda_visible_devices(order["gpu_indices"])
        if visible is None:
            self._end(attempt, end=END_NEVER_STARTED,
                      detail=f"GPUs {order['gpu_indices']} are not all on this node "
                      f"({len(self.gpus)} GPUs)")  # fmt: skip
            return None
        checkpoint_dir, unusable = checkpoint_dir_made(
            self.checkpoint_root, job, where=f"node {self.name}"
        )
        if unusable:
            self._end(attempt, end=END_NEVER_STARTED, detail=unusable)
            return None
        if not os.access(checkpoint_dir, os.W_OK | os.X_OK):
            unwritable = CHECKPOINT_DIR_UNWRITABLE.format(path=checkpoint_dir, node=self.name)
            self._end(attempt, end=END_NEVER_STARTED, detail=unwritable)
            return None
        # Where the command starts: the job's own directory if it names one, which must be
        # here already (the agent makes none: a missing one is a path or a mount gone wrong).
        working_dir = Path(order.get("working_dir") or checkpoint_dir)
        try:
            is_dir = working_dir.is_dir()
        except OSError as error:  # not allowed to look, a name too long: it cannot start there
            unreadable = WORKING_DIR_UNREADABLE.format(
                path=working_dir, node=self.name, error=error.strerror or error
            )
            self._end(attempt, end=END_NEVER_STARTED, detail=unreadable)
            return None
        if not is_dir:
            missing = WORKING_DIR_MISSING.format(path=working_dir, node=self.name)
            self._end(attempt, end=END_NEVER_STARTED, detail=missing)
            return None
        env = {k: v for k, v in os.environ.items() if k not in PRIVATE_ENV}
        env.update({str(k): str(v) for k, v in (order.get("env") or {}).items()})
        tag = f"{attempt}@{self.work_dir_tag}"
        env.update(
            {
                "CUDA_VISIBLE_DEVICES": visible,
                "JOB_ID": str(job),
                "ATTEMPT": str(order["number"]),
                "CHECKPOINT_DIR": str(checkpoint_dir),
                "PREEMPT_GRACE_SECONDS": str(order["grace_seconds"]),
                PROCESS_TAG: tag,
            }
        )
        argv = _argv(order["command"])
        # A command exec would not find goes without the launcher, so it fails to start here
        # (never_started, with the error) rather than as the launcher's exit code 127.
        program = _executable(argv[0], path=env.get("PATH", os.defpath), cwd=working_dir)
        interpreter = program and _missing_interpreter(program, cwd=working_dir)
        if interpreter:
            missing = INTERPRETER_MISSING.format(
                program=argv[0], interpreter=interpreter, node=self.name
            )
            self._end(attempt, end=END_NEVER_STARTED, detail=missing)
            return None
        via_launcher = bool(self.pdeathsig_launcher) and program is not None
        return _Launch(
            order=order,
            argv=[*self.pdeathsig_launcher, *argv] if via_launcher else argv,
            env=env,
            working_dir=working_dir,
            log_path=self.work_dir / "logs" / f"job-{job}-attempt-{order['number']}.log",
            marker=checkpoint_dir / CHECKPOINT_MARKER,
            via_launcher=via_launcher,
            tag=tag,
        )

    def _started(
        self, launch: _Launch, popen: subprocess.Popen | OSError, *, report_start: bool
    ) -> None:
        """Supervise the process `_spawn` started (or report why it could not start, or kill it
        if its process group cannot be recorded)."""
        order = launch.order
        attempt = order["attempt"]
        if isinstance(popen, OSError):
            self._end(attempt, end=END_NEVER_STARTED, detail=f"could not start: {popen}")
            return
        # The record a restarted agent kills leftovers by: without it (a full disk), the job
        # does not run, rather than run unrecorded.
        record = self.work_dir / "running" / f"{attempt}.pgid"
        try:
            record.write_text(str(popen.pid))
        except OSError as error:
            _kill_attempt(popen.pid, launch.tag)
            popen.wait()
            with contextlib.suppress(OSError):
                record.unlink(missing_ok=True)
            self._end(attempt, end=END_NEVER_STARTED, detail=f"could not record its process "
                      f"group in {record}: {error.strerror or error}")  # fmt: skip
            return
        try:
            pidfd = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):  # not Linux 5.3+: exits are seen at the next turn
            pidfd = None
        timeout = order.get("timeout_seconds")
        self.processes[attempt] = Process(
            attempt=attempt,
            job=order["job"],
            popen=popen,
            log_path=launch.log_path,
            started=time.monotonic(),
            timeout=float(timeout) if timeout else None,
            grace=float(order["grace_seconds"]),
            pidfd=pidfd,
            marker=launch.marker,
            tag=launch.tag,
        )
        logger.info("attempt %s (job %s) started, pid %s, GPUs %s", attempt, order["job"],
                    popen.pid, order["gpu_indices"])  # fmt: skip
        if report_start:
            self._event(type=EVENT_STARTED, attempt=attempt)

    def terminate(self, process: Process) -> None:
        """SIGTERM to the process group, and to the attempt's processes that left it
        (PROCESS_TAG); SIGKILL follows after the grace period."""
        process.term_sent_at = time.monotonic()
        logger.info("attempt %s: SIGTERM, %.0f s grace", process.attempt, process.grace)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.popen.pid, signal.SIGTERM)
        _signal_tagged({process.tag}, signal.SIGTERM)

    # --- Supervising -------------------------------------------------------------------------

    def supervise(self) -> None:
        """One look at every process: report the attempts that ended, and kill what is left of
        them; enforce timeouts and grace periods; send log tails and checkpoints."""
        now = time.monotonic()
        # The attempts whose processes get SIGKILL this turn, by tag: one look through /proc
        # finds those outside their process groups for all of them (those of jobs that exited
        # by themselves: at most every SWEEP_EVERY_SECONDS, `unswept`).
        killing: set[str] = set()
        for attempt, process in list(self.processes.items()):
            code = process.popen.poll()
            if (
                code is not None
                and process.term_sent_at is not None
                and now - process.term_sent_at < process.grace
                and _attempt_alive(process.popen.pid, process.tag)
            ):
                # The leader is gone but the rest of the attempt is still saving its work: it
                # keeps its grace period.
                continue
            if code is not None:
                # Whatever of the attempt outlives its leader is taken down with it, in its
                # process group or not.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.popen.pid, signal.SIGKILL)
                # Of a job stopped (preempted, cancelled, timed out), at once: its GPUs are
                # someone's already.
                stopped = process.term_sent_at is not None
                (killing if stopped else self.unswept).add(process.tag)
                del self.processes[attempt]
                if process.pidfd is not None:
                    os.close(process.pidfd)
                with contextlib.suppress(OSError):
                    (self.work_dir / "running" / f"{attempt}.pgid").unlink(missing_ok=True)
                logger.info("attempt %s exited with %s", attempt, code)
                if process.evicted:
                    self._end(
                        attempt,
                        end=END_LOST,
                        exit_code=code,
                        detail="its node agent shut down",
                        log_tail=self._tail(process),
                    )
                    continue
                self._end(
                    attempt,
                    end=END_TIMEOUT if process.timed_out else END_EXIT,
                    exit_code=code,
                    signalled=process.term_sent_at is not None,
                    log_tail=self._tail(process),
                )
                continue
            if process.term_sent_at is None:
                if process.timeout is not None and now - process.started >= process.timeout:
                    process.timed_out = True
                    self.terminate(process)
                elif now - process.last_log >= LOG_EVERY_SECONDS:
                    process.last_log = now
                    self._event(type=EVENT_LOG, attempt=attempt, log_tail=self._tail(process))
                if now - process.checkpoint_looked >= CHECKPOINT_EVERY_SECONDS:
                    process.checkpoint_looked = now
                    self._look_for_checkpoint(process)
            elif not process.killed and now - process.term_sent_at >= process.grace:
                process.killed = True
                logger.info("attempt %s: grace over, SIGKILL", attempt)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.popen.pid, signal.SIGKILL)
                killing.add(process.tag)
        if killing or (self.unswept and now - self.swept_at >= SWEEP_EVERY_SECONDS):
            self.sweep(killing)
            self.swept_at = now

    def sweep(self, tags: set[str] = frozenset()) -> None:
        """SIGKILL to the processes outside their process groups of the attempts `tags` and of
        those that exited by themselves since the last sweep."""
        tags = tags | self.unswept
        self.unswept = set()
        if tags:
            _signal_tagged(tags, signal.SIGKILL)

    def _tail(self, process: Process) -> str:
        return log_tail(process.log_path)

    def _look_for_checkpoint(self, process: Process) -> None:
        """Report a checkpoint the job saved since the last one reported (docs/agent.md)."""
        saved = checkpoint_saved_at(process.marker, after=process.checkpoint_seen)
        if saved is not None:
            process.checkpoint_seen = saved
            self._event(type=EVENT_CHECKPOINT, attempt=process.attempt,
                        age=max(0.0, time.time() - saved))  # fmt: skip

    def kill_leftovers(self) -> None:
        """The processes left by a previous run of this agent are not ours any more: the portal
        hears their attempts are lost and runs them again. Kill them so they free their GPUs:
        the process groups it recorded, unless the number is another program's now (the
        machine rebooted, or the number was reused: `leftover_group`), and every process with
        the PROCESS_TAG of one of this work directory's attempts."""
        for pgid_file in (self.work_dir / "running").glob("*.pgid"):
            if pgid_file.stem.isdigit():
                self.previous_life.add(int(pgid_file.stem))
            with contextlib.suppress(ValueError, OSError):
                pgid = int(pgid_file.read_text())
                if leftover_group(pgid, recorded_at=pgid_file.stat().st_mtime):
                    os.killpg(pgid, signal.SIGKILL)
                    logger.info("killed leftover process group of attempt %s", pgid_file.stem)
            with contextlib.suppress(OSError):
                pgid_file.unlink(missing_ok=True)
        mine = {tag for tag in tagged_processes().values()
                if tag.partition("@")[2] == self.work_dir_tag}  # fmt: skip
        for tag in _signal_tagged(mine, signal.SIGKILL):
            attempt = tag.partition("@")[0]
            logger.info("killed leftover process(es) of attempt %s", attempt)
            if attempt.isdigit():
                self.previous_life.add(int(attempt))

    # --- Main loop ---------------------------------------------------------------------------

    def step(self, wait: float = 0.05) -> None:
        """One turn of the main loop: wait up to `wait` seconds for an answer or the end of a
        process, apply the answer if one came, supervise, report."""
        self._wait(wait)
        try:
            answered, orders, received = self.answers.get_nowait()
        except queue.Empty:
            answered, orders, received = None, None, None
        if orders is not None:
            self.apply(orders, answered=answered, received=received)
        # The answers to starts after the poll's: a stop order it brought takes its claim
        # first, so a start granted just before the stop was ordered does not begin.
        with contextlib.suppress(queue.Empty):
            while True:
                self.granted(*self.grants.get_nowait())
        if self.claims:
            self.claim()  # after a failed request, once its backoff allows
        self.supervise()
        if orders is not None:
            # The poller polls again at once and carries the new events (if the portal takes
            # events with polls); the reporter reports the others.
            self.applied.set()
        self.log_retention.prune_when_due(lambda: {p.log_path for p in self.processes.values()})

    def _wait(self, seconds: float) -> None:
        """Until an answer (to a poll or a start) is queued, a process ends (its pidfd), or
        `seconds` pass."""
        if not self.answers.empty() or not self.grants.empty():
            return
        poller = select.poll()
        poller.register(self.wake_read, select.POLLIN)
        for process in self.processes.values():
            # A leader already reaped (its group still saving its work) would wake every turn.
            if process.pidfd is not None and process.popen.returncode is None:
                poller.register(process.pidfd, select.POLLIN)
        poller.poll(seconds * 1000)
        with contextlib.suppress(BlockingIOError):
            while os.read(self.wake_read, 512):
                pass

    def run(self) -> None:
        self.kill_leftovers()
        self.register()
        self.to_ask = queue.Queue()
        for target in (self.poller, self.reporter, self.starter):
            threading.Thread(target=target, name=target.__name__, daemon=True).start()
        while not self.stopping.is_set():
            # A turn ends when an answer comes or a process ends (see _wait); otherwise often
            # while processes run (their timeouts, grace periods, log tails), seldom when none.
            self.step(STEP_BUSY_SECONDS if self.processes else STEP_IDLE_SECONDS)
        self.shutdown()

    def shutdown(self) -> None:
        """On SIGTERM/SIGINT the agent stops its jobs (SIGTERM, grace, SIGKILL) and reports them
        lost, so the portal requeues them (they resume from their checkpoints elsewhere); jobs
        already being stopped by the portal end as the portal asked."""
        for process in self.processes.values():
            if process.term_sent_at is None:
                process.evicted = True
                self.terminate(process)
        deadline = time.monotonic() + max((p.grace for p in self.processes.values()), default=0)
        while self.processes and time.monotonic() < deadline + 5:
            self.supervise()
            time.sleep(0.05)
        self.sweep()  # what outlives the jobs does not outlive the agent
        # The last reports say what became of the jobs: try for a few seconds before leaving,
        # batch after batch.
        deadline = time.monotonic() + SHUTDOWN_REPORT_SECONDS
        while True:
            self.outbox.backoff.succeeded()
            taken = self.flush(everything=True)
            if not len(self.outbox):
                break
            if time.monotonic() >= deadline:
                logger.warning("leaving with %d unsent report(s)", len(self.outbox))
                break
            if not taken:
                time.sleep(0.2)
