"""Describe (GET /api/v1/jobs/<id>/) reads its job in a few written-out statements and shows it
as DRF's ModelSerializers show the ORM's job with its prefetched attempts, GPUs and events."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models import Prefetch
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework import serializers

from scheduler.api.serializers import (
    RECENT_PREEMPTIONS,
    AttemptSerializer,
    EventSerializer,
    JobDetailSerializer,
)
from scheduler.api.views import JOB_NOT_FOUND
from scheduler.jobs.selectors import job_detail
from scheduler.jobs.services import job_submit
from scheduler.models import GpuAssignment, Job, JobAttempt
from scheduler.transitions import Transitions
from tests.api.test_submit_queries import statements

SECRET = "python secret_gang.py"


# --- The describe as the ORM and DRF showed it (the oracle) ------------------------------------


def _orm_allocations(attempt: JobAttempt) -> list[dict]:
    by_node: dict[str, list[int]] = {}
    for gpu in attempt.gpus.all():
        by_node.setdefault(gpu.node.name, []).append(gpu.gpu_index)
    if not by_node:
        return list(attempt.allocations or [])
    return [{"node": node, "gpu_indices": sorted(indices)} for node, indices in by_node.items()]


class _OrmAttempt(serializers.ModelSerializer):
    allocations = serializers.SerializerMethodField()
    preempted_for = serializers.PrimaryKeyRelatedField(read_only=True)

    class Meta(AttemptSerializer.Meta):
        pass

    def get_allocations(self, attempt):
        return _orm_allocations(attempt)


class _OrmEvent(serializers.ModelSerializer):
    class Meta(EventSerializer.Meta):
        pass


class _OrmDetail(serializers.ModelSerializer):
    share = serializers.SlugRelatedField(slug_field="name", read_only=True)
    submitted_by = serializers.SlugRelatedField(slug_field="username", read_only=True)
    attempts = _OrmAttempt(many=True, read_only=True)
    events = _OrmEvent(many=True, read_only=True)
    preemptions = serializers.SerializerMethodField()
    allocations = serializers.SerializerMethodField()
    cluster_job = serializers.SerializerMethodField()
    log_tail = serializers.SerializerMethodField()

    class Meta(JobDetailSerializer.Meta):
        pass

    def get_preemptions(self, job):
        preempted = [a for a in job.attempts.all() if a.outcome == JobAttempt.Outcome.PREEMPTED]
        recent = preempted[-RECENT_PREEMPTIONS:][::-1]
        return {
            "count": job.preemption_count,
            "max_preemptions": job.max_preemptions,
            "recent": _OrmAttempt(recent, many=True).data,
        }

    def get_allocations(self, job):
        attempts = list(job.attempts.all())
        return _orm_allocations(attempts[-1]) if attempts else []

    def get_cluster_job(self, job):
        attempts = list(job.attempts.all())
        return attempts[-1].cluster_job if attempts else {}

    def get_log_tail(self, job):
        attempts = list(job.attempts.all())
        return attempts[-1].log_tail if attempts else ""


def orm_detail(job_id: int) -> dict:
    """The describe's JSON from the ORM's job with select_related and prefetches, each
    serializer built per instance; an attempt's GPUs in the order they were given (by id)."""
    gpus = GpuAssignment.objects.select_related("node").order_by("id")
    job = (
        Job.objects.select_related("share__team", "submitted_by")
        .prefetch_related(
            Prefetch(
                "attempts",
                queryset=JobAttempt.objects.prefetch_related(Prefetch("gpus", queryset=gpus)),
            ),
            "events",
        )
        .get(pk=job_id)
    )
    return _OrmDetail(job).data


# --- A gang job's history ----------------------------------------------------------------------


def place_gang(job: Job, gpus: list[tuple[str, list[int]]], world, **fields) -> JobAttempt:
    """An attempt of `job` holding (node name, GPU indices), in that order."""
    attempt = JobAttempt.objects.create(
        job=job,
        number=JobAttempt.objects.filter(job=job).count() + 1,
        allocations=[{"node": node, "gpu_indices": indices} for node, indices in gpus],
        started_at=timezone.now(),
        **fields,
    )
    released = attempt.ended_at is not None
    GpuAssignment.objects.bulk_create(
        GpuAssignment(attempt=attempt, node=world.nodes[node], gpu_index=index, released=released)
        for node, indices in gpus
        for index in indices
    )
    return attempt


def history(job: Job, *steps: tuple[str, str], **fields) -> None:
    transitions = Transitions()
    for state, reason in steps[:-1]:
        transitions.move(job, to_state=state, reason=reason)
    state, reason = steps[-1]
    transitions.move(job, to_state=state, reason=reason, **fields).save()


@pytest.fixture
def gang_job(world) -> Job:
    """bob's 8-GPU job on two h100 nodes: its first attempt (both nodes) was preempted for
    carol's job, its second was lost with its node and left no GPU rows, its third runs with its
    GPUs given h100-1 first and out of order."""
    job, _ = job_submit(
        user=world.users["bob"], share_name="research", gpu_type="h100", gpus=8, nodes=2,
        command=SECRET, env={"SEED": "1"}, max_preemptions=3,
    )  # fmt: skip
    owner, _ = job_submit(
        user=world.users["carol"], share_name="vision", gpu_type="h100", gpus=8, command="y"
    )
    now = timezone.now()
    place_gang(
        job, [("h100-0", [0, 1, 2, 3]), ("h100-1", [0, 1, 2, 3])], world, ended_at=now,
        outcome=JobAttempt.Outcome.PREEMPTED, preempted_for=owner, end_reason="reclaimed",
        log_tail="step 10",
    )  # fmt: skip
    JobAttempt.objects.create(
        job=job, number=2, allocations=[{"node": "gone-7", "gpu_indices": [0, 1]}],
        ended_at=now, outcome=JobAttempt.Outcome.NODE_LOST, log_tail="step 20",
    )  # fmt: skip
    place_gang(job, [("h100-1", [7, 5, 6, 4]), ("h100-0", [3, 2, 1, 0])], world, log_tail="ü")
    history(
        job, ("SCHEDULED", "placed"), ("RUNNING", "started"), ("PREEMPTING", "for carol"),
        ("RUNNABLE", "requeued"), ("SCHEDULED", "placed"), ("RUNNING", "started"),
        preemption_count=1, attempt_count=3, started_at=now,
    )  # fmt: skip
    return job


# --- Tests -------------------------------------------------------------------------------------


def test_a_gang_job_s_describe_is_what_the_orm_and_drf_showed(world, gang_job):
    """Every field of the describe, attempts, GPUs per node, the preemption and the events
    included, is what DRF's ModelSerializers wrote from the ORM's prefetched job."""
    described = world.client("bob").get(f"/api/v1/jobs/{gang_job.pk}/")
    assert described.status_code == 200, described.content
    assert described.json() == orm_detail(gang_job.pk)
    data = described.json()
    assert data["allocations"] == [
        {"node": "h100-1", "gpu_indices": [4, 5, 6, 7]},
        {"node": "h100-0", "gpu_indices": [0, 1, 2, 3]},
    ]
    first, lost, running = data["attempts"]
    assert first["allocations"] == [
        {"node": "h100-0", "gpu_indices": [0, 1, 2, 3]},
        {"node": "h100-1", "gpu_indices": [0, 1, 2, 3]},
    ]
    assert lost["allocations"] == [{"node": "gone-7", "gpu_indices": [0, 1]}]
    assert [a["outcome"] for a in data["attempts"]] == ["PREEMPTED", "NODE_LOST", ""]
    owner = Job.objects.get(submitted_by=world.users["carol"])
    assert data["preemptions"] == {"count": 1, "max_preemptions": 3, "recent": [first]}
    assert first["preempted_for"] == owner.pk and running["preempted_for"] is None
    assert (data["log_tail"], data["share"], data["submitted_by"]) == ("ü", "research", "bob")
    assert [e["to_state"] for e in data["events"]] == [
        "SUBMITTED", "RUNNABLE", "SCHEDULED", "RUNNING", "PREEMPTING", "RUNNABLE", "SCHEDULED",
        "RUNNING",
    ]  # fmt: skip
    assert data["events"][4]["reason"] == "for carol"


def test_a_job_that_never_ran_is_described_as_before(world):
    job, _ = job_submit(
        user=world.users["alice"], share_name="research", gpu_type="l4", gpus=1, command="x"
    )
    data = world.client("bob").get(f"/api/v1/jobs/{job.pk}/").json()
    assert data == orm_detail(job.pk)
    assert (data["attempts"], data["allocations"], data["log_tail"]) == ([], [], "")
    assert data["preemptions"] == {"count": 0, "max_preemptions": None, "recent": []}


def test_only_the_job_s_team_and_admins_see_it(world, gang_job):
    """Another team's lead and an outsider get the 404 of a job that does not exist, with none
    of its data; the team's lead and the admin see it; without credentials, 401."""
    path = f"/api/v1/jobs/{gang_job.pk}/"
    for persona in ("carol", "oscar"):
        response = world.client(persona).get(path)
        assert response.status_code == 404, persona
        assert response.json() == {"detail": JOB_NOT_FOUND.format(job_id=gang_job.pk)}
        assert SECRET not in response.content.decode()
    for persona in ("alice", "root"):
        response = world.client(persona).get(path)
        assert response.status_code == 200, persona
        assert response.json() == orm_detail(gang_job.pk)
    assert world.client(None).get(path).status_code == 401
    missing = world.client("root").get("/api/v1/jobs/999999/")
    assert missing.json() == {"detail": JOB_NOT_FOUND.format(job_id=999999)}


def test_job_detail_answers_none_for_a_job_the_user_may_not_see(world, gang_job):
    from django.contrib.auth.models import AnonymousUser

    for user in (world.users["carol"], world.users["oscar"], AnonymousUser(), None):
        assert job_detail(user=user, job_id=gang_job.pk) is None
    inactive_admin = world.users["root"]
    inactive_admin.is_active = False
    assert job_detail(user=inactive_admin, job_id=gang_job.pk) is None


def test_a_describe_reads_the_job_its_attempts_their_gpus_and_its_events(world, gang_job):
    """Besides the token: one SELECT each for the job (with its share, team, submitter and
    whether the user is on the team), its attempts, their GPUs and its events; a job that never
    ran has no GPUs to read."""
    client = world.client("bob")
    with CaptureQueriesContext(connection) as context:
        assert client.get(f"/api/v1/jobs/{gang_job.pk}/").status_code == 200
    assert len(statements(context, "SELECT")) == 5, statements(context, "SELECT")
    assert len(context.captured_queries) == 5

    fresh, _ = job_submit(
        user=world.users["bob"], share_name="research", gpu_type="h100", gpus=1, command="x"
    )
    with CaptureQueriesContext(connection) as context:
        assert client.get(f"/api/v1/jobs/{fresh.pk}/").status_code == 200
    assert len(context.captured_queries) == 4


def test_the_described_job_comes_with_its_share_team_and_submitter(
    world, gang_job, django_assert_num_queries
):
    """What the PATCH and cancel checks read of the job needs no further query."""
    job = job_detail(user=world.users["alice"], job_id=gang_job.pk)
    with django_assert_num_queries(0):
        assert (job.share.name, job.share.team.slug) == ("research", "ml-research")
        assert (job.submitted_by.username, job.submitted_by_id) == ("bob", world.users["bob"].pk)
        assert [a.number for a in job.attempt_list] == [1, 2, 3]
        assert job.attempt_list[1].gpu_list == []
        assert job.attempt_list[2].gpu_list[:2] == [("h100-1", 7), ("h100-1", 5)]
        assert job.event_list[0].to_state == Job.State.SUBMITTED
    assert job == gang_job and job.command == SECRET and job.env == {"SEED": "1"}
