"""`make run` as a newcomer runs it (scripts/run.py, SQLite and the embedded Redis under a var
directory of its own): the agents start only once the web server answers (none logs that the
portal is unreachable), it names where to log in at the address it was given, and Ctrl-C
stops every process it started, the embedded Redis included."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import psutil
import pytest
import requests

from tests.live import ROOT, free_port, wait_for

pytestmark = pytest.mark.live


def test_make_run_starts_agents_after_the_web_server_and_ctrl_c_stops_everything(tmp_path):
    port = free_port()
    var = tmp_path / "var"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env |= {"PORTAL_VAR_DIR": str(var), "PORTAL_ADDRESS": f"127.0.0.1:{port}",
            "DEMO_WORKLOAD": "0", "PYTHONUNBUFFERED": "1"}  # fmt: skip
    log = open(tmp_path / "run.log", "wb")  # noqa: SIM115 — closed below
    run = subprocess.Popen([sys.executable, "scripts/run.py"], cwd=ROOT, env=env, stdout=log,
                           stderr=subprocess.STDOUT)  # fmt: skip
    try:
        registered = "registered as node-l4-1"
        wait_for(lambda: registered in (tmp_path / "run.log").read_text(), timeout=180,
                 what="the demo agents to register")  # fmt: skip
        assert requests.get(f"http://127.0.0.1:{port}/health/", timeout=5).ok
        started = psutil.Process(run.pid).children(recursive=True)
        programs = " ".join(" ".join(command_line(p)) for p in started)
        assert "redis-server" in programs and "scheduler.agent" in programs, programs

        run.send_signal(signal.SIGINT)
        run.wait(timeout=60)
        _, alive = psutil.wait_procs(started, timeout=20)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        if run.poll() is None:
            run.kill()
        log.close()
    output = (tmp_path / "run.log").read_text()
    assert "unreachable" not in output, output[-3000:]
    # Where to log in, and with what: at the address it was given, not the default one.
    assert f"Portal at http://127.0.0.1:{port}/admin/" in output
    assert re.search(r"Log in to the admin as admin / \S+", output)
    assert set(re.findall(r"http://127\.0\.0\.1:(\d+)", output)) == {str(port)}


def command_line(process: psutil.Process) -> list[str]:
    """The process's command line; none for one that ended since it was listed (a short-lived
    child, not reaped yet: psutil refuses a zombie's)."""
    try:
        return process.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return []
