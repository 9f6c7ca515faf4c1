"""The REST API, the admin and the dashboards as the production server serves them
(`portal.threaded_wsgi`): driven through the ASGI interface as uvicorn drives them, with the
portal's own WSGI application and the real database, and with small WSGI applications for what
the portal's answers do not show (a large answer, a header sent twice, an application error)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable

import pytest
from django.core.wsgi import get_wsgi_application
from django.db import connections

from portal.threaded_wsgi import BUFFER_BYTES, ThreadedWsgi
from scheduler.models import Job
from tests.conftest import make_node

JOBS = "/api/v1/jobs/"


def scope(method: str, path: str, headers: list[tuple[bytes, bytes]] = (), **more) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1"), *headers],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
        **more,
    }


def submit_scope(world, body: bytes) -> dict:
    """bob's submit of the JSON `body`."""
    return scope(
        "POST",
        JOBS,
        [
            (b"authorization", f"Token {world.tokens['bob']}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
    )


def call(app, request: dict, *body_parts: bytes, sent: list[dict] | None = None) -> list[dict]:
    """Run one request (its body sent in these parts) as an ASGI server would; the messages
    the application sent (into `sent`, if given, as they are sent)."""
    messages = [
        {"type": "http.request", "body": part, "more_body": k < len(body_parts) - 1}
        for k, part in enumerate(body_parts or [b""])
    ]
    sent = [] if sent is None else sent

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(request, receive, send))
    return sent


def answer(sent: list[dict]) -> tuple[int, dict[bytes, bytes], bytes]:
    """The status, headers and body of the messages sent."""
    assert sent[0]["type"] == "http.response.start"
    assert all(m["type"] == "http.response.body" for m in sent[1:])
    assert not sent[-1].get("more_body"), "the body was never ended"
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return sent[0]["status"], dict(sent[0]["headers"]), body


@pytest.fixture
def served(transactional_db) -> Callable:
    """`served(app)`: `app` (a WSGI application) as the production server serves it, on one
    thread whose database connection is closed at the end."""
    bridges = []

    def serve(app) -> ThreadedWsgi:
        bridges.append(ThreadedWsgi(app, threads=1))
        return bridges[-1]

    yield serve
    for bridge in bridges:
        bridge.executor.submit(connections.close_all).result()  # so the database can be dropped
        bridge.executor.shutdown()


def test_a_job_submitted_through_the_production_server_is_accepted(world, served):
    make_node("h100-0")
    portal = served(get_wsgi_application())
    body = json.dumps(
        {"share": "research", "gpu_type": "h100", "gpus": 1, "command": "true", "name": "bridged"}
    ).encode()
    request = submit_scope(world, body)
    # The body comes in two parts, as a client's packets may: both are read before the request.
    status, headers, answered = answer(call(portal, request, body[:10], body[10:]))
    assert status == 201, answered
    assert headers[b"content-type"] == b"application/json"
    job = Job.objects.get(pk=json.loads(answered)["id"])
    assert (job.name, job.share.name, job.submitted_by.username) == ("bridged", "research", "bob")


def test_an_oversized_body_is_refused_with_413_naming_the_limit(world, served, settings):
    from scheduler.api.errors import BODY_TOO_LARGE  # after Django's setup: DRF's settings

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    portal = served(get_wsgi_application())
    body = json.dumps({"share": "research", "name": "x" * 20_000}).encode()
    status, _, answered = answer(call(portal, submit_scope(world, body), body))
    assert status == 413
    assert json.loads(answered)["detail"] == BODY_TOO_LARGE.format(size=len(body), limit=10_000)
    assert not Job.objects.exists()


def test_a_large_answer_arrives_whole_in_pieces_and_its_request_ends_on_its_own_thread(served):
    piece = b"x" * (BUFFER_BYTES // 2 + 1)
    threads = {}
    sent: list[dict] = []

    class Answer:
        def __iter__(self):
            threads["ran"] = threading.get_ident()
            yield from (piece, b"", piece)
            # Past BUFFER_BYTES: what came so far is on its way before the rest is made.
            threads["sent before the last piece"] = len(sent)
            yield piece

        def close(self):  # Django's request_finished (database connections) runs here
            threads["closed"] = threading.get_ident()

    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        return Answer()

    status, _, body = answer(call(served(app), scope("GET", "/static/big.js"), sent=sent))
    assert status == 200 and body == piece * 3
    assert threads["sent before the last piece"] == 3  # the start and two pieces
    assert threads["closed"] == threads["ran"] != threading.get_ident()


def test_headers_path_and_query_reach_the_application_as_under_wsgi(served):
    seen = {}

    def app(environ, start_response):
        seen.update(environ)
        seen["body"] = environ["wsgi.input"].read()
        start_response("204 No Content", [("X-Seen", "yes")])
        return []

    request = scope(
        "POST",
        "/portal/café/",
        [(b"accept", b"text/html"), (b"accept", b"application/json"), (b"content-length", b"2")],
        query_string=b"state=RUNNABLE&share=vision",
        root_path="/portal",
    )
    status, headers, body = answer(call(served(app), request, b"o", b"k"))
    assert (status, headers[b"x-seen"], body) == (204, b"yes", b"")
    assert seen["SCRIPT_NAME"] == "/portal"
    # PEP 3333: the path's bytes as latin-1 text.
    assert seen["PATH_INFO"] == "/café/".encode().decode("latin-1")
    assert seen["QUERY_STRING"] == "state=RUNNABLE&share=vision"
    assert seen["HTTP_ACCEPT"] == "text/html,application/json"  # sent twice: joined
    assert (seen["CONTENT_LENGTH"], seen["body"]) == ("2", b"ok")
    assert (seen["REMOTE_ADDR"], seen["SERVER_PORT"]) == ("127.0.0.1", "8000")


def test_an_answer_written_with_the_write_callable_is_sent(served):
    def app(environ, start_response):
        write = start_response("200 OK", [])
        write(b"written, ")
        return [b"then returned"]

    assert answer(call(served(app), scope("GET", "/")))[2] == b"written, then returned"


def test_a_client_gone_before_its_body_arrived_runs_nothing(served):
    ran = []

    def app(environ, start_response):
        ran.append(environ)
        start_response("200 OK", [])
        return [b""]

    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(served(app)(scope("POST", JOBS), receive, send))
    assert ran == [] and sent == []


def test_an_application_error_reaches_the_server_with_nothing_sent(served):
    """uvicorn answers 500 to an application that raised before it answered, and logs it."""

    def app(environ, start_response):
        raise LookupError("broken view")

    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b""}

    async def send(message: dict) -> None:
        sent.append(message)

    with pytest.raises(LookupError, match="broken view"):
        asyncio.run(served(app)(scope("GET", "/"), receive, send))
    assert sent == []
