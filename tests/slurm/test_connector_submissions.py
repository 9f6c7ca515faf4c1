"""How the Slurm connector submits the attempts whose starts the portal granted, on the real Slurm
cluster of tests/slurm/conftest.py: one sbatch at a time, and the portal's answers applied in
between, so a stop order never waits for a long batch of submissions, and one that comes before
its attempt is submitted wins. The connector is driven step by step without a portal: the grants
and a poll's answer are put where its start request and its poller put them."""

from __future__ import annotations

from uuid import uuid4

import pytest

from scheduler.agent.connector import Connector
from scheduler.agent.protocol import END_NEVER_STARTED
from scheduler.agent.slurm import SlurmCluster

pytestmark = pytest.mark.live


def order(attempt: int, node: str) -> dict:
    return {"attempt": attempt, "job": 100 + attempt, "number": 1, "share": "research",
            "command": "sleep 300", "working_dir": "", "grace_seconds": 0,
            "nodes": [{"node": node, "gpu_indices": [0]}]}  # fmt: skip


class _AnswerAfterFirstSubmission(SlurmCluster):
    """Slurm, and a poll's answer that arrives while the connector's first sbatch runs."""

    connector: Connector
    answer: tuple[int, dict] | None = None

    def submit(self, order: dict, *, env: dict, log) -> str:
        job_id = super().submit(order, env=env, log=log)
        if self.answer is not None:
            self.connector.answers.put(self.answer)
            self.answer = None
        return job_id


def test_a_stop_that_comes_while_granted_attempts_are_submitted_goes_first_and_wins(
    slurm, tmp_path
):
    """Three starts granted together. While the first is submitted, a poll brings the stop of
    the third (ordered after the grant: a reclaim). The connector applies it before the next
    sbatch: the third never reaches Slurm and is reported never started, and the second is
    submitted after it. Meanwhile its polls list all three as running, so the portal does not
    order their starts again."""
    # A prefix of this run's own: the connector adopts the jobs of its prefix that squeue still
    # lists (other tests' and earlier runs' ended ones among them).
    cluster = _AnswerAfterFirstSubmission(partitions=("gpu",), prefix=f"submit{uuid4().hex[:8]}",
                                          env={"SLURM_CONF": slurm.conf},
                                          script_dir=tmp_path / "scripts")  # fmt: skip
    connector = Connector(portal="http://127.0.0.1:9", join_token="unused", name="test",
                          cluster=cluster, work_dir=tmp_path / "work",
                          checkpoint_root=tmp_path / "checkpoints")  # fmt: skip
    cluster.connector = connector
    cluster.answer = (1, {"run": [], "stop": [{"attempt": 3, "grace_seconds": 0, "started": True}]})
    connector.cluster_ok.set()
    with connector.lock:  # as the answer to the start request leaves them
        connector.granted.update({k: order(k, f"node{k}") for k in (1, 2, 3)})

    connector.step()  # submits 1; the answer arrives meanwhile, so 2 waits
    assert (set(connector.attempts), set(connector.granted)) == ({1}, {2, 3})
    assert connector._poll_body([], [])["running"] == [1, 2, 3]

    connector.step()  # applies the answer (3 never starts), then submits 2
    assert (set(connector.attempts), connector.granted) == ({1, 2}, {})
    assert [(e["type"], e["attempt"], e["end"], e["detail"]) for e in connector.outbox] == [
        ("exited", 3, END_NEVER_STARTED, "stopped before it started")
    ]
    names = {job["name"] for job in slurm.active()}
    assert names == {cluster.job_name(order(k, "")) for k in (1, 2)}
