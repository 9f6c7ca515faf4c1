"""`manage.py after_restore` (docs/deploy.md, "Backups and restore"): once a backup is restored,
new jobs and attempts are numbered past every id given out since the dump, so no new job takes
the id, and so the checkpoint directory, of a job submitted after it."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from portal.db.sequences import number_after
from scheduler.jobs.services import job_submit
from scheduler.management.commands.after_restore import SKIP
from scheduler.models import Job, JobAttempt
from tests.conftest import make_node

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def node(db):
    return make_node("gpu-1")


def submit(world) -> Job:
    job, _ = job_submit(user=world.alice, share_name="research", gpu_type="h100", gpus=1,
                        command="sleep 1")  # fmt: skip
    return job


def restore_dump_taken_after(job: Job) -> None:
    """What restoring a dump taken just after `job` does: later rows gone, and the numbering
    back where the dump left it."""
    Job.objects.filter(pk__gt=job.pk).delete()
    JobAttempt.objects.filter(pk__gt=job.attempts.get().pk).delete()
    number_after(Job, 1)
    number_after(JobAttempt, 1)


def test_after_a_restore_new_jobs_and_attempts_never_reuse_an_id(world):
    in_dump = submit(world)
    JobAttempt.objects.create(job=in_dump, number=1)
    after_dump = [submit(world) for _ in range(3)]
    attempts_after = [JobAttempt.objects.create(job=job, number=1) for job in after_dump]
    restore_dump_taken_after(in_dump)
    assert submit(world).pk == after_dump[0].pk  # what the command is for
    restore_dump_taken_after(in_dump)

    out = io.StringIO()
    call_command("after_restore", "--skip", "1000", stdout=out)
    job = submit(world)
    attempt = JobAttempt.objects.create(job=job, number=1)
    assert job.pk == in_dump.pk + 1000 > max(j.pk for j in after_dump)
    assert attempt.pk == in_dump.attempts.get().pk + 1000 > max(a.pk for a in attempts_after)
    assert f"the next job is number {job.pk}" in out.getvalue()


def test_after_restore_counts_from_the_rows_so_a_second_run_moves_nothing(world):
    submit(world)
    call_command("after_restore", stdout=io.StringIO())
    call_command("after_restore", stdout=io.StringIO())
    assert submit(world).pk == Job.objects.order_by("pk").first().pk + SKIP


def test_a_skip_below_one_is_refused(world):
    with pytest.raises(CommandError, match="--skip: must be at least 1"):
        call_command("after_restore", "--skip", "0")
