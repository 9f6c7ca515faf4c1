"""Every benchmark that fits in a test still runs: each script under bench/, with the smallest
counts it takes, exits as it should and prints its figures. A bench that rots (bench/reclaim.py
timed out for weeks once the churn breaker kept its borrowers off borrowed GPUs) fails here,
not when a session needs its figures. Not here, for their length even at their smallest:
bench/slurm.py and bench/kubernetes.py (their live tests drive the same connectors) and
bench/soak.py (whose machinery bench/agents.py and bench/kueue_baseline.py run).

Slow: `make test-slow`, which CI runs. The benches that need PostgreSQL take the server of the
suite's DATABASE_URL (each makes a scratch database of its own) and are skipped without one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# (script, arguments, whether it needs PostgreSQL, a line of its figures, exit codes)
BENCHES = [
    # Six reclaims: enough for the churn breaker to hold a borrower, were it on.
    ("reclaim.py", ["--reclaims", "6"], False, "submit → borrower SIGTERM", (0,)),
    ("engine.py", ["--runs", "1", "--seeds", "1"], False, "x base", (0,)),
    ("plan_hash.py", ["--seeds", "1"], False, "plans, sha256", (0,)),
    ("gang_report.py", ["--runs", "1", "--reports", "1", "--nodes", "1,8"], False,
     "the 1-node gang's", (0,)),
    ("eta.py", ["--seeds", "1", "--jobs", "100"], False, "perfect knowledge", (0,)),
    ("estimate.py", ["--seeds", "1", "--runs", "1"], False, "estimate refresh", (0,)),
    ("agent_starts.py", ["--processes", "4", "--runs", "1", "--load", "1"], False,
     "ratio before / now", (0,)),
    ("strategies.py", ["--jobs", "200", "--seeds", "1"], False, "against every share RESERVE",
     (0,)),
    ("simulate.py", ["--jobs", "500", "--baseline-jobs", "500", "--runs", "1"], False,
     "per-job time", (0,)),
    ("dashboard.py", ["--days", "1", "--shares", "2", "--runs", "1"], False, "× baseline", (0,)),
    ("cycle.py", ["--runs", "1", "--nodes", "20", "--jobs", "200", "--finish", "10"], True,
     "ratio placing cycle / plan alone", (0,)),
    ("api.py", ["--runs", "1", "--seconds", "1"], True, "submits/s", (0,)),
    # It exits 1 while its goal (issue 19's ratio) is missed.
    ("aws_api.py", ["--quick"], True, "aws refused submits", (0, 1)),
    ("kueue_baseline.py", ["--scale", "0.05", "--runs", "1"], True,
     "first submit → last finish", (0,)),
    ("agents.py", ["--agents", "20", "--seconds", "5", "--warmup", "10"], True,
     "stop order → agent p99", (0,)),
]  # fmt: skip


def _postgres() -> str | None:
    url = os.environ.get("DATABASE_URL", "")
    return url if url.startswith(("postgres://", "postgresql://")) else None


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "arguments", "needs_postgres", "figures", "codes"),
    BENCHES,
    ids=[script for script, *_ in BENCHES],
)
def test_the_bench_runs_and_prints_its_figures(script, arguments, needs_postgres, figures, codes):
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    if needs_postgres:
        if _postgres() is None:
            pytest.skip(f"bench/{script} needs PostgreSQL: DATABASE_URL=postgres://...")
        env["DATABASE_URL"] = _postgres()
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), *arguments],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode in codes, output[-4000:]
    assert figures in output, output[-4000:]
