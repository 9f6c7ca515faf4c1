"""What a buggy, old or hostile agent (or connector) may send the portal: text a database cannot
store, waits no float holds, a node of a connector's cluster, a bad event beside good ones. Each
gets a 4xx naming the field and the rule, never a 500, and what was well-formed is not lost."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from scheduler.cycle.run import cycle_run
from scheduler.jobs.services import job_submit
from scheduler.models import ClusterSettings, Job, JobAttempt, Node

pytestmark = pytest.mark.django_db

JOIN = "the-join-token"
LONE_SURROGATE = "\ud800"  # valid in JSON ("\\ud800"), not in UTF-8: no database stores it


@pytest.fixture
def client_(settings):
    ClusterSettings.objects.update_or_create(pk=1, defaults={"agent_join_token": JOIN})
    settings.AGENT_POLL_MAX_WAIT_SECONDS = 0  # a poll with nothing new answers at once
    return Client()


def post(client, path, body, token=None, scheme="Node"):
    """POST `body` as JSON (a str is sent as it is)."""
    headers = {"HTTP_AUTHORIZATION": f"{scheme} {token}"} if token else {}
    data = body if isinstance(body, str) else json.dumps(body)
    prefix = "connector/" if scheme == "Connector" else ""
    return client.post(
        f"/api/v1/agent/{prefix}{path}/", data, content_type="application/json", **headers
    )


def register(client, name="node-a"):
    body = {"join_token": JOIN, "name": name, "gpu_type": "h100", "gpus": 8}
    response = post(client, "register", body)
    assert response.status_code == 201, response.content
    return response.json()["token"]


def register_connector(client, nodes=("sn1",)):
    body = {"join_token": JOIN, "name": "hpc", "kind": "slurm",
            "nodes": [{"name": n, "gpu_type": "h100", "gpus": 8, "state": "READY"}
                      for n in nodes]}  # fmt: skip
    response = post(client, "register", body, scheme="Connector")
    assert response.status_code == 201, response.content
    return response.json()["token"]


def placed(world, count=1):
    """`count` one-node jobs of 8 h100, placed: their attempts."""
    jobs = [
        job_submit(user=world.alice, share_name="research", gpu_type="h100", gpus=8,
                   command="python train.py")[0]
        for _ in range(count)
    ]  # fmt: skip
    cycle_run(force=True)
    return [Job.objects.get(pk=job.pk).attempts.get() for job in jobs]


def exited(attempt, **more):
    return {"type": "exited", "attempt": attempt.pk, "end": "exit", "exit_code": 0, **more}


def no_unstorable_text(text: str) -> bool:
    return "\x00" not in text and not any("\ud800" <= c <= "\udfff" for c in text)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": LONE_SURROGATE}, "name"),
        ({"name": "node\x00a"}, "name"),
        ({"gpu_type": LONE_SURROGATE}, "gpu_type"),
        ({"join_token": JOIN + LONE_SURROGATE}, "join_token"),
        ({"gpu_details": [{"model": "NVIDIA H100" + LONE_SURROGATE}]}, "gpu_details"),
        ({"gpu_details": [{"model": "NVIDIA H100\x00"}]}, "gpu_details"),
    ],
)
def test_a_registration_with_text_no_database_stores_is_refused_naming_the_field(
    client_, body, field
):
    """A lone UTF-16 surrogate ("\\ud800", which JSON allows) in a node's name, GPU type, join
    token or GPU details failed the registration with a 500 (UTF-8 cannot encode it, on
    SQLite and PostgreSQL alike); now, as NUL, it is a 400 naming the field."""
    registration = {"join_token": JOIN, "name": "node-a", "gpu_type": "h100", "gpus": 8, **body}
    response = post(client_, "register", registration)
    assert response.status_code == 400, response.content
    assert "surrogates" in response.json()[field]
    assert not Node.objects.exists()


def test_log_tails_and_details_keep_their_text_without_nul_or_lone_surrogates(client_, world):
    """An agent's log tail is the job's own output: NUL (which PostgreSQL text cannot hold)
    and lone surrogates (which no database stores: the report failed with a 500, and the agent
    sent it again forever) become U+FFFD, on a report and on a poll, and the report is taken.
    So in the detail of an attempt that never started, which becomes the job's reason."""
    tokens = {name: register(client_, name=name) for name in ("node-a", "node-b")}
    running, never = placed(world, count=2)
    token = tokens[running.allocations[0]["node"]]
    post(client_, "start", {"attempts": [running.pk]}, token)
    log = {"type": "log", "attempt": running.pk, "log_tail": f"step 1\x00{LONE_SURROGATE}ok"}
    answer = post(client_, "report", {"events": [log]}, token)
    assert answer.json() == {"results": ["ok"]}
    assert JobAttempt.objects.get(pk=running.pk).log_tail == "step 1\ufffd\ufffdok"
    log["log_tail"] = f"step 2\x00{LONE_SURROGATE}"
    answer = post(client_, "poll", {"running": [running.pk], "wait": 0, "events": [log]}, token)
    assert answer.status_code == 200 and answer.json()["results"] == ["ok"]
    assert JobAttempt.objects.get(pk=running.pk).log_tail == "step 2\ufffd\ufffd"
    detail = f"no such directory /data{LONE_SURROGATE}\x00"
    end = {"type": "exited", "attempt": never.pk, "end": "never_started", "detail": detail,
           "log_tail": "\x00"}  # fmt: skip
    answer = post(client_, "report", {"events": [end]}, tokens[never.allocations[0]["node"]])
    assert answer.json() == {"results": ["ok"]}
    attempt = JobAttempt.objects.get(pk=never.pk)
    job = Job.objects.get(pk=never.job_id)
    assert job.state == Job.State.FAILED and "/data\ufffd\ufffd" in job.reason
    for text in (attempt.log_tail, attempt.end_reason, job.reason):
        assert no_unstorable_text(text), text


def test_a_connector_s_node_names_and_reasons_with_text_no_database_stores(client_):
    """A connector's node named with a lone surrogate is refused naming the node's field (it
    was a 500); the reason its cluster manager gives for a node's state keeps its text, with
    U+FFFD for what no database stores."""
    node = {"name": LONE_SURROGATE, "gpu_type": "h100", "gpus": 8, "state": "READY"}
    body = {"join_token": JOIN, "name": "hpc", "kind": "slurm", "nodes": [node]}
    response = post(client_, "register", body, scheme="Connector")
    assert response.status_code == 400
    assert "surrogates" in response.json()["nodes[0].name"]
    token = register_connector(client_)
    drained = {"name": "sn1", "gpu_type": "h100", "gpus": 8, "state": "DRAINING",
               "reason": f"Slurm: bad{LONE_SURROGATE}\x00 disk"}  # fmt: skip
    response = post(client_, "poll", {"wait": 0, "nodes": [drained]}, token, scheme="Connector")
    assert response.status_code == 200, response.content
    node = Node.objects.get(name="sn1")
    assert (node.state, node.state_reason) == ("DRAINING", "Slurm: bad\ufffd\ufffd disk")


@pytest.mark.parametrize("wait", ["1" + "0" * 400, "1e999", "NaN", "-Infinity"])
def test_a_poll_s_wait_beyond_any_float_is_capped_or_refused_never_a_500(client_, wait):
    """A wait of 10**400 seconds (JSON has no limit on integers) made the poll fail with a 500
    (OverflowError, converting it to a float): it waits as long as any poll may. NaN and
    infinities (which Python's JSON parser takes, though they are not JSON; 1e999 is one) are
    refused."""
    token = register(client_)
    response = post(client_, "poll", f'{{"running": [], "wait": {wait}}}', token)
    if wait.startswith("10"):
        assert response.status_code == 200, response.content
        assert response.json() == {"run": [], "stop": [], "results": []}
    else:
        assert response.status_code == 400
        assert response.json() == {"wait": "wait: must be a number of seconds."}


def test_an_agent_cannot_take_over_a_node_of_a_connector_s_cluster(client_, world):
    """A node agent registering under the name of a connector's node took it over: the node got
    the agent's token, so the agent could start, report and end the attempts the connector's
    cluster runs there (and the connector's reports went on too). It is refused (409, naming
    `name`), as a connector is refused an agent's node, and the connector keeps the node."""
    connector_token = register_connector(client_)
    (attempt,) = placed(world)
    body = {"join_token": JOIN, "name": "sn1", "gpu_type": "h100", "gpus": 8}
    response = post(client_, "register", body)
    assert response.status_code == 409
    assert "belongs to the connector of cluster hpc" in response.json()["name"]
    node = Node.objects.get(name="sn1")
    assert node.token_hash == "" and node.connector.name == "hpc"
    answer = post(client_, "start", {"attempts": [attempt.pk]}, connector_token,
                  scheme="Connector")  # fmt: skip
    assert answer.json() == {"start": [attempt.pk]}


def test_one_bad_event_in_a_report_does_not_hold_back_the_exits_beside_it(client_, world):
    """A report's events were all refused for one that was bad (an event type of a newer agent,
    an exit code out of range): the agent keeps sending the same report, refused each time, and
    the other jobs' ends were lost with it, their jobs RUNNING for ever. Now the well-formed
    events are applied, and the 400 names the bad one; sent again, they are replays."""
    token = register(client_)
    register(client_, name="node-b")
    attempts = placed(world, count=2)
    for attempt in attempts:
        node = attempt.allocations[0]["node"]
        attempt.token = token if node == "node-a" else register(client_, name=node)
    first, second = attempts
    post(client_, "start", {"attempts": [first.pk]}, first.token)
    post(client_, "start", {"attempts": [second.pk]}, second.token)
    bad = {"type": "progress", "attempt": first.pk, "percent": 50}
    for _ in range(2):
        events = [bad, exited(first)]
        response = post(client_, "report", {"events": events}, first.token)
        assert response.status_code == 400
        assert response.json() == {"events[0].type": "events[0].type: one of started, exited, "
                                                      "log, checkpoint."}  # fmt: skip
        assert Job.objects.get(pk=first.job_id).state == Job.State.SUCCEEDED
    events = [exited(second, exit_code=300), exited(second, exit_code=0)]
    body = {"running": [], "wait": 0, "events": events}
    response = post(client_, "poll", body, second.token)
    assert response.status_code == 400
    assert "between -255 and 255" in response.json()["events[0].exit_code"]
    job = Job.objects.get(pk=second.job_id)
    assert job.state == Job.State.SUCCEEDED
    assert list(job.events.values_list("to_state", flat=True))[-1] == Job.State.SUCCEEDED


def test_a_poll_refused_for_its_own_fields_still_takes_its_events(client_, world):
    """A poll whose `running` or `grants` is bad is refused, but the events it carries are
    applied first, as a report would apply them; and a stranger's are not."""
    token = register(client_)
    (attempt,) = placed(world)
    post(client_, "start", {"attempts": [attempt.pk]}, token)
    body = {"running": ["a"], "wait": 0, "events": [exited(attempt)]}
    response = post(client_, "poll", body, "not-a-token")
    assert response.status_code == 401
    assert Job.objects.get(pk=attempt.job_id).state == Job.State.RUNNING
    response = post(client_, "poll", body, token)
    assert response.status_code == 400 and "running" in response.json()
    assert Job.objects.get(pk=attempt.job_id).state == Job.State.SUCCEEDED


def test_a_connector_s_report_or_poll_with_a_bad_part_still_takes_its_good_events(client_, world):
    """A connector's report with a bad node in `nodes`, or a bad event, and its poll with a bad
    `full`: each is refused naming the field, and its well-formed events are applied."""
    token = register_connector(client_, nodes=("sn1", "sn2"))
    first, second = placed(world, count=2)
    assert post(client_, "start", {"attempts": [first.pk, second.pk]}, token,
                scheme="Connector").json() == {"start": sorted([first.pk, second.pk])}  # fmt: skip
    body = {"events": [exited(first)], "nodes": [{"name": "sn1", "gpus": 0}]}
    response = post(client_, "report", body, token, scheme="Connector")
    assert response.status_code == 400 and "nodes[0].gpus" in response.json()
    assert Job.objects.get(pk=first.job_id).state == Job.State.SUCCEEDED
    body = {"running": [], "wait": 0, "full": "yes", "events": [exited(second), {"type": 1}]}
    response = post(client_, "poll", body, token, scheme="Connector")
    assert response.status_code == 400 and "full" in response.json()
    assert Job.objects.get(pk=second.job_id).state == Job.State.SUCCEEDED


def test_a_connector_s_node_with_a_gpu_type_no_share_can_name_is_refused_naming_the_node(
    client_, world
):
    """A GPU type the portal cannot name ("H100 80GB") in a connector's `nodes` was refused only
    when the node was saved: the 400 said `gpu_type`, not which node, and the events of the
    same report or poll were lost with it. Now it is `nodes[i].gpu_type`, and they are taken."""
    token = register_connector(client_)
    (attempt,) = placed(world)
    post(client_, "start", {"attempts": [attempt.pk]}, token, scheme="Connector")
    node = {"name": "sn1", "gpu_type": "H100 80GB", "gpus": 8, "state": "READY"}
    body = {"running": [], "wait": 0, "nodes": [node], "events": [exited(attempt)]}
    response = post(client_, "poll", body, token, scheme="Connector")
    assert response.status_code == 400
    assert "lowercase" in response.json()["nodes[0].gpu_type"]
    assert Job.objects.get(pk=attempt.job_id).state == Job.State.SUCCEEDED
    assert Node.objects.get(name="sn1").gpu_type == "h100"


def test_a_report_over_the_body_limit_is_a_400_naming_the_body_not_a_500(client_, world, settings):
    """A report bigger than DATA_UPLOAD_MAX_MEMORY_SIZE (an agent's outbox after an outage, or a
    portal with a lower limit) was a 500 from the production server: Django refuses the body
    only when the view reads it. The agent halves its batches on a 400 naming `body`, and
    nothing of the refused report is applied: its exits go again in smaller reports."""
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 4096
    token = register(client_)
    (attempt,) = placed(world)
    post(client_, "start", {"attempts": [attempt.pk]}, token)
    events = [exited(attempt, detail="x" * 1000) for _ in range(8)]
    response = post(client_, "report", {"events": events}, token)
    assert response.status_code == 400
    assert response.json() == {
        "body": "body: at most 4096 bytes (DATA_UPLOAD_MAX_MEMORY_SIZE); send the events in "
        "smaller batches."
    }
    assert Job.objects.get(pk=attempt.job_id).state == Job.State.RUNNING
    response = post(client_, "report", {"events": [exited(attempt)]}, token)
    assert response.status_code == 200, response.content
    assert Job.objects.get(pk=attempt.job_id).state == Job.State.SUCCEEDED
