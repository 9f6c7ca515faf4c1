"""scripts/demo_job.py, the job of `make run`'s demo, the walkthrough and the live tests: a gang
runs it on each of its nodes in one checkpoint directory, and none of them may fail for it."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.live import JOB_SCRIPT


def test_the_processes_of_a_gang_checkpoint_into_one_directory_without_failing(tmp_path):
    """Each checkpoints after every step; with one shared temporary file, one process renamed
    away the file another was about to rename, and died of it (the walkthrough's gang job
    FAILED so in CI)."""
    env = {**os.environ, "CHECKPOINT_DIR": str(tmp_path), "JOB_ID": "1", "ATTEMPT": "1"}
    command = [sys.executable, str(JOB_SCRIPT), "--steps", "1500", "--step-seconds", "0.0005"]
    gang = [subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True) for _ in range(3)]  # fmt: skip
    for process in gang:
        _, errors = process.communicate(timeout=120)
        assert process.returncode == 0, errors
    assert (tmp_path / "checkpoint").read_text() == "1500"
    assert not list(tmp_path.glob("*.tmp"))
