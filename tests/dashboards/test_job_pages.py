"""The jobs pages every signed-in user has (a member included): their jobs and their teams',
one job's page (why it waits, until when, who is ahead, its attempts and state changes), and
cancelling from it. The real database; cycles by `cycle_run()`, agents played through the node
services."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.utils.html import escape

from dashboards.views import NO_SUCH_JOB, UNKNOWN_STATE
from scheduler.cycle.estimates import estimates_refresh
from scheduler.cycle.run import cycle_run
from scheduler.jobs.selectors import CANCEL_REFUSED, PRIORITY_REFUSED
from scheduler.jobs.services import CANCELLED_BY_USER, PRIORITY_OF_ENDED_JOB, job_submit
from scheduler.models import PRIORITY_RANGE, Job
from tests.conftest import make_node, start_latest_attempt

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def node(db):
    """One node of 8 h100: a job of 8 runs, the next waits."""
    return make_node("node-0")


def submit(user, share: str = "research", gpus: int = 8, **fields) -> Job:
    job, _ = job_submit(
        user=user, share_name=share, gpu_type="h100", gpus=gpus, command="python train.py",
        **fields,
    )  # fmt: skip
    return job


def page_of(user, url: str):
    client = Client()
    client.force_login(user)
    return client, client.get(url)


def test_a_member_lands_on_their_jobs_and_may_show_their_teams(world):
    """bob (a member of ml-research) signs in and lands on his own jobs, not on a refusal;
    "my teams'" adds his lead's jobs, never another team's."""
    mine = submit(world.bob, name="bob-sweep")
    lead = submit(world.alice, name="alice-run")
    other = submit(world.carol, "vision", name="carol-eval")
    client = Client()
    response = client.post("/dash/login/", {"username": "bob", "password": "pw-bob-1234"})
    assert response.url == "/dash/"
    response = client.get("/dash/", follow=True)
    assert response.redirect_chain == [("/dash/jobs/", 302)]
    page = response.content.decode()
    assert f'href="/dash/jobs/{mine.pk}/"' in page and "bob-sweep" in page
    assert "alice-run" not in page and "carol-eval" not in page
    page = client.get("/dash/jobs/?whose=teams").content.decode()
    assert f'href="/dash/jobs/{lead.pk}/"' in page and "bob-sweep" in page
    assert f"/dash/jobs/{other.pk}/" not in page and "carol-eval" not in page


def test_the_jobs_list_filters_by_state_and_says_when_the_state_is_none(world):
    running = submit(world.bob, name="first")
    waiting = submit(world.bob, name="second")
    cycle_run(force=True)
    start_latest_attempt(running)
    client, response = page_of(world.bob, "/dash/jobs/?state=RUNNABLE")
    page = response.content.decode()
    assert f"/dash/jobs/{waiting.pk}/" in page and f"/dash/jobs/{running.pk}/" not in page
    page = client.get("/dash/jobs/?state=RUNNING").content.decode()
    assert f"/dash/jobs/{running.pk}/" in page and f"/dash/jobs/{waiting.pk}/" not in page
    response = client.get("/dash/jobs/?state=running")
    assert response.status_code == 200
    page = response.content.decode()
    assert escape(UNKNOWN_STATE.format(value="running")) in page
    assert f"/dash/jobs/{running.pk}/" in page and f"/dash/jobs/{waiting.pk}/" in page


def test_what_a_jobs_page_shows_changes_with_its_jobs_and_nothing_else(world):
    """The string a jobs page follows (`?look=1`, what the page embeds) stays the same while
    its jobs do, and changes when one is placed or a new one comes; another team's new job,
    not on the page, changes nothing."""
    first = submit(world.bob)
    client, response = page_of(world.bob, "/dash/jobs/")
    embedded = re.search(r'data-shown="(\w+)"', response.content.decode())[1]

    def shown() -> str:
        return client.get("/dash/jobs/?look=1").json()["shown"]

    assert shown() == embedded
    submit(world.carol, "vision")
    assert shown() == embedded
    cycle_run(force=True)
    placed = shown()
    assert Job.objects.get(pk=first.pk).state == Job.State.SCHEDULED and placed != embedded
    submit(world.bob, gpus=4)
    assert shown() != placed


def test_a_job_beyond_the_estimates_horizon_says_so_and_after_when_it_starts(world):
    """The replay stopped before the job started: its page says it starts later than what
    was replayed, not that no estimate was made."""
    running = submit(world.alice, expected_seconds=3600)
    cycle_run(force=True)
    start_latest_attempt(running)
    waiting = submit(world.bob, gpus=8, expected_seconds=300)
    cycle_run(force=True)
    estimates_refresh(horizon=60)
    waiting.refresh_from_db()
    assert waiting.estimated_start is None and waiting.estimate_basis.startswith("starts after")
    page = page_of(world.bob, f"/dash/jobs/{waiting.pk}/")[1].content.decode()
    assert "Not within what the estimate replayed" in page
    assert escape(waiting.estimate_basis) in page and "No estimate yet" not in page


def test_a_waiting_job_says_why_until_when_and_who_is_ahead(world):
    """alice's job runs; alice's second and bob's job wait behind it, bob's second in line,
    with the estimate the refresh made."""
    running = submit(world.alice, expected_seconds=600)
    cycle_run(force=True)
    start_latest_attempt(running)
    first = submit(world.alice, expected_seconds=300)
    mine = submit(world.bob, expected_seconds=300)
    cycle_run(force=True)
    estimates_refresh()
    _client, response = page_of(world.bob, f"/dash/jobs/{mine.pk}/")
    assert response.status_code == 200
    page = response.content.decode()
    mine.refresh_from_db()
    assert mine.state == Job.State.RUNNABLE and mine.reason and escape(mine.reason) in page
    assert f"{mine.estimated_start:%Y-%m-%d %H:%M} UTC" in page and "on node-0" in page
    assert "Position <b>2</b> in the h100 queue" in page
    assert "1 job ahead, asking for 8 GPUs" in page
    assert f'<td><a href="/dash/jobs/{first.pk}/">#{first.pk}</a></td>' in page
    assert "python train.py" in page
    # What happened to it, each change with its reason.
    for event in mine.events.all():
        assert escape(event.reason) in page
    # The running job's page: its attempt's node and GPUs.
    _client, response = page_of(world.bob, f"/dash/jobs/{running.pk}/")
    page = response.content.decode()
    assert "node-0: 0,1,2,3,4,5,6,7" in page


def test_a_member_cancels_their_own_job_but_not_their_leads(world):
    mine = submit(world.bob)
    leads = submit(world.alice)
    client, response = page_of(world.bob, f"/dash/jobs/{mine.pk}/")
    assert 'id="cancel"' in response.content.decode()
    assert 'id="cancel"' not in client.get(f"/dash/jobs/{leads.pk}/").content.decode()

    response = client.post(f"/dash/jobs/{mine.pk}/cancel/")
    assert response.status_code == 302 and response.url == f"/dash/jobs/{mine.pk}/"
    mine.refresh_from_db()
    assert mine.state == Job.State.CANCELLED
    assert mine.reason == CANCELLED_BY_USER.format(user=world.bob)
    assert 'id="cancel"' not in client.get(response.url).content.decode()

    response = client.post(f"/dash/jobs/{leads.pk}/cancel/")
    assert response.status_code == 403
    assert escape(CANCEL_REFUSED.format(team="ml-research")) in response.content.decode()
    leads.refresh_from_db()
    assert leads.state != Job.State.CANCELLED
    # The lead may cancel a member's job.
    client, _ = page_of(world.alice, "/dash/jobs/")
    client.post(f"/dash/jobs/{leads.pk}/cancel/")
    assert Job.objects.get(pk=leads.pk).state == Job.State.CANCELLED


def test_another_teams_job_is_not_found(world):
    job = submit(world.alice)
    for user in (world.oscar, world.carol):
        client, response = page_of(user, f"/dash/jobs/{job.pk}/")
        assert response.status_code == 404
        assert client.post(f"/dash/jobs/{job.pk}/cancel/").status_code == 404
        assert Job.objects.get(pk=job.pk).state != Job.State.CANCELLED
    assert NO_SUCH_JOB.format(job=job.pk) == f"No job {job.pk} among the jobs you may see."
    _client, response = page_of(world.oscar, "/dash/jobs/")
    assert "You have submitted no job" in response.content.decode()


def test_cancelling_needs_a_post(world):
    job = submit(world.bob)
    client, _ = page_of(world.bob, "/dash/jobs/")
    assert client.get(f"/dash/jobs/{job.pk}/cancel/").status_code == 405
    assert Job.objects.get(pk=job.pk).state != Job.State.CANCELLED


def test_a_lead_changes_a_jobs_priority_on_its_page_and_a_member_may_not(world):
    job = submit(world.bob)
    client, response = page_of(world.alice, f"/dash/jobs/{job.pk}/")
    assert 'id="priority"' in response.content.decode()
    response = client.post(f"/dash/jobs/{job.pk}/priority/", {"priority": "7"})
    assert response.status_code == 302 and response.url == f"/dash/jobs/{job.pk}/"
    assert Job.objects.get(pk=job.pk).priority == 7
    for bad in ("abc", "-1", "10000", ""):
        response = client.post(f"/dash/jobs/{job.pk}/priority/", {"priority": bad})
        assert response.status_code == 400
        assert escape(PRIORITY_RANGE) in response.content.decode()
    assert Job.objects.get(pk=job.pk).priority == 7

    client, response = page_of(world.bob, f"/dash/jobs/{job.pk}/")
    assert 'id="priority"' not in response.content.decode()
    response = client.post(f"/dash/jobs/{job.pk}/priority/", {"priority": "9"})
    assert response.status_code == 403
    assert escape(PRIORITY_REFUSED.format(team="ml-research")) in response.content.decode()
    assert Job.objects.get(pk=job.pk).priority == 7


def test_an_ended_jobs_priority_is_not_offered_and_not_changed(world):
    job = submit(world.bob)
    client, _ = page_of(world.alice, "/dash/jobs/")
    client.post(f"/dash/jobs/{job.pk}/cancel/")
    assert 'id="priority"' not in client.get(f"/dash/jobs/{job.pk}/").content.decode()
    response = client.post(f"/dash/jobs/{job.pk}/priority/", {"priority": "5"})
    assert response.status_code == 400
    assert escape(PRIORITY_OF_ENDED_JOB.format(job=job.pk, state="CANCELLED")) in (
        response.content.decode()
    )
    assert Job.objects.get(pk=job.pk).priority == 0


def test_a_member_asks_when_a_job_would_start_before_submitting(world):
    """One node of 8 h100 runs alice's job (expected 600 s): a job of 8 would wait for it and
    start on node-0 when it ends; one of 16 on a node is refused by the submit's rule; nothing
    is stored."""
    running = submit(world.alice, expected_seconds=600)
    cycle_run(force=True)
    start_latest_attempt(running)
    jobs = Job.objects.count()
    client, response = page_of(world.bob, "/dash/jobs/estimate/")
    page = response.content.decode()
    assert '<option value="research"' in page and '<option value="vision"' not in page
    asked = {"share": "research", "gpu_type": "h100", "gpus": "8", "nodes": "1",
             "priority": "0", "expected_seconds": "300", "preemptible": "on"}  # fmt: skip
    page = client.get("/dash/jobs/estimate/", asked).content.decode()
    assert 'id="answer"' in page and "It would start at <b>" in page
    assert "on node-0 (GPUs 0,1,2,3,4,5,6,7)." in page
    assert "Until then it would wait:" in page
    page = client.get("/dash/jobs/estimate/", {**asked, "gpus": "16"}).content.decode()
    assert 'id="answer"' not in page
    assert "is more than any h100 node has (largest: 8)" in page
    page = client.get("/dash/jobs/estimate/", {**asked, "share": "vision"}).content.decode()
    assert 'id="answer"' not in page and "Select a valid choice" in page
    assert Job.objects.count() == jobs


def test_the_admins_job_view_leads_to_the_jobs_page(world):
    job = submit(world.bob)
    client, response = page_of(world.root, f"/admin/scheduler/job/{job.pk}/change/")
    assert response.status_code == 200
    link = re.search(r'href="([^"]+)" class="viewsitelink"', response.content.decode())
    assert link is not None
    response = client.get(link.group(1))
    assert response.status_code == 302 and response.url.endswith(f"/dash/jobs/{job.pk}/")


def test_another_teams_job_ahead_is_shown_without_its_id(world):
    """alice's job fills the node; carol's vision job waits ahead of bob's (within its limit,
    while bob's would borrow): bob sees a vision job of 8 GPUs ahead, not which one; an admin
    sees its id."""
    running = submit(world.alice)
    cycle_run(force=True)
    start_latest_attempt(running)
    theirs = submit(world.carol, "vision")
    mine = submit(world.bob)
    cycle_run(force=True)
    _client, response = page_of(world.bob, f"/dash/jobs/{mine.pk}/")
    page = response.content.decode()
    assert "Position <b>2</b>" in page and "another team's</span></td><td>vision" in page
    assert f"#{theirs.pk}<" not in page and f"/dash/jobs/{theirs.pk}/" not in page
    _client, response = page_of(world.root, f"/dash/jobs/{mine.pk}/")
    assert f'<a href="/dash/jobs/{theirs.pk}/">#{theirs.pk}</a>' in response.content.decode()
