"""A job submitted `preemptible: false` over the API: it runs only within its share's limit,
says why it waits otherwise, and is shown as such; a client token counts it as part of the
request."""

from __future__ import annotations

from scheduler.cycle.run import cycle_run
from scheduler.engine import reasons
from scheduler.models import Job
from tests.api.helpers import job_request

JOBS = "/api/v1/jobs/"


def test_a_job_that_is_not_preemptible_waits_for_its_share_s_own_gpus(world):
    """research (8 h100) runs a job on its whole limit; vision lends its 8 idle h100. A second
    research job that is not preemptible waits, with the reason, while a preemptible one of
    the same size borrows the idle GPUs."""
    alice = world.client("alice")
    alice.post(JOBS, job_request(name="own"), format="json")
    cycle_run(force=True)
    steady = alice.post(JOBS, job_request(name="steady", preemptible=False), format="json")
    assert steady.status_code == 201 and steady.json()["preemptible"] is False
    flexible = alice.post(JOBS, job_request(name="flexible"), format="json").json()
    cycle_run(force=True)
    waiting = Job.objects.get(pk=steady.json()["id"])
    assert waiting.state == Job.State.RUNNABLE
    assert waiting.reason == reasons.not_preemptible("research", 8, 8, "h100", 8)
    assert Job.objects.get(pk=flexible["id"]).state == Job.State.SCHEDULED
    shown = alice.get(f"{JOBS}{waiting.pk}/").json()
    assert shown["preemptible"] is False and shown["reason"].startswith("not preemptible")


def test_preemptible_must_be_a_boolean_and_is_part_of_an_idempotent_request(world):
    bob = world.client("bob")
    bad = bob.post(JOBS, job_request(preemptible="sometimes"), format="json")
    assert bad.status_code == 400 and "preemptible" in bad.json()
    first = bob.post(JOBS, job_request(client_token="t1", preemptible=False), format="json")
    other = bob.post(JOBS, job_request(client_token="t1", preemptible=True), format="json")
    assert first.status_code == 201 and other.status_code == 409
