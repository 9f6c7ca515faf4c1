"""A submit reads little: throughput of the API depends on it (bench/api.py)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduler.models import Job, JobEvent
from tests.api.helpers import job_request

JOBS = "/api/v1/jobs/"


def statements(context: CaptureQueriesContext, verb: str) -> list[str]:
    return [q["sql"] for q in context.captured_queries if q["sql"].lstrip().startswith(verb)]


def test_a_submit_reads_the_share_membership_limits_and_nodes_in_one_query(world):
    """Besides the token, one SELECT: the share with its limits, whether the user is on its team,
    and the sizes of the nodes of the GPU type; then the job and its two events are inserted, in
    one statement on PostgreSQL."""
    client = world.client("bob")
    with CaptureQueriesContext(connection) as context:
        response = client.post(JOBS, job_request(), format="json")
    assert response.status_code == 201, response.content
    selects = statements(context, "SELECT")
    assert len(selects) == 2, selects  # the token, then the share and everything it decides
    writes = statements(context, "INSERT") + statements(context, "WITH")
    assert len(writes) == (1 if connection.vendor == "postgresql" else 2), writes
    job = Job.objects.get()
    assert list(JobEvent.objects.filter(job=job).values_list("to_state", flat=True)) == [
        Job.State.SUBMITTED,
        Job.State.RUNNABLE,
    ]


def test_shared_fields_write_a_job_as_drf_builds_them_per_instance(world):
    """The job serializers build their fields once per class, and show plain values as they
    are; the JSON is what DRF's ModelSerializer writes when it builds them for every instance
    and converts every value."""
    from rest_framework import serializers

    from scheduler.api.serializers import JobDetailSerializer, JobSerializer
    from scheduler.jobs.selectors import job_detail

    class PerInstance(serializers.ModelSerializer):
        share = serializers.SlugRelatedField(slug_field="name", read_only=True)
        submitted_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

        class Meta(JobSerializer.Meta):
            pass

    response = world.client("bob").post(JOBS, job_request(env={"A": "1"}), format="json")
    job = job_detail(user=world.users["bob"], job_id=response.json()["id"])
    assert response.json() == PerInstance(job).data
    assert JobSerializer([job, job], many=True).data == [PerInstance(job).data] * 2
    detail = JobDetailSerializer(job).data
    assert {k: detail[k] for k in JobSerializer.Meta.fields} == PerInstance(job).data
    assert [e["to_state"] for e in detail["events"]] == ["SUBMITTED", "RUNNABLE"]
    job.state, job.cancel_requested, job.timeout_seconds = Job.State.RUNNING, True, 60
    job.started_at, job.name, job.env = timezone.now(), "ünïcode", {"B": "", "A": "2"}
    assert JobSerializer(job).data == PerInstance(job).data


def test_a_wrong_token_or_an_inactive_user_is_refused_as_drf_refuses_them(world):
    """The written-out token lookup answers as DRF's TokenAuthentication: 401 and its words."""
    from rest_framework.test import APIClient

    stranger = APIClient()
    stranger.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    response = stranger.get(JOBS)
    assert (response.status_code, response.json()["detail"]) == (401, "Invalid token.")

    world.users["bob"].is_active = False
    world.users["bob"].save()
    response = world.client("bob").get(JOBS)
    assert (response.status_code, response.json()["detail"]) == (401, "User inactive or deleted.")


def test_the_token_authenticates_its_user_with_the_token_as_request_auth(world, rf):
    from scheduler.api.authentication import ApiTokenAuthentication

    request = rf.get(JOBS, HTTP_AUTHORIZATION=f"Token {world.tokens['alice']}")
    user, token = ApiTokenAuthentication().authenticate(request)
    assert user == world.users["alice"]
    assert (token.key, token.user, token.created) == (
        world.tokens["alice"],
        user,
        type(token).objects.get(key=world.tokens["alice"]).created,
    )


def test_a_revoked_token_stops_working_at_once(world):
    """Nothing about a token is kept between requests: the request after its deletion is 401,
    and so is a submit by a user made inactive since the last request."""
    from rest_framework.authtoken.models import Token

    bob = world.client("bob")
    assert bob.post(JOBS, job_request(), format="json").status_code == 201
    Token.objects.filter(key=world.tokens["bob"]).delete()
    response = bob.post(JOBS, job_request(), format="json")
    assert (response.status_code, response.json()["detail"]) == (401, "Invalid token.")

    alice = world.client("alice")
    assert alice.post(JOBS, job_request(), format="json").status_code == 201
    type(world.users["alice"]).objects.filter(pk=world.users["alice"].pk).update(is_active=False)
    response = alice.post(JOBS, job_request(), format="json")
    assert (response.status_code, response.json()["detail"]) == (401, "User inactive or deleted.")
    assert Job.objects.count() == 2


def test_on_postgresql_a_submit_s_statements_are_prepared_once_per_connection(world):
    """The token lookup, the submit target and the insert are parsed and planned by the first
    submit on a connection; later submits only execute them."""
    if connection.vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")

    def prepared() -> set[str]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement FROM pg_prepared_statements")
            return {row[0] for row in cursor.fetchall()}

    client = world.client("bob")
    assert client.post(JOBS, job_request(), format="json").status_code == 201
    after_first = prepared()
    assert any("authtoken_token" in sql for sql in after_first), after_first
    assert any("shares_capacitylimit" in sql for sql in after_first), after_first
    assert any("INSERT INTO" in sql for sql in after_first), after_first
    assert client.post(JOBS, job_request(), format="json").status_code == 201
    assert prepared() == after_first
