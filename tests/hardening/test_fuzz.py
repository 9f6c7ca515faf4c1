"""Fuzzing the two parsers that read what others write: the agent endpoints' JSON bodies and the
simulator's scenarios.

Agent endpoints (Django's test client, a real node token, a job running on the node): any body
gets a 2xx or a clear 4xx naming a field, never a 5xx, and a refused request writes nothing but
what its well-formed events say (docs/agent.md: one bad event does not hold back the others).
Scenarios: any YAML-ish value is either a scenario or a ScenarioError with a message, never
another exception, and what is accepted has finite times."""

from __future__ import annotations

import json
import math
import string

import pytest
from django.test import Client
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from scheduler.agent.protocol import END_REASONS, EVENT_TYPES
from scheduler.cycle.run import cycle_run
from scheduler.jobs.services import job_submit
from scheduler.models import ClusterSettings, GpuAssignment, Job, JobAttempt, JobEvent, Node
from scheduler.simulator.scenario import Scenario, ScenarioError, load_scenario, parse_scenario

JOIN = "fuzz-join-token"
FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)

# --- Agent endpoints ----------------------------------------------------------------------------

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
EVENT_KEYS = ("type", "attempt", "end", "exit_code", "signalled", "log_tail", "detail")


def event_values(attempt_ids: list[int]):
    """Event fields: mostly plausible (a real attempt, a known type), sometimes anything."""
    return {
        "type": st.sampled_from(EVENT_TYPES) | json_values,
        "attempt": st.sampled_from(attempt_ids) | st.integers(-5, 2**63) | json_values,
        "end": st.sampled_from(END_REASONS) | json_values,
        "exit_code": st.integers(-300, 300) | json_values,
        "signalled": st.booleans() | json_values,
        "log_tail": st.text(max_size=50) | json_values,
        "detail": st.text(max_size=50) | json_values,
    }


def events(attempt_ids: list[int]):
    values = event_values(attempt_ids)
    event = st.fixed_dictionaries(
        {}, optional={key: values[key] for key in EVENT_KEYS}
    ) | st.dictionaries(st.text(max_size=8), json_values, max_size=3)
    return st.lists(event | json_values, max_size=4)


def row_counts() -> dict[str, int]:
    return {
        model.__name__: model.objects.count()
        for model in (Node, Job, JobEvent, JobAttempt, GpuAssignment)
    }


def database_state() -> tuple:
    """What a refused request must leave as it was (heartbeats aside: even a refused poll
    proves the agent is alive)."""
    return (
        row_counts(),
        list(Job.objects.order_by("pk").values_list("pk", "state", "reason")),
        list(
            JobAttempt.objects.order_by("pk").values_list(
                "pk", "started_at", "ended_at", "outcome", "log_tail", "end_reason"
            )
        ),
        list(GpuAssignment.objects.order_by("pk").values_list("pk", "released")),
        list(Node.objects.order_by("pk").values_list("pk", "name", "gpus", "state")),
    )


def assert_clear_refusal(response) -> None:
    """A 4xx is JSON naming the field in its key and its message."""
    assert 400 <= response.status_code < 500, response.content
    body = response.json()
    assert isinstance(body, dict) and len(body) == 1, body
    ((field, message),) = body.items()
    assert isinstance(message, str) and message, body
    if field not in ("detail", "body"):
        assert message.startswith(field.split(".")[0].split("[")[0]), body


@pytest.fixture
def agent(settings, transactional_db):
    """A registered node running one job; its token; the attempt ids that exist."""
    settings.AGENT_POLL_MAX_WAIT_SECONDS = 0  # a poll with nothing new answers at once
    from django.contrib.auth import get_user_model

    from shares.models import Team
    from shares.services import share_create

    ClusterSettings.objects.update_or_create(pk=1, defaults={"agent_join_token": JOIN})
    client = Client()
    response = client.post(
        "/api/v1/agent/register/",
        {"join_token": JOIN, "name": "fuzz-0", "gpu_type": "h100", "gpus": 8},
        content_type="application/json",
    )
    assert response.status_code == 201
    token = response.json()["token"]
    team = Team.objects.create(name="Fuzz", slug="fuzz")
    share_create(name="fuzz", team=team, capacity_limits={"h100": 8}, strategy="LEND")
    user = get_user_model().objects.create_user("fuzzer")
    for _ in range(2):
        job_submit(user=user, share_name="fuzz", gpu_type="h100", gpus=4, command="true")
    cycle_run(force=True)
    attempts = list(JobAttempt.objects.values_list("pk", flat=True))
    assert len(attempts) == 2
    return client, token, attempts


def post_agent(client, path: str, body: bytes, token: str):
    return client.post(
        f"/api/v1/agent/{path}/",
        body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Node {token}",
    )


@FUZZ
@given(data=st.data())
@example(data=None)
def test_agent_report_bodies(agent, data):
    """Any report body: 200 with one result per event, or a 4xx naming the field (events[i]...)
    that writes nothing unless some of its events are well-formed: those are applied (a valid
    event beside a bad one is not held back, docs/agent.md)."""
    client, token, attempts = agent
    if data is None:  # a valid event followed by a bad one
        body = {"events": [{"type": "started", "attempt": attempts[0]}, {"type": "bogus"}]}
    else:
        body = data.draw(
            st.fixed_dictionaries({"events": events(attempts)})
            | st.dictionaries(st.sampled_from(("events", "x")), json_values, max_size=2)
            | json_values
        )
    before = database_state()
    response = post_agent(client, "report", json.dumps(body).encode(), token)
    assert response.status_code < 500, response.content
    if response.status_code == 200:
        results = response.json()["results"]
        assert len(results) == len(body["events"])
        assert set(results) <= {"ok", "ignored"}
    else:
        assert_clear_refusal(response)
        sent = body.get("events") if isinstance(body, dict) else None
        if not isinstance(sent, list) or not any(
            isinstance(event, dict) and event.get("type") in EVENT_TYPES for event in sent
        ):
            assert database_state() == before
    if data is None:
        assert response.status_code == 400
        assert any(field.startswith("events[1]") for field in response.json()), response.json()
        assert database_state() != before  # the started event beside the bogus one is applied


@FUZZ
@given(data=st.data())
def test_agent_start_bodies(agent, data):
    """Any start body: the attempts granted, only among those placed on this node, or a 4xx
    naming the field that changes nothing."""
    client, token, attempts = agent
    body = data.draw(
        st.fixed_dictionaries(
            {"attempts": st.lists(st.sampled_from(attempts) | st.integers(-3, 2**63))}
        )
        | st.dictionaries(st.sampled_from(("attempts", "x")), json_values, max_size=2)
        | json_values
    )
    before = database_state()
    response = post_agent(client, "start", json.dumps(body).encode(), token)
    assert response.status_code < 500, response.content
    if response.status_code == 200:
        assert set(response.json()["start"]) <= set(attempts)
    else:
        assert_clear_refusal(response)
        assert database_state() == before


@FUZZ
@given(
    body=st.fixed_dictionaries(
        {},
        optional={
            "running": st.lists(st.integers(-3, 2**63)) | json_values,
            "stopping": st.lists(st.integers(-3, 2**63)) | json_values,
            "wait": st.floats(-1, 0) | st.integers(-5, 0) | json_values,
        },
    )
    | json_values
)
def test_agent_poll_bodies(agent, body):
    """Any poll body: orders, or a 4xx naming the field that changes nothing."""
    client, token, _ = agent
    if isinstance(body, dict) and isinstance(body.get("wait"), int | float):
        body["wait"] = min(body["wait"], 0)  # no long poll inside a fuzz loop
    before = database_state()
    response = post_agent(client, "poll", json.dumps(body).encode(), token)
    assert response.status_code < 500, response.content
    if response.status_code == 200:
        answer = response.json()
        assert set(answer) == {"run", "stop", "results"}
        assert answer["results"] == []  # no events were sent with the poll
    else:
        assert_clear_refusal(response)
        assert database_state() == before


@FUZZ
@given(
    body=st.fixed_dictionaries(
        {},
        optional={
            "join_token": st.just(JOIN) | json_values,
            "name": st.text(string.ascii_lowercase + "-.", min_size=1, max_size=12)
            | st.text(max_size=300)
            | json_values,
            "gpu_type": st.sampled_from(("h100", "l4")) | st.text(max_size=40) | json_values,
            "gpus": st.integers(-2, 70) | json_values,
            "gpu_details": st.lists(st.dictionaries(st.text(max_size=5), scalars, max_size=3))
            | json_values,
        },
    )
    | json_values
)
@example(body={"join_token": JOIN, "name": "n\x00ul", "gpu_type": "h100", "gpus": 8})
@example(
    body={"join_token": JOIN, "name": "nul-details", "gpu_type": "h100", "gpus": 8,
          "gpu_details": [{"uuid": "GPU-\x00"}]}
)  # fmt: skip
@example(body={"join_token": JOIN, "name": "fuzz-0", "gpu_type": "h100", "gpus": 2})
@example(body={"join_token": JOIN, "name": "fuzz-1", "gpu_type": ":", "gpus": 2})
def test_agent_register_bodies(agent, body):
    """Any registration: 201 with a token, or a 4xx naming the field that registers nothing."""
    client, _, _ = agent
    before = database_state()
    response = client.post(
        "/api/v1/agent/register/", json.dumps(body).encode(), content_type="application/json"
    )
    assert response.status_code < 500, response.content
    if response.status_code == 201:
        assert response.json()["token"]
    else:
        assert_clear_refusal(response)
        assert database_state() == before


@FUZZ
@given(raw=st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
@example(raw=b"[" * 50_000)
@example(raw=b'{"events": [{"type": "log", "attempt": 1, "log_tail": "\\u0000"}]}')
@example(raw=b'{"events": NaN}')
@example(raw=b"\xff\xfe")
def test_agent_raw_bodies(agent, raw):
    """Bytes that may not be JSON at all (deep nesting, invalid UTF-8, NaN): never a 5xx."""
    client, token, attempts = agent
    raw = raw.replace(b'"attempt": 1', f'"attempt": {attempts[0]}'.encode())
    for path in ("report", "poll"):
        before = database_state()
        response = post_agent(client, path, raw, token)
        assert response.status_code < 500, response.content
        if response.status_code >= 400:
            assert_clear_refusal(response)
            assert database_state() == before


# --- Scenarios ----------------------------------------------------------------------------------

numbers = (
    st.integers(-3, 40) | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(("8",))
)
anything = st.recursive(
    st.none() | st.booleans() | numbers | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.text(max_size=6) | st.integers(0, 3), children, max_size=3)
    ),
    max_leaves=8,
)


def maybe(valid, *, also=anything):
    """Usually a valid value, sometimes anything."""
    return st.one_of(valid, valid, valid, also)


gpu_types = st.sampled_from(("h100", "l4"))
share_names = st.sampled_from(("research", "vision"))
nodes = st.lists(
    st.fixed_dictionaries(
        {"name": maybe(st.sampled_from(("gpu", "cpu"))), "gpu_type": maybe(gpu_types),
         "gpus": maybe(st.integers(1, 8))},
        optional={"count": maybe(st.integers(1, 3)), "extra": anything},
    ) | anything,
    max_size=3,
)  # fmt: skip
limits = st.dictionaries(
    maybe(gpu_types, also=st.none() | st.booleans() | st.integers(0, 3) | st.text(max_size=4)),
    maybe(st.integers(1, 16)),
    max_size=6,
)
share_fields = {
    "borrow_limit": maybe(st.integers(-1, 100)),
    "lend_limit": maybe(st.integers(0, 8) | st.dictionaries(gpu_types, st.integers(0, 8))),
    "in_share_preemption": maybe(st.booleans()),
    "grace_seconds": maybe(st.integers(0, 100) | st.floats()),
    "state": maybe(st.sampled_from(("ENABLED", "DISABLED"))),
    "weight": maybe(st.floats(0.1, 5) | st.floats()),
    "strict_fifo": maybe(st.booleans()),
}
shares = st.lists(
    st.fixed_dictionaries(
        {"name": maybe(share_names), "capacity_limits": maybe(limits),
         "strategy": maybe(st.sampled_from(("RESERVE", "LEND", "LEND_AND_BORROW")))},
        optional=share_fields,
    ) | anything,
    max_size=3,
)  # fmt: skip
jobs = st.lists(
    st.fixed_dictionaries(
        {"id": maybe(st.text("abc", min_size=1, max_size=3)), "share": maybe(share_names),
         "gpu_type": maybe(gpu_types), "gpus": maybe(st.integers(1, 16)),
         "submit": maybe(numbers), "duration": maybe(numbers)},
        optional={"priority": maybe(st.integers(0, 10_000)), "nodes": maybe(st.integers(1, 3)),
                  "max_preemptions": maybe(st.integers(0, 2)),
                  "checkpoint_interval": maybe(numbers)},
    ) | anything,
    max_size=4,
)  # fmt: skip
changes = st.lists(
    st.fixed_dictionaries(
        {"at": maybe(numbers), "share": maybe(share_names),
         "set": maybe(st.fixed_dictionaries({}, optional={"capacity_limits": maybe(limits),
                                                          **share_fields}))},
    ) | anything,
    max_size=3,
)  # fmt: skip
scenarios = (
    st.fixed_dictionaries(
        {"nodes": maybe(nodes), "shares": maybe(shares), "jobs": maybe(jobs)},
        optional={
            "changes": maybe(changes),
            "borrow_order": maybe(st.sampled_from(("fifo", "fair"))),
            "trace": st.sampled_from(("missing.csv", "/", "a\x00b", "/bin/sh")) | anything,
            "surprise": anything,
        },
    )
    | anything
)


def assert_parsed_or_refused(data) -> None:
    try:
        scenario = parse_scenario(data)
    except ScenarioError as error:
        assert str(error).strip(), "a ScenarioError must say what is wrong"
        return
    assert isinstance(scenario, Scenario)
    for job in scenario.jobs:
        assert math.isfinite(job.submit) and math.isfinite(job.duration) and job.duration > 0
        assert job.checkpoint_interval is None or math.isfinite(job.checkpoint_interval)
    for share in scenario.shares:
        assert math.isfinite(share.grace_seconds) and math.isfinite(share.weight)
    for change in scenario.changes:
        assert math.isfinite(change.at)


@settings(max_examples=600, deadline=None, derandomize=True)
@given(data=scenarios)
@example(data={"nodes": [{"name": "g", "gpu_type": "h100", "gpus": 8}],
               "shares": [{"name": "r", "capacity_limits": {"h100": 8}, "strategy": "LEND",
                           "lend_limit": {"h100": 2}}],
               "jobs": [{"id": "j", "share": "r", "gpu_type": "h100", "gpus": 1, "submit": 0,
                         "duration": 10}],
               "changes": [{"at": 1, "share": "r", "set": {"capacity_limits": 5}}]})  # fmt: skip
@example(data={"nodes": [{"name": "g", "gpu_type": "h100", "gpus": 8}],
               "shares": [{"name": "r", "capacity_limits": {"h100": 8}, "strategy": "LEND"}],
               "jobs": [{"id": "j", "share": "r", "gpu_type": "h100", "gpus": 1, "submit": 0,
                         "duration": float("nan")}]})  # fmt: skip
def test_scenario_parser_accepts_or_explains(data):
    """A scenario is either parsed (with finite times) or refused with a ScenarioError."""
    assert_parsed_or_refused(data)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(text=st.text(max_size=200) | st.binary(max_size=100).map(lambda b: b.decode("latin-1")))
@example(text="nodes: [" * 200)
@example(text="jobs: !!python/object:os.system {}")
def test_scenario_files_accept_or_explain(tmp_path_factory, text):
    """Any file: a scenario or a ScenarioError (YAML errors included)."""
    path = tmp_path_factory.mktemp("scenario") / "scenario.yaml"
    path.write_text(text)
    try:
        load_scenario(path)
    except ScenarioError as error:
        assert str(error).strip()


def test_trace_that_is_not_text_is_a_scenario_error(tmp_path):
    """A binary or NUL-named trace is reported as a scenario error, not a crash."""
    (tmp_path / "trace.csv").write_bytes(b"id,share\n\xff\xfe\x00\x81")
    base = {
        "nodes": [{"name": "g", "gpu_type": "h100", "gpus": 8}],
        "shares": [{"name": "r", "capacity_limits": {"h100": 8}, "strategy": "LEND"}],
    }
    for trace in ("trace.csv", "a\x00b"):
        with pytest.raises(ScenarioError, match="trace"):
            parse_scenario({**base, "trace": trace}, base_dir=tmp_path)


@pytest.mark.django_db
def test_api_deeply_nested_json_is_a_400(django_user_model):
    """The REST API's JSON parser refuses nesting deeper than Python's stack with a 400."""
    from rest_framework.authtoken.models import Token

    token = Token.objects.create(user=django_user_model.objects.create_user("deep")).key
    response = Client().post(
        "/api/v1/jobs/", b"[" * 50_000, content_type="application/json",
        HTTP_AUTHORIZATION=f"Token {token}",
    )  # fmt: skip
    assert response.status_code == 400
    assert "too deeply" in response.json()["detail"]


def test_log_tail_with_nul_bytes_is_kept(agent):
    """A process's log may contain NUL bytes: the report is accepted and the log stored with
    U+FFFD in their place (PostgreSQL text cannot hold NUL)."""
    client, token, attempts = agent
    body = {"events": [{"type": "log", "attempt": attempts[0], "log_tail": "step 1\x00ok"}]}
    response = post_agent(client, "report", json.dumps(body).encode(), token)
    assert response.json() == {"results": ["ok"]}
    assert JobAttempt.objects.get(pk=attempts[0]).log_tail == "step 1\ufffdok"
