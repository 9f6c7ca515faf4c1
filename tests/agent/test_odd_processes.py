"""Jobs that do odd things with their processes, and an agent started with odd values.

A job's process that leaves the attempt's process group (setsid, a daemon it starts) is still
the attempt's: it gets the stop's SIGTERM and grace, and dies with the attempt, or when the
agent restarts. A restarted agent kills what its previous run left, and nothing else, though a
recorded process group number may now be another program's. A process group the agent cannot
record, a CHECKPOINT_DIR the job cannot write, or a script whose #! interpreter the node lacks
ends the attempt as never started, with the reason. A log tail is bounded and reads as text,
from a character's start. Bad values on the agent's command line or in its environment are
refused with exit 2 and one line."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from scheduler.agent.__main__ import parse
from scheduler.agent.core import CHECKPOINT_DIR_UNWRITABLE, INTERPRETER_MISSING, log_tail
from scheduler.agent.protocol import LOG_TAIL_CHARS
from scheduler.jobs.services import job_submit
from scheduler.models import Job, JobAttempt
from tests.agent.offline import offline_agent, run_order
from tests.live import wait_for
from tests.reliability.common import wait_nodes

# A job whose child leaves its process group (os.setsid), notes a SIGTERM in escaped.term and
# goes on, and writes its pid to escaped.pid. With `exits` the job then exits; with `stays` it
# stays until it is signalled.
ESCAPER = textwrap.dedent(
    """
    import os, signal, sys, time
    if os.fork() == 0:
        os.setsid()
        def noted(*_):
            with open("escaped.term", "w") as note:
                note.write("SIGTERM")
        signal.signal(signal.SIGTERM, noted)
        with open("escaped.tmp", "w") as pid:
            pid.write(str(os.getpid()))
        os.rename("escaped.tmp", "escaped.pid")
        while True:
            time.sleep(1)
    while not os.path.exists("escaped.pid"):
        time.sleep(0.01)
    if sys.argv[1] == "stays":
        while True:
            time.sleep(1)
    """
)


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie, whose reaping is its parent's business, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _dead_soon(pid: int, agent=None) -> bool:
    """Whether the process is gone within 10 s (a SIGKILL is delivered asynchronously), the
    `agent` supervising meanwhile (it sweeps what outlives exited jobs about every second)."""
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        if agent is not None:
            agent.supervise()
        time.sleep(0.02)
    return not _alive(pid)


@pytest.fixture
def escaper(tmp_path):
    """The job command of ESCAPER (`escaper(mode)`); escapees still alive after the test are
    killed (by pid, once their command line shows they are ours)."""
    script = tmp_path / "escaper.py"
    script.write_text(ESCAPER)
    yield lambda mode: f"{sys.executable} {script} {mode}"
    for pid_file in tmp_path.glob("**/escaped.pid"):
        pid = int(pid_file.read_text())
        with contextlib.suppress(OSError):
            if str(script) in Path(f"/proc/{pid}/cmdline").read_text():
                os.kill(pid, signal.SIGKILL)


def _escaped(directory: Path) -> int:
    """The pid of the job's process that left its group, once it has written it."""
    pid_file = directory / "escaped.pid"
    deadline = time.monotonic() + 30
    while not pid_file.exists():
        assert time.monotonic() < deadline, "the job's child never wrote its pid"
        time.sleep(0.02)
    return int(pid_file.read_text())


def _end_of(agent, attempt: int) -> dict:
    """Supervise until the attempt's exited event is in the outbox; that event."""
    deadline = time.monotonic() + 30
    while True:
        agent.supervise()
        for event in agent.outbox:
            if event["type"] == "exited" and event["attempt"] == attempt:
                return event
        assert time.monotonic() < deadline, f"attempt {attempt} never ended"
        time.sleep(0.02)


def test_a_process_that_left_the_job_s_process_group_dies_when_the_job_exits(tmp_path, escaper):
    """What outlives a job that exited by itself is taken down with it, in its process group
    or not: it would hold the job's GPUs after the portal gave them to another job."""
    agent = offline_agent(tmp_path)
    agent.start(run_order(1, 1, escaper("exits")))
    escapee = _escaped(tmp_path / "checkpoints" / "job-1")
    event = _end_of(agent, 1)
    assert (event["end"], event["exit_code"]) == ("exit", 0)
    assert _dead_soon(escapee, agent)


def test_at_a_stop_a_process_that_left_the_group_gets_sigterm_and_the_grace(tmp_path, escaper):
    """A stop order's SIGTERM reaches it too, and it keeps the grace period to save its work
    after the job's own process has exited; then SIGKILL."""
    agent = offline_agent(tmp_path)
    agent.start(run_order(1, 1, escaper("stays")))
    job_dir = tmp_path / "checkpoints" / "job-1"
    escapee = _escaped(job_dir)
    agent.apply({"run": [], "stop": [{"attempt": 1, "grace_seconds": 1}]})
    event = _end_of(agent, 1)
    assert event["signalled"] is True
    assert (job_dir / "escaped.term").read_text() == "SIGTERM"
    assert _dead_soon(escapee)


def test_a_restarted_agent_kills_what_its_previous_run_left_in_and_out_of_the_group(
    tmp_path, escaper
):
    """The agent that started the job is gone (here: another agent on the same work directory
    takes over, as a restarted one does); the job's process group and its process that left
    the group are killed, and the attempt is known to be a previous run's (reported lost)."""
    first = offline_agent(tmp_path)
    first.start(run_order(1, 1, escaper("stays")))
    escapee = _escaped(tmp_path / "checkpoints" / "job-1")
    job = first.processes[1].popen
    restarted = offline_agent(tmp_path)
    restarted.kill_leftovers()
    assert job.wait(10) == -signal.SIGKILL
    assert _dead_soon(escapee)
    assert restarted.previous_life == {1}
    assert not list((tmp_path / "running").iterdir())


@pytest.mark.live
def test_an_agent_killed_and_restarted_kills_its_job_s_escaped_process_and_reports_it_lost(
    world, live, escaper
):
    """A node agent killed mid-job takes its job's process with it, but not the process that
    left the job's group; the restarted agent kills that one, and the attempt ends NODE_LOST
    (the job is requeued)."""
    system = live()
    system.start({"node-a": (8, "h100")})
    wait_nodes("node-a")
    job, _ = job_submit(user=world.alice, share_name="research", gpu_type="h100", gpus=8,
                        command=escaper("stays"))  # fmt: skip
    escapee = _escaped(system.checkpoint_dir(job.pk))
    try:
        system.kill_agent("node-a")
        time.sleep(0.2)
        assert _alive(escapee)  # nothing killed it with its agent
        system.start_agent("node-a")
        first = JobAttempt.objects.filter(job=job, number=1)
        wait_for(lambda: first.exclude(outcome="").exists(), timeout=60, what="attempt 1 to end")
        assert first.get().outcome == JobAttempt.Outcome.NODE_LOST
        assert Job.objects.get(pk=job.pk).failure_count == 0
        assert _dead_soon(escapee)
    finally:
        with contextlib.suppress(ProcessLookupError):
            if _alive(escapee):
                os.kill(escapee, signal.SIGKILL)


@pytest.mark.parametrize("recorded", ["before this boot", "before it started"])
def test_a_restarted_agent_leaves_alone_a_process_group_that_reuses_a_recorded_number(
    tmp_path, recorded
):
    """After a reboot (or once the leftover is long gone) the recorded process group number may
    be another program's: the agent kills nothing of it, and still reports the attempt lost."""
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        record = tmp_path / "running" / "7.pgid"
        record.parent.mkdir(parents=True)
        record.write_text(str(other.pid))
        with open("/proc/stat") as stat:
            booted = next(int(line.split()[1]) for line in stat if line.startswith("btime "))
        written = booted - 60 if recorded == "before this boot" else time.time() - 3600
        written = max(written, booted + 1) if recorded == "before it started" else written
        os.utime(record, (written, written))
        agent = offline_agent(tmp_path)
        agent.kill_leftovers()
        assert agent.previous_life == {7} and not record.exists()
        time.sleep(0.2)  # a SIGKILL would have been delivered by now
        assert other.poll() is None
    finally:
        other.kill()
        other.wait(10)


def test_an_attempt_whose_process_group_cannot_be_recorded_never_starts(tmp_path):
    """The agent records each job's process group, so that a restarted agent can kill it; if
    it cannot (a full disk; here a directory in the record's way), the process is killed at
    once and the attempt reported never started, naming the record and the error. The agent
    and the other starts go on."""
    agent = offline_agent(tmp_path, gpus=2)
    in_the_way = tmp_path / "running" / "1.pgid"
    in_the_way.mkdir()
    agent.start_all([run_order(1, 7, "sleep 301"),
                     {**run_order(2, 8, "true"), "gpu_indices": [1]}])  # fmt: skip
    (event,) = agent.outbox
    assert (event["attempt"], event["end"]) == (1, "never_started")
    assert str(in_the_way) in event["detail"] and "Is a directory" in event["detail"]
    assert list(agent.processes) == [2]
    assert agent.processes[2].popen.wait(10) == 0
    import psutil

    assert not [child for child in psutil.Process().children(recursive=True)
                if child.status() != psutil.STATUS_ZOMBIE
                and child.cmdline()[-2:] == ["sleep", "301"]]  # fmt: skip


@pytest.mark.parametrize("interpreter", ["/usr/bin/no-such-python", "/bin/sh\r"])
def test_a_script_whose_interpreter_the_node_lacks_never_starts_naming_it(tmp_path, interpreter):
    """A script whose #! line names an interpreter the node does not have (or ends in a
    carriage return: a script saved on Windows) cannot be exec'd, as if it were missing: it is
    reported never started, naming the interpreter, not run as exit 127 with a log saying the
    script (which is there) was not found. A script whose interpreter is there runs."""
    agent = offline_agent(tmp_path)
    for attempt, first_line in ((1, f"#!{interpreter}"), (2, "#!/bin/sh")):
        script = tmp_path / f"train-{attempt}.sh"
        script.write_text(f"{first_line}\necho trained > trained\n", newline="")
        script.chmod(0o755)
        agent.start(run_order(attempt, attempt, str(script)))
    (event,) = agent.outbox
    assert (event["attempt"], event["end"]) == (1, "never_started")
    assert event["detail"] == INTERPRETER_MISSING.format(
        program=tmp_path / "train-1.sh", interpreter=interpreter, node="n"
    )
    assert list(agent.processes) == [2] and agent.processes[2].popen.wait(10) == 0


@pytest.fixture
def unwritable(tmp_path):
    """Makes a directory the agent's user cannot write in: read-only for a user, immutable for
    root (whom permissions do not stop); undone after the test."""
    made = []

    def make(directory: Path) -> Path:
        directory.mkdir(parents=True)
        if os.geteuid() != 0:
            directory.chmod(0o555)
        elif subprocess.run(["chattr", "+i", str(directory)], capture_output=True).returncode:
            pytest.skip("root, and no chattr +i on this file system")
        made.append(directory)
        return directory

    yield make
    for directory in made:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(directory)], check=True)
        else:
            directory.chmod(0o755)


def test_a_checkpoint_directory_the_job_cannot_write_fails_the_attempt_unstarted(
    tmp_path, unwritable
):
    """The job would run, maybe for hours, and lose its work at its first save (its working
    directory too, by default): it is reported never started, naming the directory and the
    node, and the other starts go on."""
    agent = offline_agent(tmp_path, gpus=2)
    read_only = unwritable(tmp_path / "checkpoints" / "job-7")
    agent.start_all([run_order(1, 7, "touch saved"),
                     {**run_order(2, 8, "touch saved"), "gpu_indices": [1]}])  # fmt: skip
    (event,) = agent.outbox
    assert (event["attempt"], event["end"]) == (1, "never_started")
    assert event["detail"] == CHECKPOINT_DIR_UNWRITABLE.format(path=read_only, node="n")
    assert list(agent.processes) == [2]
    assert agent.processes[2].popen.wait(10) == 0


def test_a_log_tail_starts_at_a_character_and_stays_bounded(tmp_path):
    """A log cut inside a multi-byte character (progress bars, non-English text) does not
    start its tail with a replacement character; binary output and one huge line still give
    at most LOG_TAIL_CHARS characters of text."""
    log = tmp_path / "job.log"
    log.write_bytes(b"x" + "█".encode() * 10_000)
    tail = log_tail(log)
    assert tail == "█" * len(tail) and 0 < len(tail) <= LOG_TAIL_CHARS
    log.write_bytes(bytes(range(256)) * 1000 + b"y" * 1_000_000 + b"\xff\xfe")
    tail = log_tail(log)
    assert tail.endswith("y\ufffd\ufffd") and len(tail) <= LOG_TAIL_CHARS


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--fake-gpus", "0"], "--fake-gpus"),
        (["--fake-gpus", "-1"], "--fake-gpus"),
        (["--fake-gpus", "two"], "--fake-gpus"),
        (["--fake-gpus", "2", "--gpu-type", "H100"], "--gpu-type"),
        (["--gpu-type", "nvidia h100"], "--gpu-type"),
        (["--poll-wait", "-5"], "--poll-wait"),
        (["--poll-wait", "nan"], "--poll-wait"),
        (["--log-level", "verbose"], "--log-level"),
    ],
)
def test_bad_values_on_the_command_line_are_refused_naming_the_flag(args, flag, capsys):
    """Exit 2 and a line naming the flag and the value, at start (not an agent that asks NVML
    when told to fake 0 GPUs, registers a GPU type no share can name, or polls without
    waiting)."""
    with pytest.raises(SystemExit) as stopped:
        parse(["--join-token", "t", *args])
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"gpu-agent: error: argument {flag}: ")
    assert repr(args[-1]) in error


@pytest.mark.parametrize(
    ("variable", "value", "flag"),
    [
        ("AGENT_FAKE_GPUS", "abc", "--fake-gpus"),
        ("AGENT_FAKE_GPUS", "-2", "--fake-gpus"),
        ("AGENT_GPU_TYPE", "A100_80G", "--gpu-type"),
        ("AGENT_POLL_WAIT", "ten", "--poll-wait"),
        ("AGENT_LOG_LEVEL", "chatty", "--log-level"),
    ],
)
def test_bad_values_in_the_environment_are_refused_like_the_flag_s(
    variable, value, flag, monkeypatch, capsys
):
    """The same from the environment variable that stands for the flag (not a traceback)."""
    monkeypatch.setenv(variable, value)
    with pytest.raises(SystemExit) as stopped:
        parse(["--join-token", "t"])
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"gpu-agent: error: argument {flag}: ") and repr(value) in error


def test_a_log_level_is_taken_in_any_case():
    """`--log-level debug` is DEBUG (Python's logging knows only the upper-case names)."""
    assert parse(["--log-level", "debug"]).log_level == "DEBUG"
    assert parse(["--log-level", "Warning"]).log_level == "WARNING"


def test_no_fake_gpus_in_the_environment_still_means_nvml(monkeypatch):
    """AGENT_FAKE_GPUS=0 (the documented default) or empty: the agent asks NVML."""
    for value in ("0", ""):
        monkeypatch.setenv("AGENT_FAKE_GPUS", value)
        assert not parse(["--join-token", "t"]).fake_gpus
    monkeypatch.setenv("AGENT_FAKE_GPUS", "4")
    assert parse(["--join-token", "t"]).fake_gpus == 4


def test_an_agent_told_to_fake_no_gpus_says_so_and_exits_2(tmp_path):
    """The whole command: one line of usage and one of error, no traceback, nothing started."""
    started = subprocess.run(
        [sys.executable, "-m", "scheduler.agent", "--portal", "http://127.0.0.1:9",
         "--join-token", "t", "--fake-gpus", "0", "--gpu-type", "h100",
         "--work-dir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert started.returncode == 2 and "Traceback" not in started.stderr
    assert started.stderr.splitlines()[-1].startswith("gpu-agent: error: argument --fake-gpus: ")
    assert not (tmp_path / "work").exists()
