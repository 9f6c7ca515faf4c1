"""Bad input gets a clear 4xx naming the field and the rule, never a 500."""

from __future__ import annotations

import json

import pytest
from django.contrib.staticfiles import finders
from hypothesis import HealthCheck, assume, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from portal.pagination import PAGE_RULE, PAGE_SIZE_RULE, PAST_THE_LAST
from scheduler import models
from scheduler.api import serializers as s
from scheduler.api import views
from scheduler.api.errors import BODY_EMPTY, BODY_NOT_AN_OBJECT
from scheduler.jobs import services
from scheduler.models import (
    GPUS_DIVISIBLE_BY_NODES,
    IMAGE_INVALID,
    MAX_TIMEOUT_SECONDS,
    PRIORITY_RANGE,
    TIMEOUT_RANGE,
    WORKING_DIR_INVALID,
    Job,
)
from shares.models import BORROW_LIMIT_ONLY_WITH_LEND_AND_BORROW, QuotaShare
from shares.services import share_update
from tests.api.helpers import job_request

JOBS = "/api/v1/jobs/"


def submit(world, persona="bob", **overrides):
    return world.client(persona).post(JOBS, job_request(**overrides), format="json")


def assert_error(response, status: int, field: str, message: str) -> None:
    assert response.status_code == status, response.content
    assert response.json()[field] == [message]
    if response.request["PATH_INFO"] == JOBS:
        assert not Job.objects.exists(), "a refused submit created a job"


def test_unknown_share_is_404_naming_the_share(world):
    """A share that does not exist and a share of another team read the same: no leak."""
    missing = submit(world, share="nope")
    foreign = submit(world, share="vision")
    assert_error(missing, 404, "share", views.SHARE_NOT_YOURS.format(name="nope"))
    assert_error(foreign, 404, "share", views.SHARE_NOT_YOURS.format(name="vision"))


def test_admin_submitting_to_an_unknown_share_gets_404(world):
    response = submit(world, "root", share="nope")
    assert_error(response, 404, "share", views.SHARE_NOT_FOUND.format(name="nope"))


def test_disabled_share_refuses_new_jobs(world):
    share_update(share=world.shares["research"], actor=None, source="api", state="DISABLED")
    response = submit(world)
    assert_error(response, 400, "share", services.SHARE_DISABLED.format(name="research"))


def test_gpu_type_without_a_limit_lists_the_allowed_ones(world):
    response = submit(world, gpu_type="a100-80g")
    assert_error(
        response,
        400,
        "gpu_type",
        services.GPU_TYPE_NOT_IN_SHARE.format(
            share="research", gpu_type="a100-80g", allowed="h100, l4"
        ),
    )


def test_gpu_type_with_no_node_could_never_run(world):
    share_update(
        share=world.shares["research"],
        actor=None,
        source="api",
        capacity_limits={"h100": 8, "a100": 8},
    )
    response = submit(world, gpu_type="a100")
    assert_error(response, 400, "gpu_type", services.NO_NODES_OF_TYPE.format(gpu_type="a100"))


def test_badly_spelt_gpu_type(world):
    response = submit(world, gpu_type="H100!")
    assert response.status_code == 400
    assert "gpu_type: use lowercase letters" in response.json()["gpu_type"][0]


def test_more_gpus_per_node_than_any_node_has(world):
    response = submit(world, gpus=16)
    assert_error(
        response,
        400,
        "gpus",
        services.NEVER_FITS_PER_NODE.format(
            per_node=16, gpus=16, nodes=1, gpu_type="h100", largest=8
        ),
    )


def test_more_nodes_than_exist(world):
    response = submit(world, gpus=24, nodes=3)
    assert_error(
        response,
        400,
        "nodes",
        services.NEVER_FITS_NODE_COUNT.format(nodes=3, gpu_type="h100", per_node=8, available=2),
    )


def test_absurd_gpu_count(world):
    assert_error(submit(world, gpus=10**12), 400, "gpus", s.GPUS_RANGE)
    assert_error(submit(world, gpus=0), 400, "gpus", s.GPUS_RANGE)


def test_gpus_not_divisible_by_nodes(world):
    response = submit(world, gpus=9, nodes=2)
    assert_error(response, 400, "gpus", GPUS_DIVISIBLE_BY_NODES.format(nodes=2))


@pytest.mark.parametrize("priority", [-1, 10000, 2**40])
def test_priority_out_of_range(world, priority):
    assert_error(submit(world, priority=priority), 400, "priority", PRIORITY_RANGE)


@pytest.mark.parametrize("timeout", [0, -5, 10**9])
def test_negative_or_absurd_timeout(world, timeout):
    assert_error(submit(world, timeout_seconds=timeout), 400, "timeout_seconds", TIMEOUT_RANGE)


@pytest.mark.parametrize("command", ["", "   \n"])
def test_empty_command(world, command):
    assert_error(submit(world, command=command), 400, "command", services.COMMAND_EMPTY)


def test_missing_command(world):
    body = job_request()
    del body["command"]
    response = world.client("bob").post(JOBS, body, format="json")
    assert_error(response, 400, "command", s.COMMAND_REQUIRED)


def test_command_too_long(world):
    response = submit(world, command="x" * (s.MAX_COMMAND_CHARS + 1))
    assert_error(response, 400, "command", s.COMMAND_TOO_LONG)


def test_env_rules(world):
    too_many = {f"V{i}": "1" for i in range(models.MAX_ENV_VARS + 1)}
    assert_error(submit(world, env=too_many), 400, "env", models.ENV_TOO_MANY)
    assert_error(submit(world, env={"1BAD": "x"}), 400, "env", models.ENV_NAME.format(name="1BAD"))
    long_value = {"BIG": "x" * (models.MAX_ENV_VALUE_CHARS + 1)}
    assert_error(
        submit(world, env=long_value), 400, "env", models.ENV_VALUE_TOO_LONG.format(name="BIG")
    )
    assert_error(submit(world, env={"N": 3}), 400, "env", models.ENV_VALUE_TYPE.format(name="N"))
    response = submit(world, env=["A=1"])
    assert response.status_code == 400 and "env" in response.json()


def test_oversized_body_is_413(world, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    body = json.dumps(job_request(name="x" * 20_000))
    response = world.client("bob").post(JOBS, body, content_type="application/json")
    assert response.status_code == 413
    assert response.json()["detail"] == s_body_too_large(len(body), 10_000)


def s_body_too_large(size: int, limit: int) -> str:
    from scheduler.api.errors import BODY_TOO_LARGE

    return BODY_TOO_LARGE.format(size=size, limit=limit)


def test_name_and_client_token_length(world):
    assert_error(submit(world, name="n" * 201), 400, "name", s.NAME_TOO_LONG)
    assert_error(submit(world, client_token="t" * 65), 400, "client_token", s.CLIENT_TOKEN_TOO_LONG)


def test_retry_and_preemption_bounds(world):
    assert_error(submit(world, retry_attempts=21), 400, "retry_attempts", s.RETRY_ATTEMPTS_RANGE)
    assert_error(submit(world, max_preemptions=-1), 400, "max_preemptions", s.MAX_PREEMPTIONS_RANGE)


@pytest.mark.parametrize(
    ("field", "value"),
    [("gpus", "eight"), ("gpus", 1.5), ("priority", "high"), ("nodes", [1]), ("share", {"a": 1})],
)
def test_wrong_types(world, field, value):
    response = submit(world, **{field: value})
    assert response.status_code == 400
    assert field in response.json()


def test_a_field_a_job_does_not_have_is_refused_naming_it(world):
    """A misspelled field is not ignored: "preemtible": false would leave the job preemptible
    without a word. The what-if refuses it too; a form's CSRF token is no job field."""
    response = submit(world, preemtible=False)
    known = ", ".join(s.JobSubmitSerializer().fields)
    assert_error(response, 400, "preemtible", s.UNKNOWN_JOB_FIELD.format(field="preemtible",
                                                                          known=known))  # fmt: skip
    assert "preemptible" in response.json()["preemtible"][0]
    both = world.client("bob").post(
        "/api/v1/jobs/estimate/", job_request(priorty=5, gpu=2), format="json"
    )
    assert both.status_code == 400 and set(both.json()) == {"gpu", "priorty"}
    form = world.client("bob").post(JOBS, {**job_request(), "csrfmiddlewaretoken": "x"})
    assert form.status_code == 201, form.content


def test_malformed_json(world):
    response = world.client("bob").post(JOBS, "{not json", content_type="application/json")
    assert response.status_code == 400
    assert "JSON parse error" in response.json()["detail"]


@pytest.mark.parametrize(
    ("body", "what"),
    [("[1, 2]", "an array"), ('"train"', "a string"), ("8", "a number"), ("true", "true or false")],
)
def test_body_that_is_not_an_object(world, body, what):
    response = world.client("bob").post(JOBS, body, content_type="application/json")
    assert response.status_code == 400
    assert response.json() == {"non_field_errors": [BODY_NOT_AN_OBJECT.format(what=what)]}


def test_body_that_is_null(world):
    response = world.client("bob").post(JOBS, "null", content_type="application/json")
    assert response.status_code == 400
    assert response.json() == {"non_field_errors": [BODY_EMPTY]}


def test_patch_changes_only_priority(world):
    job_id = submit(world).json()["id"]
    alice = world.client("alice")
    response = alice.patch(f"{JOBS}{job_id}/", {"gpus": 4, "priority": 3}, format="json")
    assert_error(response, 400, "gpus", s.ONLY_PRIORITY.format(fields="gpus"))
    response = alice.patch(f"{JOBS}{job_id}/", {"priority": 10000}, format="json")
    assert_error(response, 400, "priority", PRIORITY_RANGE)
    response = alice.patch(f"{JOBS}{job_id}/", {"priority": 7}, format="json")
    assert response.status_code == 200 and response.json()["priority"] == 7


def test_priority_of_an_ended_job_cannot_change(world):
    job_id = submit(world).json()["id"]
    alice = world.client("alice")
    alice.post(f"{JOBS}{job_id}/cancel/")
    response = alice.patch(f"{JOBS}{job_id}/", {"priority": 7}, format="json")
    assert_error(
        response,
        400,
        "priority",
        services.PRIORITY_OF_ENDED_JOB.format(job=job_id, state="CANCELLED"),
    )


def test_cancel_twice_is_a_no_op_and_a_finished_job_is_409(world):
    job_id = submit(world).json()["id"]
    bob = world.client("bob")
    assert bob.post(f"{JOBS}{job_id}/cancel/").json()["state"] == "CANCELLED"
    assert bob.post(f"{JOBS}{job_id}/cancel/").status_code == 200
    Job.objects.filter(pk=job_id).update(state=Job.State.SUCCEEDED)
    response = bob.post(f"{JOBS}{job_id}/cancel/")
    assert response.status_code == 409
    assert response.json()["detail"] == services.ALREADY_FINAL.format(job=job_id, state="SUCCEEDED")


def test_unknown_or_huge_job_id_is_404(world):
    bob = world.client("bob")
    assert bob.get(f"{JOBS}999999/").json()["detail"] == views.JOB_NOT_FOUND.format(job_id=999999)
    assert bob.get(f"{JOBS}{10**30}/").status_code == 404


def test_list_filters_are_checked(world):
    bob = world.client("bob")
    assert_error(bob.get(JOBS, {"state": "BOGUS"}), 400, "state",
                 'state: "BOGUS" is none of ' + ", ".join(Job.State.values) + ".")  # fmt: skip
    assert "since" in bob.get(JOBS, {"since": "yesterday"}).json()
    assert bob.get(JOBS, {"page": 99}).status_code == 404


@pytest.mark.parametrize(
    "path", [JOBS, "/api/v1/shares/research/history/", "/api/v1/notifications/subscriptions/",
             "/api/v1/notifications/deliveries/"],
)  # fmt: skip
def test_a_list_refuses_a_page_or_page_size_it_cannot_serve_naming_the_rule(world, path):
    """Never ignored (a client would read a page it did not ask for as the one it did)."""
    bob = world.client("bob")
    for page in ("0", "-1", "abc", "1.5", "٣", ""):
        assert_error(bob.get(path, {"page": page}), 400, "page", PAGE_RULE)
    for size in ("0", "501", "abc", "null", "2.0"):
        assert_error(bob.get(path, {"page_size": size}), 400, "page_size", PAGE_SIZE_RULE)
    past = bob.get(path, {"page": 7})
    assert past.status_code == 404
    assert past.json()["page"] == [PAST_THE_LAST.format(page=7, last=1)]
    assert bob.get(path, {"page": "last", "page_size": 500}).status_code == 200


def test_the_last_page_and_a_page_size_are_served(world):
    for _ in range(5):
        submit(world)
    bob = world.client("bob")
    last = bob.get(JOBS, {"page": "last", "page_size": 2}).json()
    assert last["count"] == 5 and len(last["results"]) == 1 and last["next"] is None
    assert len(bob.get(JOBS, {"page": 3, "page_size": 2}).json()["results"]) == 1


def test_list_filters_and_next_link(world):
    bob, alice = world.client("bob"), world.client("alice")
    for _ in range(3):
        submit(world)
    submit(world, "alice", priority=9)
    page = bob.get(JOBS, {"page_size": 2}).json()
    assert page["count"] == 4 and len(page["results"]) == 2
    assert page["next"].endswith("page=2&page_size=2")
    assert bob.get(JOBS, {"submitted_by": "alice"}).json()["count"] == 1
    assert bob.get(JOBS, {"state": ["RUNNABLE", "RUNNING"]}).json()["count"] == 4
    assert alice.get(JOBS, {"share": "research", "since": "2000-01-01T00:00Z"}).json()["count"] == 4
    assert bob.get(JOBS, {"since": "2999-01-01T00:00Z"}).json()["count"] == 0


# --- Shares -----------------------------------------------------------------------------------


def create_share(world, **body):
    body = {"name": "new", "team": "vision", "capacity_limits": {"h100": 4}, **body}
    return world.client("root").post("/api/v1/shares/", body, format="json")


@pytest.mark.parametrize(
    "image", ["Ubuntu:latest", "trainer image", "trainer:", "-x", "a" * 600, True, ["busybox"]]
)
def test_an_image_that_is_no_image_reference_is_refused_naming_the_rule(world, image):
    response = submit(world, image=image)
    assert_error(response, 400, "image", IMAGE_INVALID)


def test_a_job_keeps_its_image_and_shows_it(world):
    """The image a job names is what Kubernetes nodes run its command in; it is shown back."""
    image = "registry.example.com:5000/team/trainer:1.4"
    response = submit(world, image=image)
    assert response.status_code == 201, response.content
    assert response.json()["image"] == image
    described = world.client("bob").get(f"{JOBS}{response.json()['id']}/").json()
    assert described["image"] == image
    assert submit(world, name="no-image").json()["image"] == ""


@pytest.mark.parametrize(
    "working_dir", ["train", "./code", "~/code", "/data/a\nb", "/x\x00", "/" + "a" * 1024, 7,
                    ["/code"]],
)  # fmt: skip
def test_a_working_directory_that_is_no_absolute_path_is_refused_naming_the_rule(
    world, working_dir
):
    response = submit(world, working_dir=working_dir)
    assert_error(response, 400, "working_dir", WORKING_DIR_INVALID)


def test_a_job_keeps_its_working_directory_and_shows_it(world):
    """Where the command starts on the node; blank (the default): its checkpoint directory."""
    path = "/home/bob/my project"
    response = submit(world, working_dir=path)
    assert response.status_code == 201, response.content
    described = world.client("bob").get(f"{JOBS}{response.json()['id']}/").json()
    assert response.json()["working_dir"] == described["working_dir"] == path
    assert submit(world, name="anywhere").json()["working_dir"] == ""


@pytest.mark.parametrize(
    ("body", "field", "message"),
    [
        ({"gpus": "abc"}, "gpus", s.GPUS_RANGE),
        ({"priority": "high"}, "priority", PRIORITY_RANGE),
        ({"timeout_seconds": 1.5}, "timeout_seconds", TIMEOUT_RANGE),
        ({"gpus": "9" * 1001}, "gpus", s.GPUS_RANGE),
        ({"nodes": None}, "nodes", "nodes: This field may not be null."),
        ({"preemptible": "maybe"}, "preemptible", "preemptible: Must be a valid boolean."),
        ({"share": None}, "share", "share: This field may not be null."),
    ],
)
def test_whatever_drf_itself_refuses_names_its_field_and_rule(world, body, field, message):
    """A whole number that is none is refused with its range; DRF's own messages (a wrong
    type, a null) begin with the field's name, as the API's do."""
    assert_error(submit(world, **body), 400, field, message)


def test_a_share_strategy_that_is_none_is_refused_naming_the_three(world):
    response = create_share(world, strategy="SHARE")
    assert_error(response, 400, "strategy",
                 'strategy: "SHARE" is none of RESERVE, LEND, LEND_AND_BORROW.')  # fmt: skip


def test_share_create_rules(world):
    response = create_share(world, strategy="LEND", borrow_limit=50)
    assert_error(response, 400, "borrow_limit", BORROW_LIMIT_ONLY_WITH_LEND_AND_BORROW)
    response = create_share(world, lend_limit=5)
    assert response.status_code == 400
    assert response.json()["lend_limit"] == [
        "lend_limit: cannot lend more than the limit (4 h100 GPUs)."
    ]
    response = create_share(world, team="nobody")
    assert_error(response, 400, "team", views.TEAM_UNKNOWN.format(slug="nobody"))
    response = create_share(world, capacity_limits={})
    assert response.status_code == 400 and "capacity_limits" in response.json()
    response = create_share(world, name="vision")
    assert response.status_code == 400 and "name" in response.json()
    assert not QuotaShare.objects.filter(name="new").exists()


def test_share_update_is_recorded_in_history(world):
    root = world.client("root")
    response = root.patch(
        "/api/v1/shares/research/",
        {"capacity_limits": {"h100": 4}, "lend_limit": 2, "weight": 3},
        format="json",
    )
    assert response.status_code == 200, response.content
    assert response.json()["capacity_limits"] == {"h100": 4}
    assert response.json()["lend_limit"] == {"h100": 2}
    history = root.get("/api/v1/shares/research/history/").json()["results"]
    latest = {
        (c["field"], c["old_value"], c["new_value"], c["source"], c["changed_by"])
        for c in history[:2]
    }
    assert latest == {
        ("capacity_limits", "h100: 8, l4: 2", "h100: 4 (lends at most 2)", "api", "root"),
        ("weight", "1.0", "3.0", "api", "root"),
    }
    root.post("/api/v1/shares/research/disable/")
    assert (
        root.get("/api/v1/shares/research/history/").json()["results"][0]["new_value"] == "DISABLED"
    )


def test_share_update_with_bad_values(world):
    root = world.client("root")
    response = root.patch("/api/v1/shares/vision/", {"borrow_limit": 10}, format="json")
    assert_error(response, 400, "borrow_limit", BORROW_LIMIT_ONLY_WITH_LEND_AND_BORROW)
    response = root.patch("/api/v1/shares/vision/", {"grace_seconds": -1}, format="json")
    assert response.status_code == 400 and "grace_seconds" in response.json()


def test_swagger_ui_assets_are_served_from_our_static_files(world):
    """The docs page loads Swagger UI from drf-spectacular-sidecar, not a CDN."""
    page = world.client(None).get("/api/docs/").content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in page
    assert "cdn" not in page.lower()
    assert finders.find("drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js")


_whole_numbers = st.one_of(
    st.none(),
    st.integers(min_value=-3, max_value=2**40),
    st.sampled_from([0, 1, 2, 8, 1000, 9999, 10000, 20, 21, MAX_TIMEOUT_SECONDS, 2**31]),
)
# gpus and nodes are required and must divide: drawn in range often enough that a good share of
# the requests is valid (else Hypothesis may find too few to test, and give up).
_sizes = st.one_of(st.integers(min_value=1, max_value=16), _whole_numbers)


@hypothesis_settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    gpu_type=st.one_of(st.from_regex(r"[a-z0-9][a-z0-9-]{0,40}", fullmatch=True), st.text()),
    gpus=_sizes,
    nodes=_sizes,
    priority=_whole_numbers,
    timeout_seconds=_whole_numbers,
    max_preemptions=_whole_numbers,
    retry_attempts=_whole_numbers,
    name=st.text(max_size=210),
    client_token=st.text(max_size=70),
    command=st.text(min_size=1, max_size=50),
    env=st.dictionaries(st.text(max_size=8), st.text(max_size=8), max_size=3),
    image=st.one_of(
        st.none(),
        st.text(max_size=30),
        st.from_regex(
            r"([a-z0-9.-]{1,12}(:[0-9]{1,5})?/)?[a-z0-9._/-]{1,20}(:[\w.-]{1,9})?", fullmatch=True
        ),
    ),  # fmt: skip
    working_dir=st.one_of(st.none(), st.text(max_size=20), st.text(max_size=20).map("/".__add__)),
)
def test_what_the_submit_serializer_accepts_the_job_model_accepts(**fields):
    """The API submits with fields_validated: a request JobSubmitSerializer accepts breaks none
    of the rules of the Job model's fields (job_submit checks an empty command and GPUs that do
    not divide among the nodes itself, with or without it)."""
    request = {"share": "research", **{k: v for k, v in fields.items() if v is not None}}
    serializer = s.JobSubmitSerializer(data=request)
    assume(serializer.is_valid())
    data = dict(serializer.validated_data)
    del data["share"]
    assume(data["command"].strip() and data["gpus"] % data["nodes"] == 0)
    Job(**data).full_clean(exclude=["share", "submitted_by"], validate_constraints=False)
