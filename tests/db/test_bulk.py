"""The bulk writes (portal.db.bulk, scheduler.transitions) of the cycle and of a submit give
the same rows as the ORM, on every database: one statement on PostgreSQL, batched ORM
elsewhere."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from portal.db.bulk import json_insert, rows_update
from scheduler.jobs.services import job_submit
from scheduler.models import GpuAssignment, Job, JobAttempt, JobEvent
from scheduler.transitions import job_insert, jobs_set_reasons
from tests.conftest import make_node

pytestmark = pytest.mark.django_db


def submit(user, share: str, gpus: int = 1) -> Job:
    job, _ = job_submit(user=user, share_name=share, gpu_type="h100", gpus=gpus, command="true")
    return job


def test_inserted_attempts_get_their_values_and_model_defaults(world):
    """Rows inserted in bulk carry the given values (JSON included), the model's defaults for
    every other field and the current time in auto_now_add fields; the returned keys match each
    row to its id."""
    make_node("node-0")
    jobs = [submit(world.alice, "research") for _ in range(3)]
    before = timezone.now()
    returned = json_insert(
        JobAttempt,
        ("job_id", "number", "allocations", "borrowed_gpus"),
        [
            (job.pk, 1, [{"node": "node-0", "gpu_indices": [index]}], index)
            for index, job in enumerate(jobs)
        ],
        returning=("job_id", "id"),
    )
    ids = dict(returned)
    assert sorted(ids) == sorted(job.pk for job in jobs)
    for index, job in enumerate(jobs):
        attempt = JobAttempt.objects.get(pk=ids[job.pk])
        assert attempt.job_id == job.pk
        assert attempt.allocations == [{"node": "node-0", "gpu_indices": [index]}]
        assert attempt.borrowed_gpus == index
        assert before <= attempt.scheduled_at <= timezone.now()
        assert (attempt.started_at, attempt.ended_at, attempt.preempted_for_id) == (None,) * 3
        assert (attempt.outcome, attempt.end_reason, attempt.log_tail) == ("", "", "")


def test_a_gpu_still_held_cannot_be_inserted_twice(world):
    """Bulk inserts keep the database's guarantee: a GPU still held is refused."""
    node = make_node("node-0")
    first, second = submit(world.alice, "research"), submit(world.alice, "research")
    ids = dict(
        json_insert(
            JobAttempt,
            ("job_id", "number"),
            [(first.pk, 1), (second.pk, 1)],
            returning=("job_id", "id"),
        )
    )
    json_insert(
        GpuAssignment, ("attempt_id", "node_id", "gpu_index"), [(ids[first.pk], node.pk, 0)]
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        json_insert(
            GpuAssignment,
            ("attempt_id", "node_id", "gpu_index"),
            [(ids[second.pk], node.pk, 1), (ids[second.pk], node.pk, 0)],
        )
    assert GpuAssignment.objects.filter(attempt_id=ids[second.pk]).count() == 0


def test_reasons_are_written_only_to_jobs_still_in_the_state(world):
    """Each job gets its own reason; with `state`, a job that left that state keeps its own."""
    make_node("node-0")
    waiting = [submit(world.alice, "research") for _ in range(3)]
    gone = submit(world.alice, "research")
    Job.objects.filter(pk=gone.pk).update(state=Job.State.CANCELLED, reason="cancelled by alice")
    reasons = {job.pk: f"reason {index}" for index, job in enumerate([*waiting, gone])}
    assert jobs_set_reasons(reasons, state=Job.State.RUNNABLE) == 3
    for job in waiting:
        assert Job.objects.get(pk=job.pk).reason == reasons[job.pk]
    assert Job.objects.get(pk=gone.pk).reason == "cancelled by alice"
    events = JobEvent.objects.count()
    assert jobs_set_reasons({gone.pk: "any"}) == 1
    assert JobEvent.objects.count() == events  # not a state change: no event


def test_updated_rows_get_their_own_values_and_the_count_is_returned(world):
    """Each row gets its own values of the named fields, JSON included; other fields and other
    rows keep theirs; the number of rows written comes back."""
    make_node("node-0")
    jobs = [submit(world.alice, "research") for _ in range(3)]
    untouched = submit(world.alice, "research")
    written = rows_update(
        Job,
        ("priority", "env"),
        [(job.pk, 10 + index, {"RUN": str(index)}) for index, job in enumerate(jobs)],
    )
    assert written == 3
    for index, job in enumerate(jobs):
        row = Job.objects.get(pk=job.pk)
        assert (row.priority, row.env, row.reason) == (10 + index, {"RUN": str(index)}, job.reason)
    assert Job.objects.get(pk=untouched.pk).priority == untouched.priority
    assert rows_update(Job, ("priority",), []) == 0


def new_job(user, share, **fields) -> tuple[Job, list[JobEvent]]:
    job = Job(share=share, submitted_by=user, gpu_type="h100", gpus=1, command="true", **fields)
    events = [
        JobEvent(job=job, from_state="", to_state=Job.State.SUBMITTED, reason="first"),
        JobEvent(job=job, from_state=Job.State.SUBMITTED, to_state="RUNNABLE", reason="second"),
    ]
    return job, events


def test_a_submitted_job_and_its_events_are_written_as_save_writes_them(world):
    """job_insert writes the job's values, its model defaults and timestamps, and its events in
    the order given, as job.save() and bulk_create do."""
    share = world.research
    job, events = new_job(world.alice, share, env={"A": "1"}, client_token="t-1")
    before = timezone.now()
    job_insert(job, events)
    saved = Job.objects.get(pk=job.pk)
    assert (saved.share, saved.submitted_by, saved.env, saved.client_token) == (
        share,
        world.alice,
        {"A": "1"},
        "t-1",
    )
    assert (saved.state, saved.nodes, saved.priority, saved.attempt_count) == ("SUBMITTED", 1, 0, 0)
    assert before <= saved.submitted_at == job.submitted_at <= timezone.now()
    assert saved.updated_at == job.updated_at
    assert not job._state.adding
    assert list(saved.events.values_list("from_state", "to_state", "reason")) == [
        ("", "SUBMITTED", "first"),
        ("SUBMITTED", "RUNNABLE", "second"),
    ]


def test_every_value_of_an_inserted_job_reads_back_as_given(world):
    """Whether job_insert passes a value as it is (strings, ints, booleans, aware datetimes) or
    converts it (JSON, a naive datetime, a number given as text), the row holds what save()
    would have written."""
    started = timezone.now() - timedelta(minutes=5)
    job, events = new_job(
        world.alice,
        world.research,
        name="train",
        priority="7",
        timeout_seconds=3600,
        max_preemptions=0,
        retry_attempts=2,
        env={"A": "1", "B": ""},
        state=Job.State.RUNNING,
        reason="placed",
        cancel_requested=True,
        started_at=started,
        finished_at=None,
    )
    job_insert(job, events)
    saved = Job.objects.get(pk=job.pk)
    given = {f.attname: f.to_python(getattr(job, f.attname)) for f in Job._meta.concrete_fields}
    assert {f.attname: getattr(saved, f.attname) for f in Job._meta.concrete_fields} == given
    assert saved.priority == 7 and saved.started_at == started and saved.cancel_requested


def test_a_refused_job_insert_writes_nothing_and_leaves_the_callers_transaction_usable(world):
    """A second job with the same client_token is refused (IntegrityError) with none of its
    events; inside a transaction, the caller can still read and write after it."""
    share = world.research
    job_insert(*new_job(world.alice, share, client_token="once"))
    with transaction.atomic():
        with pytest.raises(IntegrityError):
            job_insert(*new_job(world.alice, share, client_token="once"))
        assert Job.objects.filter(client_token="once").count() == 1
        job_insert(*new_job(world.alice, share, client_token="twice"))
    assert Job.objects.count() == 2
    assert JobEvent.objects.count() == 4
