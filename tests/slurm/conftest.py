"""A real Slurm cluster for the tests: Debian's slurmctld, slurmd and munge, brought up on this
machine by scripts/slurm_up.sh (4 nodes of 8 h100 GPUs backed by fake device files, partition
`gpu`). It is started once, if it is not up, and put back in order before each test: no job,
every node idle, the controller running. SLURM_TEST_DIR and SLURM_TEST_PORT_BASE choose where
it lives (a cluster of one's own beside another)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.live import ROOT, wait_for

NODES = ("node1", "node2", "node3", "node4")


@dataclass
class SlurmCluster:
    directory: Path
    env: dict[str, str]

    @property
    def conf(self) -> str:
        return str(self.directory / "slurm.conf")

    def script(self, command: str) -> None:
        subprocess.run(["bash", str(ROOT / "scripts" / "slurm_up.sh"), command], env=self.env,
                       check=True, capture_output=True, timeout=120)  # fmt: skip

    def run(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(args, env={**self.env, "SLURM_CONF": self.conf},
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)}: {done.stderr or done.stdout}")
        return done.stdout

    def jobs(self) -> list[dict]:
        """The jobs Slurm still lists (ended ones too), as {id, name, state, nodes}."""
        text = self.run("squeue", "-h", "--states=all", "-O", "JobID:|,Name:|,State:|,NodeList:|")
        rows = [line.split("|") for line in text.splitlines() if line.strip()]
        return [{"id": r[0], "name": r[1], "state": r[2], "nodes": r[3]} for r in rows]

    def active(self) -> list[dict]:
        return [j for j in self.jobs() if j["state"] in ("PENDING", "RUNNING", "COMPLETING")]

    def node_states(self) -> dict[str, str]:
        text = self.run("sinfo", "-N", "-h", "-O", "NodeList:|,StateLong:|")
        return dict(line.split("|")[:2] for line in text.splitlines() if line.strip())

    def reset(self) -> None:
        """No job, every node idle, the partition up."""
        self.run("scontrol", "update", "partitionname=gpu", "state=up", check=False)
        self.run("scancel", "--partition=gpu", check=False)
        wait_for(lambda: not self.active(), timeout=60, what="Slurm's jobs gone")
        for node, state in self.node_states().items():
            if state != "idle":
                self.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
        wait_for(lambda: set(self.node_states().values()) == {"idle"}, timeout=60,
                 what="Slurm's nodes idle")  # fmt: skip


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    directory = Path(os.environ.get("SLURM_TEST_DIR", "/tmp/gpu-portal-slurm"))
    env = {**os.environ, "SLURM_DIR": str(directory), "SLURM_NODES": str(len(NODES)),
           "SLURM_GPUS": "8", "SLURM_GRES_TYPE": "h100",
           "SLURM_PORT_BASE": os.environ.get("SLURM_TEST_PORT_BASE", "16817")}  # fmt: skip
    cluster = SlurmCluster(directory, env)
    try:
        cluster.script("start")
    except subprocess.CalledProcessError as error:
        message = f"could not bring up Slurm (scripts/slurm_up.sh): {error.stderr.decode()[-2000:]}"
        if os.environ.get("CI"):
            raise AssertionError(message) from None
        pytest.skip(message)  # outside CI only: a machine without Slurm's packages, not root
    return cluster


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> SlurmCluster:
    """The cluster, controller running, with no job and every node idle, before and after."""
    slurm_cluster.script("start")
    slurm_cluster.reset()
    yield slurm_cluster
    slurm_cluster.script("start")  # a test that stopped the controller
    slurm_cluster.reset()
