"""An agent that talks to no portal (tests of what it does with the orders it is handed), and
the run orders it is handed."""

from __future__ import annotations

from pathlib import Path

from scheduler.agent.core import Agent
from scheduler.agent.gpus import fake_gpus

NO_PORTAL = "http://127.0.0.1:9"  # the discard port: nothing answers


def offline_agent(work_dir: Path, *, portal: str = NO_PORTAL, gpus: int = 1, **options) -> Agent:
    """A node agent with `gpus` fake h100, its state under `work_dir`."""
    return Agent(portal=portal, join_token="x", name="n", gpu_type="h100",
                 gpus=fake_gpus(gpus, "h100"), work_dir=work_dir,
                 checkpoint_root=work_dir / "checkpoints", **options)  # fmt: skip


def run_order(attempt: int, job: int, command: str) -> dict:
    """The portal's order to run attempt 1 of `job` as `attempt` on GPU 0."""
    return {"attempt": attempt, "job": job, "number": 1, "command": command, "env": {},
            "gpu_indices": [0], "timeout_seconds": None, "grace_seconds": 0}  # fmt: skip
