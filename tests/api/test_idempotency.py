"""Submitting the same client_token again returns the first job instead of a second one."""

from __future__ import annotations

import threading

import pytest
from django.db import connection, connections

from scheduler.jobs.services import CLIENT_TOKEN_CONFLICT
from scheduler.models import Job
from tests.api.helpers import add_cluster, job_request
from tests.conftest import build_world

JOBS = "/api/v1/jobs/"


def test_same_token_same_request_returns_the_first_job(world):
    bob = world.client("bob")
    first = bob.post(JOBS, job_request(client_token="run-1"), format="json")
    again = bob.post(JOBS, job_request(client_token="run-1"), format="json")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert Job.objects.count() == 1


def test_same_token_different_request_is_409(world):
    bob = world.client("bob")
    first = bob.post(JOBS, job_request(client_token="run-1"), format="json").json()
    response = bob.post(JOBS, job_request(client_token="run-1", gpus=4), format="json")
    assert response.status_code == 409
    assert response.json() == {
        "client_token": [CLIENT_TOKEN_CONFLICT.format(token="run-1", job_id=first["id"])],
        "job_id": first["id"],
    }
    assert Job.objects.count() == 1


def test_tokens_belong_to_their_user(world):
    """alice and bob may both use "nightly": two users, two jobs."""
    body = job_request(client_token="nightly")
    bob = world.client("bob").post(JOBS, body, format="json")
    alice = world.client("alice").post(JOBS, body, format="json")
    assert (bob.status_code, alice.status_code) == (201, 201)
    assert bob.json()["id"] != alice.json()["id"]


def test_no_token_means_a_new_job_each_time(world):
    bob = world.client("bob")
    ids = {bob.post(JOBS, job_request(), format="json").json()["id"] for _ in range(2)}
    assert len(ids) == 2


@pytest.mark.django_db(transaction=True)
def test_concurrent_submits_with_one_token_make_one_job():
    """Eight threads submit the same request with the same token at once: the database lets
    exactly one in (201); the others get that job back (200)."""
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL: SQLite serialises writers, so there is no race to test")
    world = build_world()
    add_cluster(world)
    world.tokens["bob"]  # one token, made before the threads use it
    barrier = threading.Barrier(8)
    results: list[tuple[int, int]] = []

    def submit() -> None:
        try:
            client = world.client("bob")
            barrier.wait(timeout=10)
            response = client.post(JOBS, job_request(client_token="race"), format="json")
            results.append((response.status_code, response.json()["id"]))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    statuses = sorted(status for status, _ in results)
    assert statuses == [200] * 7 + [201], results
    assert len({job_id for _, job_id in results}) == 1
    assert Job.objects.filter(client_token="race").count() == 1


def test_a_token_s_first_job_is_found_in_the_submit_s_one_query(world):
    """Whether bob already used the token is read with the share, in the submit's one SELECT
    besides the token; a token that was used then loads its job."""
    from django.test.utils import CaptureQueriesContext

    from tests.api.test_submit_queries import statements

    bob = world.client("bob")
    with CaptureQueriesContext(connection) as context:
        first = bob.post(JOBS, job_request(client_token="run-7"), format="json")
    assert first.status_code == 201
    assert len(statements(context, "SELECT")) == 2, statements(context, "SELECT")
    again = bob.post(JOBS, job_request(client_token="run-7"), format="json")
    assert (again.status_code, again.json()["id"]) == (200, first.json()["id"])


def test_a_used_token_with_an_unknown_share_is_a_conflict(world):
    """Outside the API (no members_only), a token used for a job in research and sent again
    with a share that does not exist names the first job, as for any other difference."""
    from scheduler.jobs.services import ClientTokenConflict, job_submit

    fields = {"gpu_type": "h100", "gpus": 8, "command": "x", "client_token": "run-8"}
    first, created = job_submit(user=world.users["bob"], share_name="research", **fields)
    assert created
    with pytest.raises(ClientTokenConflict) as conflict:
        job_submit(user=world.users["bob"], share_name="no-such-share", **fields)
    assert conflict.value.job == first
    again, created = job_submit(user=world.users["bob"], share_name="research", **fields)
    assert (again, created) == (first, False)
