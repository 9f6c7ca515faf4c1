"""The agent endpoints as the production server serves them (`scheduler.nodes.asgi`), driven
through their ASGI interface as uvicorn drives them, with the shared database threads and the
real database and Redis: routing, a request whose agent gave up before its work could begin,
and a woken poll's grants."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connections

from portal.db import threads
from scheduler.cycle import wake
from scheduler.cycle.run import cycle_run
from scheduler.jobs.services import job_submit
from scheduler.models import ClusterSettings, Job, Node
from scheduler.nodes import views
from scheduler.nodes.asgi import GAVE_UP, AgentEndpoints

JOIN = "the-join-token"
WAIT = 10.0  # seconds; only a broken test waits this long


async def rest_of_the_portal(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 299, "headers": []})
    await send({"type": "http.response.body", "body": b"the rest of the portal"})


async def post(app, path: str, body: object, token: str | None = None) -> tuple[int, bytes]:
    """POST `body` as JSON to `path`, as an ASGI server would (as node `token`); the status
    and the body."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [
            (b"content-type", b"application/json"),
            (b"host", b"127.0.0.1"),
            *([(b"authorization", f"Node {token}".encode())] if token else []),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
    }
    messages = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


@pytest.fixture
def app(transactional_db, monkeypatch):
    """The endpoints, with one shared database thread (the work of the other threads is done
    on it, committed, as in production)."""
    ClusterSettings.objects.update_or_create(pk=1, defaults={"agent_join_token": JOIN})
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="database") as executor:
        monkeypatch.setattr(threads, "_executor", executor)
        yield AgentEndpoints(rest_of_the_portal)
        executor.submit(connections.close_all).result()  # so the test database can be dropped


def registration(name: str) -> dict:
    return {"join_token": JOIN, "name": name, "gpu_type": "h100", "gpus": 8}


def test_other_paths_go_to_the_rest_of_the_portal_and_unknown_agent_paths_are_a_404(app):
    assert asyncio.run(post(app, "/api/v1/jobs/", {})) == (299, b"the rest of the portal")
    status, body = asyncio.run(post(app, "/api/v1/agent/no-such-thing/", {}))
    assert status == 404 and "no such agent endpoint" in json.loads(body)["detail"]


def test_a_request_not_begun_before_its_agent_gave_up_is_left_undone_and_answered_503(
    app, monkeypatch, caplog
):
    """While every database thread is busy, an agent's registration waits; its agent gives up
    (here after 0.05 s instead of the protocol's 10). The registration is not done (no node),
    the answer is a 503 saying to send it again, and the same request sent again is done."""
    monkeypatch.setattr(views, "ANSWER_SECONDS", 0.05)
    monkeypatch.setattr(threads, "_given_up", threads._GivenUp())  # nothing logged yet
    inside, go_on = threading.Event(), threading.Event()

    def busy() -> None:
        inside.set()
        go_on.wait(WAIT)

    async def main() -> tuple[int, bytes]:
        holder = asyncio.create_task(threads.in_database_thread(busy))
        await asyncio.to_thread(inside.wait, WAIT)
        request = asyncio.create_task(post(app, "/api/v1/agent/register/", registration("n1")))
        await asyncio.sleep(0.2)  # the agent has given up by now
        go_on.set()
        await holder
        return await request

    status, body = asyncio.run(main())
    assert status == 503 and json.loads(body) == {"detail": GAVE_UP}
    assert not Node.objects.filter(name="n1").exists()
    assert any("left undone" in record.getMessage() for record in caplog.records)

    monkeypatch.setattr(views, "ANSWER_SECONDS", WAIT)
    status, body = asyncio.run(post(app, "/api/v1/agent/register/", registration("n1")))
    assert status == 201, body
    assert Node.objects.get(name="n1").state == Node.State.READY


def test_a_woken_poll_that_asks_for_grants_answers_with_its_new_start_granted(app, world):
    """A node's poll waits, asking for grants; a cycle places a job there, and the node's
    wake-up carries the run order (`scheduler.cycle.wake`): the poll answers with it granted
    (the start recorded in a database step after the wake-up) and the job is RUNNING, with no
    request to start it."""
    status, body = asyncio.run(post(app, "/api/v1/agent/register/", registration("n1")))
    assert status == 201, body
    token = json.loads(body)["token"]
    node = Node.objects.get(name="n1")

    async def poll(wait: float) -> dict:
        body = {"running": [], "wait": wait, "grants": True}
        status, answer = await post(app, "/api/v1/agent/poll/", body, token=token)
        assert status == 200, answer
        return json.loads(answer)

    # A first poll brings the process's subscription up (polls waiting meanwhile read their
    # orders again instead of taking what a wake-up carries).
    assert asyncio.run(poll(0))["run"] == []
    job, _ = job_submit(user=world.alice, share_name="research", gpu_type="h100", gpus=8,
                        command="python train.py")  # fmt: skip

    async def main() -> dict:
        waiting = asyncio.create_task(poll(WAIT))
        while not wake._listener.waiting.get(node.pk):
            await asyncio.sleep(0.01)
        await threads.in_database_thread(cycle_run, force=True)
        return await waiting

    answer = asyncio.run(main())
    (run,) = answer["run"]
    assert run["job"] == job.pk and run["granted"] is True
    job = Job.objects.get(pk=job.pk)
    assert job.state == Job.State.RUNNING and job.attempts.get().started_at is not None
