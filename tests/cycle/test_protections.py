"""Lending that never hurts the lender, in the live cycle (docs/semantics.md): the minimum
runtime before a reclaim, the churn breaker, and checkpoints reported by agents ordering the
victims. One `cycle_run()` is one cycle; agents are played through the node services and the
agent API; the real database and Redis, nothing mocked."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from dashboards.metrics import metrics_text
from scheduler.cycle.run import cycle_run
from scheduler.jobs.selectors import held_off
from scheduler.jobs.services import job_submit
from scheduler.models import ClusterSettings, Job, JobAttempt
from shares.services import share_update
from tests.conftest import make_node
from tests.conftest import start_latest_attempt as run

pytestmark = pytest.mark.django_db


def submit(user, share: str, gpus: int = 8) -> Job:
    job, _ = job_submit(user=user, share_name=share, gpu_type="h100", gpus=gpus, command="true")
    return job


def attempt_of(job: Job) -> JobAttempt:
    return JobAttempt.objects.filter(job=job).order_by("-number").first()


def started_ago(job: Job, seconds: float) -> None:
    """The job's running attempt started `seconds` ago."""
    JobAttempt.objects.filter(pk=attempt_of(job).pk).update(
        started_at=timezone.now() - timedelta(seconds=seconds)
    )


@pytest.fixture
def lent(world):
    """Two 8-GPU nodes. research runs a job on its own 8 h100 and borrows vision's idle 8 with
    a second one, started a minute ago."""
    make_node("node-0")
    make_node("node-1")
    own, borrower = submit(world.alice, "research"), submit(world.alice, "research")
    cycle_run(force=True)
    run(own)
    run(borrower)
    started_ago(own, 3600)
    started_ago(borrower, 60)
    return own, borrower


def test_a_reclaim_waits_for_the_borrowers_minimum_runtime_and_says_when(world, lent):
    """research sets a 300 s minimum runtime: vision's owner job waits, its reason says in
    how long it reclaims, and no stop is ordered; once the borrower has run 300 s the reclaim
    stops it."""
    own, borrower = lent
    share_update(share=world.shares["research"], actor=world.root, source="api",
                 min_runtime_seconds=300)  # fmt: skip
    # The job on research's own quota is no candidate: research's only borrower is the young one.
    JobAttempt.objects.filter(pk=attempt_of(own).pk).update(started_at=timezone.now())
    owner = submit(world.carol, "vision")
    cycle_run(force=True)
    waiting = Job.objects.get(pk=owner.pk)
    assert waiting.state == Job.State.RUNNABLE
    assert waiting.reason.startswith("reclaiming 8 h100 from share research in ")
    seconds = int(waiting.reason.rsplit(" ", 2)[1])
    assert 230 <= seconds <= 241
    assert not JobAttempt.objects.filter(stop_requested_at__isnull=False).exists()
    started_ago(borrower, 301)
    cycle_run(force=True)
    assert attempt_of(borrower).preempted_for_id == owner.pk


def test_a_share_s_minimum_runtime_is_set_over_the_api_and_checked(world):
    root = world.client("root")
    url = "/api/v1/shares/research/"
    response = root.patch(url, {"min_runtime_seconds": 600}, format="json")
    assert response.status_code == 200 and response.json()["min_runtime_seconds"] == 600
    for bad in (-1, 10**9, "soon"):
        response = root.patch(url, {"min_runtime_seconds": bad}, format="json")
        assert response.status_code == 400 and "min_runtime_seconds" in response.json(), bad
    lead = world.client("alice").patch(url, {"min_runtime_seconds": 0}, format="json")
    assert lead.status_code == 403  # a share's settings are the admin's


def preempted(job: Job, times_ago: list[float]) -> None:
    """The job was preempted that many seconds ago, once each."""
    now = timezone.now()
    for number, ago in enumerate(times_ago, start=1):
        JobAttempt.objects.create(
            job=job, number=number, allocations=[], outcome=JobAttempt.Outcome.PREEMPTED,
            started_at=now - timedelta(seconds=ago + 10), ended_at=now - timedelta(seconds=ago),
        )  # fmt: skip
    Job.objects.filter(pk=job.pk).update(
        attempt_count=len(times_ago), preemption_count=len(times_ago)
    )


def test_a_job_preempted_too_often_is_held_off_borrowed_gpus(world, client):
    """A research job preempted three times in the last hour waits while vision's GPUs are
    idle, saying why; the metric and the share's page count and mark it; within research's
    limit it runs; with the breaker off it borrows."""
    make_node("node-0")
    make_node("node-1")
    own = submit(world.alice, "research")
    cycle_run(force=True)
    run(own)
    churned = submit(world.alice, "research")
    preempted(churned, [3000, 2000, 1000])
    cycle_run(force=True)
    job = Job.objects.get(pk=churned.pk)
    assert job.state == Job.State.RUNNABLE
    assert (
        job.reason.startswith("held off borrowed GPUs for ") and "preempted 3 times" in job.reason
    )
    until = held_off()[job.pk]
    assert timedelta(seconds=590) < until - timezone.now() <= timedelta(seconds=600)
    assert 'portal_held_off_workloads{cluster_queue="research"} 1.0' in metrics_text().decode()
    client.force_login(world.alice)
    page = client.get("/dash/shares/research/")
    assert page.status_code == 200 and b'class="held-off"' in page.content
    ClusterSettings.objects.filter(pk=1).update(churn_preemptions=0)
    cycle_run(force=True)
    assert Job.objects.get(pk=churned.pk).state == Job.State.SCHEDULED
    assert held_off() == {}


def test_a_job_held_off_still_runs_within_its_share_s_limit(world):
    make_node("node-0")
    churned = submit(world.alice, "research")
    preempted(churned, [300, 200, 100])
    cycle_run(force=True)
    assert Job.objects.get(pk=churned.pk).state == Job.State.SCHEDULED
    assert attempt_of(churned).borrowed_gpus == 0


JOIN = "the-join-token"


def agent_post(client: Client, path: str, body: dict, token: str | None = None):
    headers = {"HTTP_AUTHORIZATION": f"Node {token}"} if token else {}
    return client.post(f"/api/v1/agent/{path}/", body, content_type="application/json", **headers)


def test_an_agent_reports_checkpoints_and_the_latest_one_counts(world):
    """A checkpoint reported by the job's agent is recorded (its age taken from the agent's
    clock); an older one reported after it, or a replay, does not move it back; a bad age is
    a 400 naming the field; the job's attempts show it."""
    ClusterSettings.objects.update_or_create(pk=1, defaults={"agent_join_token": JOIN})
    client = Client()
    node = {"join_token": JOIN, "name": "node-a", "gpu_type": "h100", "gpus": 8}
    token = agent_post(client, "register", node).json()["token"]
    job = submit(world.alice, "research")
    cycle_run(force=True)
    (order,) = agent_post(client, "poll", {"running": [], "wait": 0}, token).json()["run"]
    attempt = order["attempt"]
    assert agent_post(client, "start", {"attempts": [attempt]}, token).json()["start"] == [attempt]

    def report(age):
        return agent_post(
            client,
            "report",
            {"events": [{"type": "checkpoint", "attempt": attempt, "age": age}]},
            token,
        )  # noqa: E501

    assert report(5).json()["results"] == ["ok"]
    saved = JobAttempt.objects.get(pk=attempt).last_checkpoint_at
    assert timedelta(seconds=4) < timezone.now() - saved < timedelta(seconds=7)
    assert report(60).json()["results"] == ["ok"]
    assert JobAttempt.objects.get(pk=attempt).last_checkpoint_at == saved
    for bad in (-1, "a", True, None):
        response = report(bad)
        assert response.status_code == 400 and "events[0].age" in response.json(), bad
    shown = world.client("alice").get(f"/api/v1/jobs/{job.pk}/").json()
    assert shown["attempts"][0]["last_checkpoint_at"] is not None
