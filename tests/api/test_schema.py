"""Schemathesis against the project's own OpenAPI schema: generated requests, valid and not,
never get a 5xx, and every response matches the schema. Bounded to a few examples per
operation so the whole run stays well under a minute."""

from __future__ import annotations

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
)

from portal.wsgi import application
from scheduler.jobs.services import job_submit
from scheduler.models import Job

EXAMPLES_PER_OPERATION = 12

schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application)


@pytest.fixture(autouse=True)
def keep_the_test_connection():
    """Schemathesis calls the WSGI app directly, so Django's end-of-request hook would close
    the connection that holds the test's transaction (Django's own test client unhooks it the
    same way)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def test_the_schema_is_valid_openapi():
    """What `manage.py spectacular --validate` checks: the schema is valid OpenAPI 3.0, so
    client generators and validators take it as it is."""
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.validation import validate_schema

    validate_schema(SchemaGenerator().get_schema(request=None, public=True))


@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_api_never_fails_and_matches_its_schema(case, world):
    """As the admin (who may call every operation), then as bob (a member)."""
    for persona in ("root", "bob"):
        case.call_and_validate(
            headers={"Authorization": f"Token {world.tokens[persona]}"},
            checks=[not_a_server_error, response_schema_conformance, content_type_conformance],
        )


def test_schema_describes_the_contract():
    """The paths of DESIGN §4 are all in the schema."""
    paths = set(schema.raw_schema["paths"])
    assert {
        "/api/v1/jobs/",
        "/api/v1/jobs/{job_id}/",
        "/api/v1/jobs/{job_id}/cancel/",
        "/api/v1/shares/",
        "/api/v1/shares/{name}/",
        "/api/v1/shares/{name}/usage/",
        "/api/v1/shares/{name}/history/",
        "/api/v1/queue/",
        "/api/v1/nodes/",
    } <= paths


# Generated path parameters are almost always ids and names that do not exist (a 404). Below
# they name real objects, so the generated bodies reach the code behind each operation.


@schema.parametrize()
@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_api_on_real_objects_as_admin(case, world):
    """As the admin, with path parameters naming a real job, share or node: no 5xx, and every
    response matches the schema."""
    # The world lives as long as the operation's examples: earlier ones may have disabled the
    # share or cancelled the job, which is fine; the job just has to exist.
    job = (
        Job.objects.order_by("pk").first()
        or job_submit(
            user=world.users["bob"], share_name="research", gpu_type="h100", gpus=8, command="true"
        )[0]
    )
    if case.path_parameters:
        if "job_id" in case.path_parameters:
            case.path_parameters["job_id"] = job.pk
        if "name" in case.path_parameters:
            node_path = case.operation.path.startswith("/api/v1/nodes/")
            case.path_parameters["name"] = "h100-0" if node_path else "research"
    case.call_and_validate(
        headers={"Authorization": f"Token {world.tokens['root']}"},
        checks=[not_a_server_error, response_schema_conformance, content_type_conformance],
    )
