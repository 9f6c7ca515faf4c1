"""Which GPU indices the Slurm connector tells the portal a started attempt was given, on the
real Slurm cluster of tests/slurm/conftest.py. A one-node job's batch script records Slurm's
SLURM_JOB_GPUS in the work directory, so its start costs no `scontrol` (one Slurm command
fewer per job); a gang, or a job whose record does not come, is asked of slurmctld. And what the
batch script leaves in the work directory (nothing once sbatch has it), and where it starts the
job's command (the working directory the job names, else its checkpoint directory)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from scheduler.agent.slurm import GPUS_RECORD_WAIT_SECONDS, SlurmCluster, SlurmUnreachable
from tests.live import wait_for

pytestmark = pytest.mark.live


@pytest.fixture
def cluster(slurm, tmp_path) -> SlurmCluster:
    # Its own prefix: squeue lists these jobs for MinJobAge after the test, and a later
    # test's connector (prefix "portal") must not take them for attempts of its own.
    env = {"SLURM_CONF": slurm.conf}
    return SlurmCluster(partitions=("gpu",), prefix="gpus-test", env=env,
                        script_dir=tmp_path / "scripts")  # fmt: skip


def submit(cluster: SlurmCluster, attempt: int, nodes: dict[str, int], command: str,
           working_dir: str = "") -> str:  # fmt: skip
    """sbatch attempt `attempt` as the connector does, on `nodes` (node → GPUs)."""
    order = {"attempt": attempt, "job": 100 + attempt, "number": 1, "share": "research",
             "command": command, "working_dir": working_dir, "grace_seconds": 2,
             "nodes": [{"node": node, "gpu_indices": list(range(gpus))}
                       for node, gpus in nodes.items()]}  # fmt: skip
    work = cluster.script_dir.parent
    return cluster.submit(order, env={"CHECKPOINT_DIR": str(work / f"checkpoint-{attempt}")},
                          log=work / f"log-{attempt}")  # fmt: skip


def running(cluster: SlurmCluster, job_id: str):
    return wait_for(lambda: next((j for j in cluster.jobs() if j.id == job_id and j.holding),
                                 None), what=f"Slurm job {job_id} running")  # fmt: skip


def test_a_one_node_job_reports_the_gpus_slurm_gave_without_asking_slurmctld(
    slurm, cluster, tmp_path
):
    """The foreign job holds GPUs 0-2 of node2, so Slurm gives the attempt 3-4: what the job
    sees in CUDA_VISIBLE_DEVICES is what the connector reports, read from the batch script's
    record even once slurmctld cannot be asked."""
    slurm.run("sbatch", "--parsable", "-p", "gpu", "--nodelist=node2", "--gres=gpu:3",
              "-o", "/dev/null", "--wrap", "sleep 300")  # fmt: skip
    seen = tmp_path / "seen"
    job_id = submit(cluster, 7, {"node2": 2}, f'echo "$CUDA_VISIBLE_DEVICES" > {seen}; sleep 300')
    job = running(cluster, job_id)
    wait_for(lambda: seen.exists() and seen.read_text().strip(), what="the job's process")
    # slurmctld unreachable: the cluster's configuration, with a port nothing listens on
    # (Slurm's commands give up after its MessageTimeout; without a configuration file they
    # would look for one in DNS for a minute).
    closed = tmp_path / "closed-slurm.conf"
    closed.write_text(re.sub(r"(?m)^SlurmctldPort=.*$", "SlurmctldPort=1",
                             Path(slurm.conf).read_text()))  # fmt: skip
    cluster.env = {"SLURM_CONF": str(closed)}
    described = cluster.describe(job, waited=0.0)
    assert described == {"id": job_id, "allocations": [{"node": "node2", "gpu_indices": [3, 4]}]}
    assert seen.read_text().strip() == "3,4"
    with pytest.raises(SlurmUnreachable):
        cluster.jobs()  # it was indeed not asked


def test_without_a_record_the_connector_waits_then_asks_slurmctld(cluster):
    """A record that does not come (a work directory the node cannot write) delays the start's
    report by at most GPUS_RECORD_WAIT_SECONDS; then scontrol tells the indices."""
    job_id = submit(cluster, 8, {"node3": 2}, "sleep 300")
    job = running(cluster, job_id)
    record = cluster.script_dir / "attempt-8.gpus"
    wait_for(record.exists, what="the batch script's record")
    record.write_text("0 5,6\n")  # another Slurm job's record (ids start at 1): not this job's
    assert cluster.describe(job, waited=0.0) is None
    expected = {"id": job_id, "allocations": [{"node": "node3", "gpu_indices": [0, 1]}]}
    assert cluster.describe(job, waited=GPUS_RECORD_WAIT_SECONDS) == expected
    assert cluster.describe(job, waited=math.inf) == expected


def test_a_gangs_gpus_are_asked_of_slurmctld_at_once(cluster):
    job_id = submit(cluster, 9, {"node1": 2, "node4": 2}, "sleep 300")
    job = running(cluster, job_id)
    given = [{"node": "node1", "gpu_indices": [0, 1]}, {"node": "node4", "gpu_indices": [0, 1]}]
    assert cluster.describe(job, waited=0.0) == {"id": job_id, "allocations": given}
    assert not (cluster.script_dir / "attempt-9.gpus").exists()


def test_the_batch_script_is_not_left_behind_and_the_job_still_runs_it(cluster, tmp_path):
    """sbatch hands the script to slurmctld: the connector removes its file at once (one per
    attempt would pile up in the work directory), and the job runs it all the same."""
    seen = tmp_path / "seen"
    job_id = submit(cluster, 10, {"node3": 1}, f'echo "$CHECKPOINT_DIR" > {seen}; sleep 300')
    assert not list(cluster.script_dir.glob("*.sh"))
    running(cluster, job_id)
    wait_for(lambda: seen.exists() and seen.read_text().strip(), what="the job's process")
    assert seen.read_text().strip() == str(tmp_path / "checkpoint-10")  # as the script exports


def test_the_command_starts_in_the_working_directory_the_job_names(cluster, tmp_path):
    """On the node of a one-node job, and on every node of a gang."""
    code = tmp_path / "my project"
    code.mkdir()
    (code / "where.sh").write_text(
        '#!/bin/sh\npwd > "$CHECKPOINT_DIR/../seen-$SLURMD_NODENAME"\nsleep 300\n'
    )
    (code / "where.sh").chmod(0o755)
    running(cluster, submit(cluster, 11, {"node3": 1}, "./where.sh", working_dir=str(code)))
    gang = submit(cluster, 13, {"node1": 1, "node2": 1}, "./where.sh", working_dir=str(code))
    running(cluster, gang)
    for node in ("node3", "node1", "node2"):
        seen = tmp_path / f"seen-{node}"
        wait_for(lambda seen=seen: seen.exists() and seen.read_text().strip(),
                 what=f"the job's process on {node}")  # fmt: skip
        assert seen.read_text().strip() == str(code)


def test_a_working_directory_the_node_does_not_have_fails_the_job_saying_so(cluster, tmp_path):
    """The batch script starts nothing elsewhere: it exits 1, and the job's log (its tail is
    what the portal shows) names the directory and the node."""
    missing = tmp_path / "not mounted"
    job_id = submit(cluster, 12, {"node3": 1}, f"touch {tmp_path / 'started'}",
                    working_dir=str(missing))  # fmt: skip
    ended = wait_for(
        lambda: next((j for j in cluster.jobs() if j.id == job_id and j.end), None),
        what="the job's end",
    )
    assert ended.exit_code == 1 and not (tmp_path / "started").exists()
    log = (tmp_path / "log-12").read_text()
    assert f"gpu-portal: working directory {missing} is not a directory on node node3" in log
