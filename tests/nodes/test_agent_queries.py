"""What an agent request costs the database: the web server answers every node's polls and
reports, so a request reads and writes a fixed number of statements, not a few per job
(bench/soak.py)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from scheduler.cycle.run import cycle_run
from scheduler.jobs.services import job_submit
from scheduler.models import ClusterSettings, Job, JobAttempt

pytestmark = pytest.mark.django_db

JOIN = "the-join-token"


@pytest.fixture
def agent(world, settings):
    """A function that posts as the agent of a registered 8-GPU node: (answer, statements)."""
    # A heartbeat is written when the last one is older than a tenth of the timeout: none
    # during the test, however slow the machine.
    settings.NODE_HEARTBEAT_TIMEOUT_SECONDS = 3600
    ClusterSettings.objects.update_or_create(pk=1, defaults={"agent_join_token": JOIN})
    client = Client()
    body = {"join_token": JOIN, "name": "node-a", "gpu_type": "h100", "gpus": 8}
    token = client.post("/api/v1/agent/register/", body, content_type="application/json").json()[
        "token"
    ]

    def post(path: str, body: dict) -> tuple[dict, int]:
        with CaptureQueriesContext(connection) as context:
            response = client.post(
                f"/api/v1/agent/{path}/",
                body,
                content_type="application/json",
                HTTP_AUTHORIZATION=f"Node {token}",
            )
        assert response.status_code == 200, response.content
        return response.json(), len(context.captured_queries)

    # The process's first poll may be woken by its subscription to order changes coming up.
    post("poll", {"running": [], "wait": 0})
    return post


def placed(world, count: int) -> None:
    for _ in range(count):
        job_submit(user=world.alice, share_name="research", gpu_type="h100", gpus=2,
                   command="python train.py")  # fmt: skip
    cycle_run(force=True)


def started(ids):
    return [{"type": "started", "attempt": a} for a in ids]


def exited(ids):
    return [{"type": "exited", "attempt": a, "end": "exit", "exit_code": 0} for a in ids]


def test_an_idle_poll_reads_the_node_and_its_orders_only(agent):
    """Nothing to deliver, nothing to report: the node's token, then its orders."""
    answer, statements = agent("poll", {"running": [], "wait": 0})
    assert answer == {"run": [], "stop": [], "results": []}
    assert statements == 2


def test_events_of_many_jobs_cost_what_the_events_of_one_job_cost(world, agent):
    """Started and exited events are applied together, one statement per kind of read and
    write: four jobs cost the statements one job costs. Every change is still recorded, with
    its reason."""
    placed(world, 1)
    (run,) = agent("poll", {"running": [], "wait": 0})[0]["run"]
    one = [run["attempt"]]
    _, one_started = agent("poll", {"running": one, "wait": 0, "events": started(one)})
    _, one_exited = agent("report", {"events": exited(one)})

    placed(world, 4)
    answer, _ = agent("poll", {"running": [], "wait": 0})
    four = [order["attempt"] for order in answer["run"]]
    assert len(four) == 4
    answer, four_started = agent("poll", {"running": four, "wait": 0, "events": started(four)})
    assert answer["results"] == ["ok"] * 4
    answer, four_exited = agent("report", {"events": exited(four)})
    assert answer["results"] == ["ok"] * 4

    # The token; BEGIN, the locks, the GPUs held, their release, attempts, jobs, events, COMMIT.
    assert one_exited == 9
    if connection.vendor == "postgresql":
        # Elsewhere rows with different values (each job's own reason) take a statement each.
        assert (four_started, four_exited) == (one_started, one_exited)
    for job in Job.objects.all():
        assert (job.state, job.reason) == (Job.State.SUCCEEDED, "exited with code 0")
        (gpus,) = job.attempts.get().allocations
        events = list(job.events.values_list("to_state", "reason"))[-3:]
        assert events == [
            (Job.State.STARTING, "order delivered to node-a (8 × h100); starting"),
            (
                Job.State.RUNNING,
                f"running on node-a (GPU {','.join(map(str, gpus['gpu_indices']))})",
            ),
            (Job.State.SUCCEEDED, "exited with code 0"),
        ]
    assert set(JobAttempt.objects.values_list("outcome", flat=True)) == {"SUCCEEDED"}


def test_granting_the_starts_of_many_attempts_costs_what_one_costs(world, agent):
    """An agent asks to start every attempt an answer gave it in one request: the locks, one
    conditional update for all of them, the jobs and their events, whatever their number."""
    placed(world, 1)
    (run,) = agent("poll", {"running": [], "wait": 0})[0]["run"]
    answer, one = agent("start", {"attempts": [run["attempt"]]})
    assert answer["start"] == [run["attempt"]]
    placed(world, 3)
    orders = agent("poll", {"running": [run["attempt"]], "wait": 0})[0]["run"]
    claims = [order["attempt"] for order in orders if order["attempt"] != run["attempt"]]
    answer, three = agent("start", {"attempts": claims})
    assert answer["start"] == sorted(claims)
    if connection.vendor == "postgresql":
        assert three == one
    assert set(Job.objects.values_list("state", flat=True)) == {Job.State.RUNNING}


def test_a_start_and_an_exit_of_one_attempt_in_one_request_apply_in_order(world, agent):
    """The second event about an attempt sees what the first did: the exit after the start,
    and a replayed exit is ignored."""
    placed(world, 2)
    first, second = (o["attempt"] for o in agent("poll", {"running": [], "wait": 0})[0]["run"])
    events = [*started([first, second]), *exited([first]), *exited([first])]
    answer, _ = agent("report", {"events": events})
    assert answer["results"] == ["ok", "ok", "ok", "ignored"]
    states = dict(JobAttempt.objects.values_list("pk", "job__state"))
    assert (states[first], states[second]) == (Job.State.SUCCEEDED, Job.State.RUNNING)


def test_a_log_tail_takes_no_lock(world, agent):
    """Log tails change no state: the held GPUs are read and each tail written while its
    attempt runs, with no transaction; a tail about an attempt not held here is ignored."""
    placed(world, 1)
    (run,) = agent("poll", {"running": [], "wait": 0})[0]["run"]
    log = {"type": "log", "attempt": run["attempt"], "log_tail": "epoch 3"}
    answer, statements = agent("report", {"events": [log, {**log, "attempt": 10**9}]})
    assert answer["results"] == ["ok", "ignored"]
    assert statements == 3  # the token, the GPUs held here, the tail
    assert JobAttempt.objects.get(pk=run["attempt"]).log_tail == "epoch 3"
