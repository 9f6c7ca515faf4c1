"""The nodes of a gang ask to start the same attempt at the same moment. Requests about one
attempt take turns in a web process (`KeyedLocks`: none holds a database thread waiting for the
job's lock), but once a start of the attempt is decided, the others go side by side: the start
grants an attempt already started without the job's lock (`DecidedStarts`). Checked on the
agent views' own wrapper, on database threads as under the production server, with a view
whose calls must overlap to finish."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.http import JsonResponse
from django.test import RequestFactory

from portal.db import threads
from scheduler.nodes.views import DecidedStarts, Principal, _attempts_named, agent_view

NODES = 3
ANYONE = Principal(lambda request: "node", lambda: JsonResponse({}, status=401))


@pytest.fixture
def database_threads(monkeypatch):
    with ThreadPoolExecutor(max_workers=NODES + 1) as executor:
        monkeypatch.setattr(threads, "_executor", executor)  # as under the production server
        yield


def starts(view, attempt: int, count: int) -> list[int]:
    """`count` nodes ask at once to start `attempt`: the answers' status codes."""
    body = {"attempts": [attempt], "together": count > 1}
    request = RequestFactory().post("/api/v1/agent/start/", json.dumps(body), "application/json")

    async def together() -> list[int]:
        answers = await asyncio.gather(*(view(request) for _ in range(count)))
        return [answer.status_code for answer in answers]

    return asyncio.run(together())


def gang_view(once: DecidedStarts, barrier: threading.Barrier):
    def start(request, node, data):
        if data["together"]:
            barrier.wait()  # returns only once every node's call has come: side by side
        return JsonResponse({"start": data["attempts"]})

    return agent_view(about=_attempts_named, principal=ANYONE, once=once)(start)


def test_once_a_start_is_decided_the_gang_s_other_nodes_start_side_by_side(database_threads):
    decided = DecidedStarts()
    view = gang_view(decided, threading.Barrier(NODES, timeout=30))
    assert starts(view, attempt=7, count=1) == [200]  # the first node: decided
    assert decided.undecided([7, 8]) == [8]
    assert starts(view, attempt=7, count=NODES) == [200] * NODES
