"""The invariant checker itself: silent on a consistent database, loud on a broken one. And the
503 a view answers when the database fails under it."""

from __future__ import annotations

from unittest import mock

import pytest
from django.db import OperationalError
from rest_framework.authtoken.models import Token

from scheduler.jobs.services import job_submit
from scheduler.models import Job, JobAttempt
from tests.conftest import make_node
from tests.reliability.invariants import check_invariants

pytestmark = pytest.mark.django_db


def test_consistent_database_passes_and_a_broken_one_is_named(world):
    make_node("node-a")
    job, _ = job_submit(user=world.alice, share_name="research", gpu_type="h100", gpus=2,
                        command="true")  # fmt: skip
    check_invariants(accepted_job_ids=[job.pk], settled=True)

    Job.objects.filter(pk=job.pk).update(state=Job.State.RUNNING)  # no attempt, no event
    JobAttempt.objects.create(job=job, number=1, borrowed_gpus=5)  # borrows more than it asks
    with pytest.raises(AssertionError) as error:
        check_invariants(accepted_job_ids=[job.pk, job.pk + 1000], settled=True)
    message = str(error.value)
    assert f"job {job.pk} is RUNNING but its last event says RUNNABLE" in message
    assert "borrows 5 of 2 GPUs" in message
    assert f"job {job.pk + 1000} was accepted (2xx) but is not in the database" in message


def test_database_error_in_a_view_is_a_503_with_retry_after(client, world):
    token = Token.objects.create(user=world.alice)
    with mock.patch("scheduler.jobs.services.job_submit", side_effect=OperationalError("down")):
        response = client.post(
            "/api/v1/jobs/",
            {"share": "research", "gpu_type": "h100", "gpus": 1, "command": "true"},
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Token {token.key}",
        )
    assert response.status_code == 503
    assert response.json()["code"] == "database_unavailable"
    assert int(response["Retry-After"]) > 0
