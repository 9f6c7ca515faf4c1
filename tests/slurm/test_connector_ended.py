"""What the Slurm connector remembers of the attempts that ended, on the real Slurm cluster of
tests/slurm/conftest.py and a live portal. squeue still lists an ended job for MinJobAge: the
connector keeps its attempt among the ended ones while it does (else it would take the job for
one an earlier run of it submitted, and adopt it), and forgets it once Slurm has, so a
long-lived connector does not keep every attempt it ever ran."""

from __future__ import annotations

import threading

import pytest

from scheduler.agent.connector import Connector
from scheduler.agent.slurm import SlurmCluster
from scheduler.jobs.services import job_submit
from scheduler.models import Job, JobAttempt, Node
from tests.live import JOIN_TOKEN, job_command, wait_for
from tests.slurm.conftest import NODES

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def test_an_ended_attempt_is_kept_while_squeue_lists_its_job_then_forgotten(
    world, live, slurm, tmp_path
):
    slurm.env = {**slurm.env, "SLURM_MIN_JOB_AGE": "2"}
    slurm.script("start")
    system = live()
    system.start_web()
    system.start_worker()
    # Its own job-name prefix: squeue may still list other tests' ended jobs.
    cluster = SlurmCluster(partitions=("gpu",), prefix="ended-test",
                           env={"SLURM_CONF": slurm.conf})  # fmt: skip
    connector = Connector(portal=system.url, join_token=JOIN_TOKEN, name="slurm",
                          cluster=cluster, work_dir=tmp_path / "connector",
                          checkpoint_root=system.checkpoints, poll_wait=2)  # fmt: skip
    thread = threading.Thread(target=connector.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: Node.objects.filter(name__in=NODES, state=Node.State.READY).count() == 4,
                 timeout=60, what="the Slurm nodes registered")  # fmt: skip
        jobs = [
            job_submit(user=world.alice, share_name="research", gpu_type="h100", gpus=8,
                       command=job_command(1, 0.05))[0].pk
            for _ in range(3)
        ]  # fmt: skip
        wait_for(lambda: Job.objects.filter(pk__in=jobs, state=Job.State.SUCCEEDED).count() == 3,
                 timeout=90, what="the jobs to succeed")  # fmt: skip
        ours = set(JobAttempt.objects.filter(job_id__in=jobs).values_list("pk", flat=True))
        assert len(ours) == 3  # each ran once

        def forgotten_while_listed() -> set[int]:
            remembered = set(connector.finished)  # read first: then what squeue lists after
            listed = set(cluster.attempt_jobs()) & ours
            return listed - remembered

        def check_until_slurm_forgets() -> bool:
            assert not forgotten_while_listed()
            return not set(cluster.attempt_jobs()) & ours

        wait_for(check_until_slurm_forgets, timeout=120, what="Slurm to forget the jobs")
        wait_for(lambda: not set(connector.finished) & ours, timeout=30,
                 what="the connector to forget the attempts")  # fmt: skip
        assert JobAttempt.objects.filter(job_id__in=jobs).count() == 3  # none adopted again
    finally:
        connector.stopping.set()
        thread.join(30)
        slurm.env = {k: v for k, v in slurm.env.items() if k != "SLURM_MIN_JOB_AGE"}
