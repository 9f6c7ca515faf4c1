"""What the Slurm connector leaves in Slurm's queue: nothing that could run outside the portal.
On the real Slurm cluster of tests/slurm/conftest.py, the connector driven step by step without
a portal (the grants and a poll's answer are put where its start request and its poller put
them; what it reports is read from its outbox).

The connector submits with --no-requeue, so Slurm requeues one of its jobs only where the site
makes it (a prolog that failed, with PrologFlags=ForceRequeueOnFail; `--sbatch-arg=--requeue`)
or an operator does: here the operator sets the job's Requeue flag and requeues it by hand."""

from __future__ import annotations

from uuid import uuid4

import pytest

from scheduler.agent.connector import Connector
from scheduler.agent.protocol import END_EXIT, END_LOST, END_NEVER_STARTED
from scheduler.agent.slurm import SlurmCluster
from tests.live import wait_for

pytestmark = pytest.mark.live


class _RecordedSlurm(SlurmCluster):
    """Slurm, and every command the connector gave it."""

    commands: list[tuple[str, ...]]

    def _run(self, *args: str) -> str:
        self.commands.append(args)
        return super()._run(*args)

    def signals(self) -> list[tuple[str, ...]]:
        return [c for c in self.commands if c[0] == "scancel" and "--signal=TERM" in c]


def order(attempt: int, node: str, command: str = "sleep 300") -> dict:
    return {"attempt": attempt, "job": 100 + attempt, "number": 1, "share": "research",
            "command": command, "working_dir": "", "grace_seconds": 0,
            "nodes": [{"node": node, "gpu_indices": [0]}]}  # fmt: skip


def connector_on(slurm, tmp_path, *, pending_timeout: float = 60.0) -> Connector:
    # A prefix of this test's own: squeue still lists other tests' ended jobs.
    cluster = _RecordedSlurm(partitions=("gpu",), prefix=f"left{uuid4().hex[:8]}",
                             env={"SLURM_CONF": slurm.conf},
                             script_dir=tmp_path / "scripts")  # fmt: skip
    cluster.commands = []
    connector = Connector(portal="http://127.0.0.1:9", join_token="unused", name="test",
                          cluster=cluster, work_dir=tmp_path / "work",
                          checkpoint_root=tmp_path / "checkpoints",
                          pending_timeout=pending_timeout)  # fmt: skip
    connector.cluster_ok.set()
    return connector


def granted(connector: Connector, *orders: dict) -> None:
    with connector.lock:  # as the answer to the start request leaves them
        connector.granted.update({o["attempt"]: o for o in orders})


def step_until(connector: Connector, check, *, what: str, timeout: float = 60):
    def stepped():
        connector.step()
        return check()

    return wait_for(stepped, timeout=timeout, what=what)


def running(connector: Connector, attempt: int) -> str:
    """Step until the attempt's Slurm job runs and its start is reported; its Slurm job id."""
    step_until(connector, lambda: (t := connector.attempts.get(attempt)) and t.started_reported,
               what=f"attempt {attempt} running")  # fmt: skip
    return connector.attempts[attempt].job_id


def exits(connector: Connector) -> list[dict]:
    return [e for e in connector.outbox if e["type"] == "exited"]


def slurm_state(slurm, job_id: str) -> str:
    return slurm.run("squeue", "-h", "--states=all", "-j", job_id, "-O", "State").strip()


def test_a_job_slurm_requeues_after_it_ran_ends_the_attempt_lost_and_is_cancelled(slurm, tmp_path):
    """The attempt's Slurm job runs, and Slurm requeues it (pending again, its processes gone):
    the attempt ends lost (the portal runs the job again as a new attempt, as after a node
    failure) and the Slurm job is cancelled with a plain scancel, never signalled (Slurm
    refuses to signal a pending job) and never left to run again outside the portal."""
    connector = connector_on(slurm, tmp_path, pending_timeout=2)
    granted(connector, order(1, "node1"))
    job_id = running(connector, 1)
    slurm.run("scontrol", "update", f"jobid={job_id}", "requeue=1")
    slurm.run("scontrol", "requeue", job_id)

    step_until(connector, lambda: 1 not in connector.attempts, what="the attempt's end")
    (exited,) = exits(connector)
    assert (exited["attempt"], exited["end"]) == (1, END_LOST)
    assert f"Slurm requeued job {job_id}" in exited["detail"]
    step_until(connector, lambda: slurm_state(slurm, job_id) == "CANCELLED",
               what=f"Slurm job {job_id} cancelled")  # fmt: skip
    assert connector.cluster.signals() == []


def test_a_job_slurm_holds_as_special_exit_when_its_attempt_ends_is_cancelled(slurm, tmp_path):
    """The site's EpilogSlurmctld requeues the ended job held (SPECIAL_EXIT; here by hand): the
    attempt ends with its process's exit, and the connector cancels the held job, which an
    operator's `scontrol release` would run again outside the portal, double-booking its GPUs."""
    connector = connector_on(slurm, tmp_path)
    granted(connector, order(1, "node2"))
    job_id = running(connector, 1)
    slurm.run("scontrol", "update", f"jobid={job_id}", "requeue=1")
    slurm.run("scontrol", "requeuehold", "state=SpecialExit", job_id)

    step_until(connector, lambda: 1 not in connector.attempts, what="the attempt's end")
    (exited,) = exits(connector)
    assert (exited["attempt"], exited["end"]) == (1, END_EXIT)
    step_until(connector, lambda: slurm_state(slurm, job_id) == "CANCELLED",
               what=f"Slurm job {job_id} cancelled")  # fmt: skip


def test_the_job_of_an_ended_attempt_requeued_and_released_by_an_operator_is_cancelled(
    slurm, tmp_path
):
    """The attempt succeeded; later an operator requeues its finished Slurm job held and
    releases it: the connector cancels it before Slurm runs it again outside the portal."""
    connector = connector_on(slurm, tmp_path)
    granted(connector, order(1, "node3", command="sleep 3"))
    job_id = running(connector, 1)
    slurm.run("scontrol", "update", f"jobid={job_id}", "requeue=1")
    step_until(connector, lambda: 1 not in connector.attempts, what="the attempt's end")
    (exited,) = exits(connector)
    assert (exited["end"], exited["exit_code"]) == (END_EXIT, 0)

    slurm.run("scontrol", "requeuehold", job_id)
    slurm.run("scontrol", "release", job_id)
    step_until(connector, lambda: slurm_state(slurm, job_id) == "CANCELLED",
               what=f"Slurm job {job_id} cancelled")  # fmt: skip
    assert len(exits(connector)) == 1  # nothing more to report of the attempt


def test_a_stop_of_an_attempt_whose_job_slurm_keeps_pending_is_a_plain_scancel(slurm, tmp_path):
    """Slurm keeps the attempt's job pending (its partition is down) and the portal stops the
    attempt (a reclaim): the job is cancelled at once with a plain scancel, never signalled,
    and the attempt ends never started."""
    connector = connector_on(slurm, tmp_path)
    slurm.run("scontrol", "update", "partitionname=gpu", "state=down")
    granted(connector, order(1, "node4"))
    step_until(connector, lambda: connector.attempts[1].state == "PENDING",
               what="the Slurm job pending")  # fmt: skip
    job_id = connector.attempts[1].job_id
    stop = {"attempt": 1, "grace_seconds": 30, "started": False}
    connector.answers.put((1, {"run": [], "stop": [stop]}))

    step_until(connector, lambda: 1 not in connector.attempts, what="the attempt's end")
    (exited,) = exits(connector)
    assert (exited["attempt"], exited["end"]) == (1, END_NEVER_STARTED)
    assert ("scancel", job_id) in connector.cluster.commands
    assert connector.cluster.signals() == []
