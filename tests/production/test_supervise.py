"""The supervisor of `make run` and `gpu-portal-server serve`: when one process ends, the rest are
stopped, the last started first, so that an agent never outlives the web server it talks to (it
would log that the portal is unreachable at every Ctrl-C)."""

from __future__ import annotations

import subprocess
import sys

from portal.server import supervise

# On SIGTERM, a "web" that writes whether its agent (pid in argv[2]) is still alive.
WEB = """
import os, signal, sys, time
def stop(*_):
    try:
        os.kill(int(sys.argv[2]), 0)
        seen = "agent alive"
    except ProcessLookupError:
        seen = "agent gone"
    open(sys.argv[1], "w").write(seen)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(60)
"""

# An agent that takes a moment to stop after SIGTERM (it flushes its outbox).
AGENT = """
import signal, sys, time
def stop(*_):
    time.sleep(0.5)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(60)
"""

# Exits at once with code 3, as a web server that cannot bind its port.
FAILING = "import sys; sys.exit(3)"


def start(program: str, *args: str) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", program, *args], stdout=subprocess.PIPE,
                               text=True)  # fmt: skip
    if program != FAILING:
        assert process.stdout.readline().strip() == "ready"  # its handler is in place
    return process


def test_when_one_process_ends_the_rest_stop_the_last_started_first(tmp_path):
    seen = tmp_path / "seen"
    agent = start(AGENT)
    web = start(WEB, str(seen), str(agent.pid))
    # Listed in make run's order: web, then its agent (spawned first here only so that the web
    # process can be given its pid), then one that fails.
    failing = start(FAILING)
    processes = {"web": web, "agent": agent, "failing": failing}

    exit_code = supervise(processes, interval=0.05)

    assert exit_code == 3  # the exit code of the process that ended first
    assert all(process.poll() is not None for process in processes.values())
    assert seen.read_text() == "agent gone"
