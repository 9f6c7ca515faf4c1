"""What the Slurm connector tells the portal about its nodes' GPUs, on the real Slurm cluster of
tests/slurm/conftest.py. The connector is driven step by step here, without a portal: its
readings of the nodes (sinfo, every 2 s when it runs) and of the jobs (squeue) come at their
own times, and the inventory it sends must be right in between."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from scheduler.agent.connector import Attempt, Connector
from scheduler.agent.protocol import END_EXIT
from scheduler.agent.slurm import SlurmCluster
from tests.live import wait_for

pytestmark = pytest.mark.live


def outside(connector: Connector, node: str) -> int:
    return next(n["outside_gpus"] for n in connector._inventory() if n["name"] == node)


def test_a_just_ended_attempts_gpus_are_not_taken_for_a_foreign_jobs(slurm, tmp_path):
    """Between an attempt's end and the next reading of the nodes, that reading still counts
    its GPUs as used: they are free, not held outside the portal (the portal would otherwise
    not place the owner on the GPUs its victim released, and preempt another borrower)."""
    cluster = SlurmCluster(partitions=("gpu",), env={"SLURM_CONF": slurm.conf},
                           script_dir=tmp_path / "scripts")  # fmt: skip
    connector = Connector(portal="http://127.0.0.1:9", join_token="unused", name="test",
                          cluster=cluster, work_dir=tmp_path / "work",
                          checkpoint_root=tmp_path / "checkpoints")  # fmt: skip
    sbatch = ["sbatch", "--parsable", "--partition=gpu", "--nodelist=node1", "--gres=gpu:8",
              "--output=/dev/null", "--wrap", "sleep 300"]  # fmt: skip
    job_id = slurm.run(*sbatch).strip()
    wait_for(lambda: any(j["id"] == job_id and j["state"] == "RUNNING" for j in slurm.jobs()),
             what="the job running")  # fmt: skip

    def read_used() -> int:
        connector.read_inventory()
        return connector.nodes["node1"].used_gpus

    wait_for(lambda: read_used() == 8, what="sinfo counting the job's GPUs")
    assert outside(connector, "node1") == 8  # not the portal's: a foreign job's
    connector.attempts[1] = Attempt(id=1, order={}, job_id=job_id,
                                    running_since=time.monotonic(), nodes=("node1",),
                                    gpus_per_node=8)  # fmt: skip
    assert outside(connector, "node1") == 0  # the portal's own attempt
    slurm.run("scancel", job_id)
    wait_for(lambda: not slurm.active(), what="the job ended")
    connector._end(1, end=END_EXIT, exit_code=0)
    assert connector.nodes["node1"].used_gpus == 8  # the reading from before the end
    assert outside(connector, "node1") == 0
    wait_for(lambda: read_used() == 0, what="sinfo seeing the GPUs free")
    assert outside(connector, "node1") == 0 and connector.ended_since_inventory == []


def test_the_connector_refuses_at_start_what_slurm_does_not_have(slurm):
    """A partition Slurm has not (sinfo would list nothing for it, and the portal get no node)
    and a SLURM_CONF that is no file (Slurm's commands would retry reading it for a minute):
    exit 2 and one line saying which, before registering anything (a connector that started
    would run on: the timeout fails the test)."""

    def start(conf: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "scheduler.agent", "slurm", "--portal", "http://127.0.0.1:9",
             "--join-token", "t", *args], env={**os.environ, "SLURM_CONF": conf},
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    typo = start(slurm.conf, "--partition", "gpu,gpus", "--name", "x")
    assert (typo.returncode, typo.stderr) == (
        2, "error: --partition: Slurm has no partition gpus (sinfo --all lists those it has).\n"
    )  # fmt: skip
    missing = start(slurm.conf + ".missing", "--partition", "gpu")
    assert missing.returncode == 2
    assert missing.stderr.startswith(f"error: SLURM_CONF={slurm.conf}.missing: no such file")
