"""scripts/gpu_check.py, the agent's check on a real GPU node, kept working where no GPU is:
with `--fake-gpu` it runs every step of the check (its own portal on SQLite and the embedded
Redis, the agent, two preemptions and a resume) with fake GPUs and jobs that do not use CUDA,
so only the GPU-specific checks are left out."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.live import ROOT

pytestmark = [pytest.mark.live, pytest.mark.slow]


def test_the_gpu_check_passes_on_fake_gpus(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    done = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "--fake-gpu", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    summary = json.loads((tmp_path / "gpu_check.json").read_text())
    assert done.returncode == 0 and summary["failed"] == 0, done.stdout[-4000:]
    checked = {c["check"] for c in summary["checks"]}
    assert {
        "the preempted job resumes from its checkpoint",
        "the job that ignores SIGTERM is killed after the grace period",
        "the preemptor of a job that ignores SIGTERM succeeds",
    } <= checked
    assert (tmp_path / "logs.txt").read_text().count("agent[gpu-node]") > 0
