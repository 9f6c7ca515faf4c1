"""The agent endpoints over HTTP (Django's test client, real database): authentication,
clear 400s naming the field, and replayed reports that change nothing."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.authtoken.models import Token

from portal.db.sql import select_rows
from scheduler.agent.gpus import gpu_type_for_model
from scheduler.cycle.run import cycle_run
from scheduler.jobs.services import job_submit
from scheduler.models import ClusterSettings, Job, JobAttempt, Node
from scheduler.nodes import queries
from scheduler.nodes.services import hash_token, node_orders, node_poll_orders, starts_granted
from tests.conftest import place_a_borrower

pytestmark = pytest.mark.django_db

JOIN = "the-join-token"


@pytest.fixture
def client_():
    ClusterSettings.objects.update_or_create(pk=1, defaults={"agent_join_token": JOIN})
    return Client()


def post(client, path, body, token=None, scheme="Node"):
    headers = {"HTTP_AUTHORIZATION": f"{scheme} {token}"} if token else {}
    return client.post(f"/api/v1/agent/{path}/", body, content_type="application/json", **headers)


def register(client, name="node-a", gpus=8, **more):
    response = post(client, "register", {"join_token": JOIN, "name": name, "gpu_type": "h100",
                                         "gpus": gpus, **more})  # fmt: skip
    assert response.status_code == 201, response.content
    return response.json()["token"]


def test_register_stores_the_node_token_hashed(client_):
    """Registering creates a READY node; only the token's hash is stored."""
    token = register(client_)
    node = Node.objects.get(name="node-a")
    assert node.state == Node.State.READY and node.gpus == 8
    assert node.token_hash == hash_token(token) and token not in node.token_hash


def test_wrong_join_token_is_refused(client_):
    response = post(client_, "register", {"join_token": "nope", "name": "n", "gpu_type": "h100",
                                          "gpus": 8})  # fmt: skip
    assert response.status_code == 403
    assert "join_token" in response.json()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"join_token": JOIN, "name": "n", "gpu_type": "h100", "gpus": 0}, "gpus"),
        ({"join_token": JOIN, "name": "n", "gpu_type": "H 100", "gpus": 8}, "gpu_type"),
        ({"join_token": JOIN, "gpu_type": "h100", "gpus": 8}, "name"),
        (
            {"join_token": JOIN, "name": "n", "gpu_type": "h100", "gpus": 8, "asks_to_start": 1},
            "asks_to_start",
        ),
        ([1, 2], "body"),
    ],
)
def test_bad_registration_names_the_field(client_, body, field):
    response = post(client_, "register", body)
    assert response.status_code == 400
    assert field in response.json()


def test_user_tokens_do_not_reach_agent_endpoints(client_, world):
    """A user's API token is not a node token, in either header scheme."""
    register(client_)
    key = Token.objects.create(user=world.root).key
    assert post(client_, "poll", {"wait": 0}, key, scheme="Token").status_code == 401
    assert post(client_, "poll", {"wait": 0}, key).status_code == 401
    assert post(client_, "report", {"events": []}).status_code == 401
    assert post(client_, "start", {"attempts": []}, key).status_code == 401


def test_bad_events_name_the_field(client_):
    token = register(client_)
    bad = [
        ({"events": "x"}, "events"),
        ({"events": [{"type": "boom", "attempt": 1}]}, "events[0].type"),
        ({"events": [{"type": "exited", "attempt": 1, "end": "eh"}]}, "events[0].end"),
        ({"events": [{"type": "started", "attempt": -4}]}, "events[0].attempt"),
        ({"running": ["a"]}, "running"),
        ({"running": [2**64]}, "running"),
        ({"grants": "yes"}, "grants"),
    ]
    for body, field in bad:
        paths = ["poll"] if "running" in body or "grants" in body else ["report", "poll"]
        for path in paths:
            response = post(client_, path, {**body, "wait": 0}, token)
            assert response.status_code == 400, (path, body)
            assert field in response.json(), response.json()
    for attempts in ("x", [0], [True], list(range(1, 66))):  # a node holds at most 64 GPUs
        response = post(client_, "start", {"attempts": attempts}, token)
        assert response.status_code == 400 and "attempts" in response.json(), attempts


def placed_job(client_, world):
    """A job placed on one of two registered nodes: (job, its node's token, the other's)."""
    token = register(client_)
    other = register(client_, name="node-b")
    job, _ = job_submit(user=world.alice, share_name="research", gpu_type="h100", gpus=8,
                        command="python train.py")  # fmt: skip
    cycle_run(force=True)
    if Job.objects.get(pk=job.pk).attempts.get().allocations[0]["node"] == "node-a":
        return job, token, other
    return job, other, token


def test_events_sent_with_a_poll_are_applied_before_the_orders(client_, world):
    """An agent may send its events with its next poll instead of a report: they are applied
    first (a replay is ignored) and their results come back with the orders."""
    job, mine, _ = placed_job(client_, world)
    (run,) = post(client_, "poll", {"running": [], "wait": 0}, mine).json()["run"]
    started = [{"type": "started", "attempt": run["attempt"]}]
    body = {"running": [run["attempt"]], "wait": 0, "events": started}
    answer = post(client_, "poll", body, mine).json()
    # The agent runs it: its order is not sent again.
    assert answer["results"] == ["ok"] and answer["run"] == [] and answer["stop"] == []
    job = Job.objects.get(pk=job.pk)
    assert job.state == Job.State.RUNNING and job.attempts.get().started_at is not None
    exited = [{"type": "exited", "attempt": run["attempt"], "end": "exit", "exit_code": 0}]
    answer = post(client_, "poll", {"running": [], "wait": 0, "events": exited}, mine).json()
    assert answer == {"run": [], "stop": [], "results": ["ok"]}
    assert post(client_, "poll", {"wait": 0, "events": started}, mine).json()["results"] == [
        "ignored"
    ]
    assert Job.objects.get(pk=job.pk).state == Job.State.SUCCEEDED


def test_an_exit_reported_before_its_start_implies_the_start(client_, world):
    """The "started" report may travel on a poll that arrives after the exit's report: the
    exit records the start (RUNNING, then SUCCEEDED), and the late start is ignored."""
    job, mine, _ = placed_job(client_, world)
    (run,) = post(client_, "poll", {"running": [], "wait": 0}, mine).json()["run"]
    exited = {"events": [{"type": "exited", "attempt": run["attempt"], "end": "exit",
                          "exit_code": 0}]}  # fmt: skip
    assert post(client_, "report", exited, mine).json() == {"results": ["ok"]}
    started = {"events": [{"type": "started", "attempt": run["attempt"]}]}
    assert post(client_, "report", started, mine).json() == {"results": ["ignored"]}
    job = Job.objects.get(pk=job.pk)
    attempt = job.attempts.get()
    assert job.state == Job.State.SUCCEEDED and job.started_at is not None
    assert attempt.started_at is not None and attempt.started_at <= attempt.ended_at
    states = list(job.events.order_by("pk").values_list("to_state", flat=True))
    assert states[-2:] == [Job.State.RUNNING, Job.State.SUCCEEDED]


def test_an_agent_starts_an_attempt_once_the_portal_grants_it(client_, world):
    """The agent asks to start the attempts whose run orders it has (`start/`): the portal
    records that the order reached it (STARTING) and the start (RUNNING), and grants it; asked
    again (an answer that was lost) it grants it again, with no second RUNNING. Another node's
    attempt is not granted to this node."""
    job, mine, theirs = placed_job(client_, world)
    (run,) = post(client_, "poll", {"running": [], "wait": 0}, mine).json()["run"]
    assert Job.objects.get(pk=job.pk).state == Job.State.SCHEDULED  # a poll writes nothing
    claim = {"attempts": [run["attempt"]]}
    assert post(client_, "start", claim, theirs).json() == {"start": [], "stop": []}
    assert Job.objects.get(pk=job.pk).state == Job.State.SCHEDULED
    assert post(client_, "start", claim, mine).json() == {"start": [run["attempt"]], "stop": []}
    assert post(client_, "start", claim, mine).json() == {"start": [run["attempt"]], "stop": []}
    (run,) = post(client_, "poll", {"running": [], "wait": 0}, mine).json()["run"]
    assert run["started"] is True
    job = Job.objects.get(pk=job.pk)
    assert job.state == Job.State.RUNNING and job.attempts.get().started_at is not None
    states = list(job.events.order_by("pk").values_list("to_state", flat=True))
    assert states[-3:] == [Job.State.SCHEDULED, Job.State.STARTING, Job.State.RUNNING]
    assert states.count(Job.State.RUNNING) == 1


def test_a_poll_that_asks_for_grants_gets_its_one_node_starts_granted_in_its_answer(client_, world):
    """An agent that says it starts what its poll's answer grants (`grants: true`) is not
    asked to request its one-node starts: the answer grants them (`granted`), and the portal
    records the order's delivery (STARTING) and the start (RUNNING) as a start request would.
    An answer that was lost: the next poll does not list the attempt as running, so its run
    order comes again, granted again, with no second RUNNING. A poll that does not ask gets
    the run order to ask about, and nothing is recorded."""
    job, mine, _ = placed_job(client_, world)
    (run,) = post(client_, "poll", {"running": [], "wait": 0}, mine).json()["run"]
    assert "granted" not in run and run["node_count"] == 1
    assert Job.objects.get(pk=job.pk).state == Job.State.SCHEDULED
    for _ in range(2):
        answer = post(client_, "poll", {"running": [], "wait": 0, "grants": True}, mine).json()
        (run,) = answer["run"]
        assert run["granted"] is True and answer["stop"] == []
    job = Job.objects.get(pk=job.pk)
    assert job.state == Job.State.RUNNING and job.attempts.get().started_at is not None
    states = list(job.events.order_by("pk").values_list("to_state", flat=True))
    assert states[-3:] == [Job.State.SCHEDULED, Job.State.STARTING, Job.State.RUNNING]
    assert states.count(Job.State.RUNNING) == 1
    body = {"running": [run["attempt"]], "wait": 0, "grants": True}
    assert post(client_, "poll", body, mine).json() == {"run": [], "stop": [], "results": []}


def test_a_gang_s_nodes_ask_to_start_even_where_polls_take_grants(client_, world):
    """A gang's start is decided once for all its nodes, by the first that asks (`start/`):
    its run orders are never granted in a poll's answer."""
    tokens = [register(client_, name=name) for name in ("node-a", "node-b")]
    job, _ = job_submit(user=world.alice, share_name="research", gpu_type="h100", gpus=16,
                        nodes=2, command="python train.py")  # fmt: skip
    cycle_run(force=True)
    for token in tokens:
        answer = post(client_, "poll", {"running": [], "wait": 0, "grants": True}, token).json()
        (run,) = answer["run"]
        assert run["node_count"] == 2 and "granted" not in run
    assert Job.objects.get(pk=job.pk).state == Job.State.SCHEDULED


def test_a_start_in_a_poll_s_answer_is_refused_if_the_stop_came_first(client_, world):
    """Orders read, then the attempt's stop ordered before the grant (as a woken poll's orders
    carried by its wake-up may be): the answer has its stop order instead of its run order,
    and it never starts. One that ended meanwhile is left out, with no order at all."""
    job, mine, _ = placed_job(client_, world)
    attempt = Job.objects.get(pk=job.pk).attempts.get()
    node = Node.objects.get(name=attempt.allocations[0]["node"])
    orders = node_poll_orders(node=node, running=set())
    JobAttempt.objects.filter(pk=attempt.pk).update(stop_requested_at=timezone.now())
    stop = {"attempt": attempt.pk, "grace_seconds": 2, "started": False}
    assert starts_granted(node=node, orders=orders) == {"run": [], "stop": [stop]}
    JobAttempt.objects.filter(pk=attempt.pk).update(ended_at=timezone.now())
    assert starts_granted(node=node, orders=orders) == {"run": [], "stop": []}
    assert JobAttempt.objects.get(pk=attempt.pk).started_at is None
    assert Job.objects.get(pk=job.pk).state == Job.State.SCHEDULED


def test_an_answer_with_a_stop_order_grants_no_start(client_, world):
    """A grant may wait for its job's lock, which a cycle holds while it orders stops: an
    answer that carries a stop order goes without granting, so the stop never waits behind
    a start; the agent asks to start the run orders beside its polls."""
    job, mine, _ = placed_job(client_, world)
    node = Node.objects.get(name=Job.objects.get(pk=job.pk).attempts.get().allocations[0]["node"])
    orders = node_poll_orders(node=node, running=set())
    with_stop = {**orders, "stop": [{"attempt": 10**9, "grace_seconds": 2, "started": True}]}
    assert starts_granted(node=node, orders=with_stop) == with_stop
    assert Job.objects.get(pk=job.pk).state == Job.State.SCHEDULED


def test_each_node_of_a_gang_is_granted_its_start_until_the_gang_is_stopped(client_, world):
    """A two-node attempt: its first node's start records the job's start (RUNNING, once), the
    second node's is granted too (it changes no job); once the attempt's stop is ordered, a node
    that had not started yet is refused."""
    tokens = {name: register(client_, name=name) for name in ("node-a", "node-b")}
    job, _ = job_submit(user=world.alice, share_name="research", gpu_type="h100", gpus=8,
                        nodes=2, command="python train.py")  # fmt: skip
    cycle_run(force=True)
    attempt = Job.objects.get(pk=job.pk).attempts.get()
    assert sorted(a["node"] for a in attempt.allocations) == ["node-a", "node-b"]
    claim = {"attempts": [attempt.pk]}
    assert post(client_, "start", claim, tokens["node-a"]).json() == {
        "start": [attempt.pk],
        "stop": [],
    }
    assert post(client_, "start", claim, tokens["node-b"]).json() == {
        "start": [attempt.pk],
        "stop": [],
    }
    job = Job.objects.get(pk=job.pk)
    assert job.state == Job.State.RUNNING
    states = list(job.events.values_list("to_state", flat=True))
    assert states.count(Job.State.RUNNING) == 1
    JobAttempt.objects.filter(pk=attempt.pk).update(stop_requested_at=timezone.now())
    assert post(client_, "start", claim, tokens["node-b"]).json() == {
        "start": [],
        "stop": [{"attempt": attempt.pk, "grace_seconds": 2, "started": True}],
    }


def test_a_gangs_other_nodes_get_a_refused_start_s_stop_order_without_the_job_s_lock(
    client_, world
):
    """A gang's attempt whose stop came first: the first node's start is refused with the stop
    order; the other nodes get the same answer from what the web process learnt, without trying
    the start again (under the job's lock, which each would wait for in turn, holding a
    database connection)."""
    tokens = {name: register(client_, name=name) for name in ("node-a", "node-b", "node-c")}
    job, _ = job_submit(user=world.alice, share_name="research", gpu_type="h100", gpus=24,
                        nodes=3, command="python train.py")  # fmt: skip
    cycle_run(force=True)
    attempt = Job.objects.get(pk=job.pk).attempts.get()
    JobAttempt.objects.filter(pk=attempt.pk).update(stop_requested_at=timezone.now())
    claim = {"attempts": [attempt.pk]}
    refused = {"start": [], "stop": [{"attempt": attempt.pk, "grace_seconds": 2, "started": False}]}
    assert post(client_, "start", claim, tokens["node-a"]).json() == refused
    for name in ("node-b", "node-c"):
        with CaptureQueriesContext(connection) as queries_run:
            assert post(client_, "start", claim, tokens[name]).json() == refused
        assert not [q for q in queries_run if "started_at = COALESCE" in q["sql"]]
    assert JobAttempt.objects.get(pk=attempt.pk).started_at is None


def test_a_report_reads_a_gangs_attempt_once_per_node_not_once_per_gpu(client_, world):
    """Each node's report of a gang reads where its attempt holds GPUs: a row per node, each
    with the attempt's allocations (which list every node), not one per GPU. Read per GPU, a
    32-node gang's report decoded that list 256 times (bench/gang_report.py)."""
    for name in ("node-a", "node-b"):
        register(client_, name=name)
    job, _ = job_submit(user=world.alice, share_name="research", gpu_type="h100", gpus=8,
                        nodes=2, command="python train.py")  # fmt: skip
    cycle_run(force=True)
    attempt = Job.objects.get(pk=job.pk).attempts.get()
    sql, columns = queries.holders_query(1)
    rows = select_rows(sql, [False, attempt.pk, attempt.pk], columns)
    nodes = set(Node.objects.filter(name__in=["node-a", "node-b"]).values_list("pk", flat=True))
    assert sorted(row[0] for row in rows) == sorted(nodes)


def test_an_attempt_whose_stop_came_first_never_starts(client_, world):
    """A borrower's run order has reached its agent, an agent that does not say it asks before
    it starts (an earlier release's), but before the agent asks to start it the owner's job
    reclaims the GPUs: the start is refused and its answer gives the stop order (so does the
    poll, until the end is reported), the agent reports the attempt never started, and it ends
    PREEMPTED without ever starting; the borrower waits for its next turn."""
    register(client_)
    register(client_, name="node-b")
    borrower, attempt = place_a_borrower(world)
    node = attempt.allocations[0]["node"]
    token = register(client_, name=node)  # the node's agent, registered again
    (run,) = post(client_, "poll", {"running": [], "wait": 0}, token).json()["run"]
    assert run["attempt"] == attempt.pk
    owner, _ = job_submit(user=world.carol, share_name="vision", gpu_type="h100", gpus=8,
                          command="sleep 1")  # fmt: skip
    cycle_run(force=True)
    assert JobAttempt.objects.get(pk=attempt.pk).preempted_for_id == owner.pk
    stop = {"attempt": attempt.pk, "grace_seconds": 2, "started": False}
    answer = post(client_, "start", {"attempts": [attempt.pk]}, token).json()
    assert answer == {"start": [], "stop": [stop]}
    answer = post(client_, "poll", {"running": [], "wait": 5}, token).json()
    assert answer["run"] == [] and answer["stop"] == [stop]
    never = {"events": [{"type": "exited", "attempt": attempt.pk, "end": "never_started",
                         "detail": "stopped before it started"}]}  # fmt: skip
    assert post(client_, "report", never, token).json() == {"results": ["ok"]}
    attempt = JobAttempt.objects.get(pk=attempt.pk)
    assert attempt.outcome == JobAttempt.Outcome.PREEMPTED and attempt.started_at is None
    borrower = Job.objects.get(pk=borrower.pk)
    assert borrower.state == Job.State.RUNNABLE and borrower.started_at is None


def test_a_victim_whose_agent_asks_to_start_ends_at_once_if_it_had_not_started(client_, world):
    """The same reclaim, where the agent says when it registers that it starts only what the
    portal grants: the cycle that orders the stop ends the attempt (PREEMPTED, never started)
    and releases its GPUs, so the owner's job is placed by the next cycle, with no report from
    the agent; the agent's start is refused with no stop order to hear, its polls order
    nothing, and its late report of the end changes nothing."""
    for name in ("node-a", "node-b"):
        register(client_, name=name, asks_to_start=True)
    borrower, attempt = place_a_borrower(world)
    node = attempt.allocations[0]["node"]
    token = register(client_, name=node, asks_to_start=True)
    (run,) = post(client_, "poll", {"running": [], "wait": 0}, token).json()["run"]
    owner, _ = job_submit(user=world.carol, share_name="vision", gpu_type="h100", gpus=8,
                          command="sleep 1")  # fmt: skip
    cycle_run(force=True)
    attempt = JobAttempt.objects.get(pk=attempt.pk)
    assert attempt.preempted_for_id == owner.pk and attempt.started_at is None
    assert attempt.outcome == JobAttempt.Outcome.PREEMPTED and attempt.ended_at is not None
    assert not attempt.gpus.filter(released=False).exists()
    borrower = Job.objects.get(pk=borrower.pk)
    assert borrower.state == Job.State.RUNNABLE and borrower.preemption_count == 1
    answer = post(client_, "start", {"attempts": [run["attempt"]]}, token).json()
    assert answer == {"start": [], "stop": []}
    answer = post(client_, "poll", {"running": [], "wait": 0}, token).json()
    assert answer["run"] == [] and answer["stop"] == []
    never = {"events": [{"type": "exited", "attempt": attempt.pk, "end": "never_started",
                         "detail": "stopped before it started"}]}  # fmt: skip
    assert post(client_, "report", never, token).json() == {"results": ["ignored"]}
    cycle_run(force=True)
    placed = JobAttempt.objects.get(job=owner)
    assert [allocation["node"] for allocation in placed.allocations] == [node]


def test_a_victim_ended_before_its_start_counts_a_preemption_and_fails_past_max_preemptions(
    client_, world
):
    """Ended at once or after its agent's report, a preemption is a preemption: a borrower
    allowed none (`max_preemptions: 0`) fails, and says why."""
    for name in ("node-a", "node-b"):
        register(client_, name=name, asks_to_start=True)
    for max_preemptions in (None, 0):
        borrower, _ = job_submit(user=world.alice, share_name="research", gpu_type="h100",
                                 gpus=8, command="sleep 60",
                                 max_preemptions=max_preemptions)  # fmt: skip
        cycle_run(force=True)
    job_submit(user=world.carol, share_name="vision", gpu_type="h100", gpus=8, command="true")
    cycle_run(force=True)
    borrower = Job.objects.get(pk=borrower.pk)
    assert (borrower.state, borrower.preemption_count) == (Job.State.FAILED, 1)
    assert borrower.reason == (
        "preempted 1 times; max_preemptions is 0 (it had not started: its GPUs were released at "
        "once)"
    )
    assert borrower.attempts.get().outcome == JobAttempt.Outcome.PREEMPTED


def test_a_gang_with_a_node_whose_agent_does_not_ask_to_start_gets_its_stop_orders(client_, world):
    """A victim that had not started but holds GPUs on a node whose agent starts what it is
    ordered (an earlier release's) may be starting there: it keeps its GPUs and gets its stop
    orders, on every node, until its agents report the end."""
    register(client_, name="node-a", asks_to_start=True)
    register(client_, name="node-b")
    job, _ = job_submit(user=world.alice, share_name="research", gpu_type="h100", gpus=16,
                        nodes=2, command="sleep 60")  # fmt: skip
    cycle_run(force=True)
    attempt = Job.objects.get(pk=job.pk).attempts.get()
    owner, _ = job_submit(user=world.carol, share_name="vision", gpu_type="h100", gpus=8,
                          command="sleep 1")  # fmt: skip
    cycle_run(force=True)
    attempt = JobAttempt.objects.get(pk=attempt.pk)
    assert attempt.preempted_for_id == owner.pk and attempt.ended_at is None
    assert attempt.gpus.filter(released=False).count() == 16
    assert Job.objects.get(pk=job.pk).state == Job.State.PREEMPTING
    stops = dict(Node.objects.values_list("name", "pk"))
    for name in ("node-a", "node-b"):
        node = Node.objects.get(pk=stops[name])
        assert [order["attempt"] for order in node_orders(node=node).stop] == [attempt.pk]


def test_orders_and_reports_end_to_end_over_http(client_, world):
    """A node polls, gets its run order, reports start and exit; the replay of the exit and a
    report about another node's attempt are ignored."""
    token = register(client_)
    other = register(client_, name="node-b")
    job, _ = job_submit(user=world.alice, share_name="research", gpu_type="h100", gpus=8,
                        command="python train.py", env={"SEED": "1"},
                        working_dir="/home/alice/project")  # fmt: skip
    cycle_run(force=True)
    mine, theirs = (
        (token, other)
        if Job.objects.get(pk=job.pk).attempts.get().allocations[0]["node"] == "node-a"
        else (other, token)
    )
    orders = post(client_, "poll", {"running": [], "wait": 0}, mine).json()
    (run,) = orders["run"]
    assert run["command"] == "python train.py" and run["gpu_indices"] == list(range(8))
    assert run["env"] == {"SEED": "1"} and run["working_dir"] == "/home/alice/project"
    assert Job.objects.get(pk=job.pk).state == Job.State.SCHEDULED
    started = {"events": [{"type": "started", "attempt": run["attempt"]}]}
    assert post(client_, "report", started, mine).json() == {"results": ["ok"]}
    exited = {"events": [{"type": "exited", "attempt": run["attempt"], "end": "exit",
                          "exit_code": 0, "log_tail": "bye"}]}  # fmt: skip
    assert post(client_, "report", exited, theirs).json() == {"results": ["ignored"]}
    assert post(client_, "report", exited, mine).json() == {"results": ["ok"]}
    assert post(client_, "report", exited, mine).json() == {"results": ["ignored"]}
    job = Job.objects.get(pk=job.pk)
    assert job.state == Job.State.SUCCEEDED
    assert job.attempts.get().log_tail == "bye"


@pytest.mark.parametrize(
    ("model", "gpu_type"),
    [
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA A100-SXM4-80GB", "a100-80g"),
        ("NVIDIA A100-PCIE-40GB", "a100-40g"),
        ("NVIDIA L4", "l4"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA A10G", "a10g"),
        ("Tesla T4", "t4"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("Tesla P100-PCIE-16GB", "tesla-p100-pcie-16gb"),
    ],
)
def test_gpu_model_names_map_to_gpu_types(model, gpu_type):
    assert gpu_type_for_model(model) == gpu_type


def test_the_agent_without_nvml_or_fake_gpus_says_what_to_do(capsys):
    """No NVML and no --fake-gpus: a clear error naming both ways out (exit code 2)."""
    from scheduler.agent.__main__ import main

    code = main(["--join-token", "x", "--name", "n"])
    err = capsys.readouterr().err
    assert code == 2
    assert "NVML" in err and "--fake-gpus" in err
