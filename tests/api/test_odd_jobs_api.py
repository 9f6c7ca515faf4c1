"""The job endpoints as a pipeline meets them with odd input: every bad value is a 400 that names
its field and rule, never a 500, and a refused request stores nothing."""

from __future__ import annotations

import pytest

from scheduler import models
from scheduler.api import serializers as s
from scheduler.models import Job
from tests.api.helpers import job_request

JOBS = "/api/v1/jobs/"
ESTIMATE = "/api/v1/jobs/estimate/"

# A submit body written by hand: JSON escapes (a lone surrogate, \u0000) reach the server as
# they are, which an encoder on the client side would refuse to write.
RAW_SUBMIT = '{"share": "research", "gpu_type": "h100", "gpus": 8, "command": "train"%s}'


def post_raw(world, path: str, body: str, persona: str = "bob"):
    return world.client(persona).post(path, body, content_type="application/json")


@pytest.mark.parametrize(
    ("escaped", "character"), [("\\u0000", "a NUL character"), ("\\ud800", "a lone surrogate")]
)
@pytest.mark.parametrize("path", [JOBS, ESTIMATE])
def test_an_env_value_no_environment_can_hold_is_refused_naming_the_variable(
    world, path, escaped, character
):
    """A lone surrogate in an env value was accepted, stored, and then every read that showed
    the job (the submit's answer, the team's job list, the queue) was a 500: the pipeline saw
    its submit fail while the job stayed queued."""
    response = post_raw(world, path, RAW_SUBMIT % f', "env": {{"HOME": "/x", "TAG": "a{escaped}"}}')
    assert response.status_code == 400, response.content
    assert response.json() == {
        "env": [models.ENV_VALUE_CHARACTER.format(name="TAG", character=character)]
    }
    assert not Job.objects.exists()
    assert world.client("bob").get(JOBS).status_code == 200


@pytest.mark.parametrize("path", [JOBS, ESTIMATE])
def test_a_field_name_with_a_lone_surrogate_is_a_400_naming_it_not_a_500(world, path):
    response = post_raw(world, path, RAW_SUBMIT % ', "pre\\udcffemptible": false')
    assert response.status_code == 400, response.content
    (name, messages), *others = response.json().items()
    assert name == "pre\\udcffemptible" and not others
    assert messages[0].startswith("pre\\udcffemptible: not a field of a job (misspelled?)")
    assert not Job.objects.exists()


def test_a_priority_change_with_a_lone_surrogate_field_is_a_400_naming_it(world):
    job_id = world.client("alice").post(JOBS, job_request(), format="json").json()["id"]
    response = world.client("alice").patch(
        f"{JOBS}{job_id}/", '{"priority": 3, "\\ud800": 1}', content_type="application/json"
    )
    assert response.status_code == 400, response.content
    assert response.json() == {"\\ud800": [s.ONLY_PRIORITY.format(fields="\\ud800")]}
    assert Job.objects.get(pk=job_id).priority == 0


@pytest.mark.parametrize("command", [5, 1.5])
def test_a_command_that_is_a_number_is_refused_as_neither_a_string_nor_a_list(world, command):
    """docs/api.md: neither a string nor a list is a 400; a number ran as the command "5"."""
    response = world.client("bob").post(JOBS, job_request(command=command), format="json")
    assert response.status_code == 400, response.content
    assert response.json() == {"command": [s.COMMAND_TYPE]}
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    "params",
    [{"sate": "RUNNABLE"}, {"limit": "100000"}, {"limit": "-1"}, {"offset": "50"},
     {"cursor": "cD0yMDI2"}, {"status": "RUNNING"}],
    ids=lambda params: "&".join(f"{k}={v}" for k, v in params.items()),
)  # fmt: skip
def test_the_job_list_refuses_a_parameter_it_does_not_take_naming_it(world, params):
    """A misspelled filter (?sate=RUNNABLE) listed every job, and a pipeline acting on the
    list (cancel what is queued) acted on all of them; ?limit= or ?offset= read as if
    honoured gave the first page."""
    world.client("bob").post(JOBS, job_request(), format="json")
    response = world.client("bob").get(JOBS, params)
    assert response.status_code == 400, response.content
    (name,) = params
    assert response.json() == {name: [s.UNKNOWN_JOB_FILTER.format(param=name)]}


def test_the_job_list_still_takes_its_filters_pages_and_format(world):
    for _ in range(3):
        world.client("bob").post(JOBS, job_request(), format="json")
    page = world.client("bob").get(
        JOBS, {"share": "research", "state": ["RUNNABLE"], "submitted_by": "bob",
               "since": "2000-01-01T00:00Z", "gpu_type": "h100", "page": 2, "page_size": 2,
               "format": "json"},
    ).json()  # fmt: skip
    assert page["count"] == 3 and len(page["results"]) == 1
    assert world.client("bob").get(page["previous"]).status_code == 200


def test_a_form_post_with_env_is_refused_rather_than_run_without_it(world):
    """`curl -d env=...` posts a form: its env was dropped and the job ran without it."""
    response = world.client("bob").post(
        JOBS,
        "share=research&gpu_type=h100&gpus=8&command=train&env=EPOCHS%3D3",
        content_type="application/x-www-form-urlencoded",
    )
    assert response.status_code == 400, response.content
    assert response.json() == {"env": [models.ENV_TYPE]}
    assert not Job.objects.exists()


def test_env_that_is_no_map_is_refused_naming_the_rule(world):
    response = world.client("bob").post(JOBS, job_request(env=["EPOCHS=3"]), format="json")
    assert response.status_code == 400, response.content
    assert response.json() == {"env": [models.ENV_TYPE]}
