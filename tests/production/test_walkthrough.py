"""docs/walkthrough.md as a newcomer follows it: `DEMO_WORKLOAD=0 make run` (scripts/run.py,
SQLite and the embedded Redis under a var directory of its own), a token for bob and for carol
from manage.py, then docs/walkthrough.py: borrowing, the owner's reclaim, and the borrower
resuming from its checkpoint, as the page says it goes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from tests.live import ROOT, free_port, wait_for

pytestmark = [pytest.mark.live, pytest.mark.slow]

# What the page shows of each step, in order (the job ids and step numbers may differ).
EXPECTED = [
    r"1\. Three shares, one per strategy",
    r"   research   LEND_AND_BORROW  \{'h100': 8, 'l4': 2\}",
    r"   vision     LEND             \{'h100': 8\}",
    r"2\. ml-research borrows vision's idle H100s for a background run",
    r"   job \d+ RUNNING on 16 h100",
    r"   vision     h100  limit  8  own  0  borrowed  0  lent  8",
    r"   research   h100  limit  8  own  8  borrowed  8  lent  0",
    r"3\. vision's own high-priority job arrives and reclaims its GPUs",
    r"   job \d+ preempted 1 time\(s\): .+",
    r"   attempt 1 stopped for job \d+",
    r"   job \d+ RUNNING",
    r"   vision     h100  limit  8  own  8  borrowed  0  lent  0",
    r"4\. The owner's job ends; the borrower resumes from its checkpoint",
    r"   job \d+ RUNNING, attempt 2",
    r"   log: job \d+ attempt 2 on GPUs [\d,]+: step [1-9]\d*",
    r"   job \d+ cancelled: the walkthrough is over",
]


def test_the_walkthrough_runs_as_its_page_says(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env |= {"PORTAL_VAR_DIR": str(tmp_path / "var"), "PORTAL_ADDRESS": f"127.0.0.1:{port}",
            "DEMO_WORKLOAD": "0", "PYTHONUNBUFFERED": "1"}  # fmt: skip
    log = open(tmp_path / "run.log", "wb")  # noqa: SIM115 — closed below
    run = subprocess.Popen([sys.executable, "scripts/run.py"], cwd=ROOT, env=env, stdout=log,
                           stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_for(lambda: all(f"registered as {node}" in (tmp_path / "run.log").read_text()
                             for node in ("node-h100-0", "node-h100-1")),
                 timeout=180, what="the demo agents to register")  # fmt: skip
        tokens = {}
        for user in ("bob", "carol"):
            made = subprocess.run(
                [sys.executable, "manage.py", "drf_create_token", user], cwd=ROOT, env=env,
                capture_output=True, text=True, check=True, timeout=60,
            )  # fmt: skip
            tokens[user] = re.search(r"[0-9a-f]{40}", made.stdout).group()
        walked = subprocess.run(
            [sys.executable, "docs/walkthrough.py"], cwd=ROOT, capture_output=True, text=True,
            timeout=400, env={**env, "PORTAL_URL": f"http://127.0.0.1:{port}",
                              "BOB_TOKEN": tokens["bob"], "CAROL_TOKEN": tokens["carol"]},
        )  # fmt: skip
    finally:
        run.send_signal(signal.SIGINT)
        try:
            run.wait(timeout=60)
        except subprocess.TimeoutExpired:
            run.kill()
        log.close()
    assert walked.returncode == 0, walked.stdout + walked.stderr
    lines = iter(walked.stdout.splitlines())
    for pattern in EXPECTED:  # in this order, other lines between them
        assert any(re.fullmatch(pattern, line) for line in lines), (pattern, walked.stdout)
