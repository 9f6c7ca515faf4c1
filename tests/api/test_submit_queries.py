"""A submit reads little: throughput of the API depends on it (bench/api.py)."""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduler.models import Job, JobEvent
from tests.api.conftest import job_request

JOBS = "/api/v1/jobs/"


def statements(context: CaptureQueriesContext, verb: str) -> list[str]:
    return [q["sql"] for q in context.captured_queries if q["sql"].lstrip().startswith(verb)]


def test_a_submit_reads_the_share_membership_limits_and_nodes_in_one_query(world):
    """Besides the token, one SELECT: the share with its limits, whether the user is on its team,
    and the sizes of the nodes of the GPU type; then the job and its two events are inserted."""
    client = world.client("bob")
    with CaptureQueriesContext(connection) as context:
        response = client.post(JOBS, job_request(), format="json")
    assert response.status_code == 201, response.content
    selects = statements(context, "SELECT")
    assert len(selects) == 2, selects  # the token, then the share and everything it decides
    assert len(statements(context, "INSERT")) == 2  # the job, then both of its events
    job = Job.objects.get()
    assert list(JobEvent.objects.filter(job=job).values_list("to_state", flat=True)) == [
        Job.State.SUBMITTED,
        Job.State.RUNNABLE,
    ]
