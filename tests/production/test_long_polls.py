"""Agents' long polls through the production server (uvicorn, `gpu-portal-server web`): while
they wait they hold neither a thread nor a database connection of the web server, and a stop
order written while they wait reaches its agent's poll at once (it answers long before its wait
is over)."""

from __future__ import annotations

import threading

import psutil
import pytest
import requests
from django.db import connection

from scheduler.cycle.run import cycle_run
from scheduler.jobs.services import job_cancel, job_submit
from scheduler.models import ClusterSettings, Job
from tests.live import wait_for

pytestmark = pytest.mark.live

JOIN = "production-join-token"
NODES = 40
POOL = 3
WAIT_SECONDS = 20  # the poll's own wait; the test's HTTP timeout is shorter than two of them


def post(url: str, path: str, body: dict, token: str | None = None, timeout: float = 10):
    headers = {"Authorization": f"Node {token}"} if token else {}
    response = requests.post(f"{url}/api/v1/agent/{path}/", json=body, headers=headers,
                             timeout=timeout)  # fmt: skip
    assert response.status_code in (200, 201), response.text
    return response.json()


def server_connections() -> int:
    """Connections to the test database that are not this test's own."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid()"
        )
        return cursor.fetchone()[0]


def web_threads(process: psutil.Process) -> int:
    """Threads of the web server: its supervisor and its worker process(es)."""
    return sum(p.num_threads() for p in [process, *process.children(recursive=True)])


def polls_connected(process: psutil.Process, port: int) -> int:
    """Client connections the web server holds open on its port."""
    return sum(
        1
        for p in [process, *process.children(recursive=True)]
        for c in p.net_connections(kind="tcp")
        if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port
    )


@pytest.mark.slow
def test_waiting_polls_hold_no_thread_nor_connection_and_a_stop_wakes_its_poll(live, world):
    if connection.vendor != "postgresql":
        pytest.skip("counts the server's PostgreSQL connections (CI runs on PostgreSQL)")
    ClusterSettings.objects.update_or_create(pk=1, defaults={"agent_join_token": JOIN})
    system = live()
    # A poll may wait up to a third of the heartbeat timeout.
    system.start_web(production=True, DATABASE_POOL_SIZE=str(POOL),
                     NODE_HEARTBEAT_TIMEOUT_SECONDS=str(WAIT_SECONDS * 4))  # fmt: skip
    web = psutil.Process(system.web.pid)
    tokens = {}
    for i in range(NODES):
        answer = post(system.url, "register", {"join_token": JOIN, "name": f"node-{i:02d}",
                                               "gpu_type": "h100", "gpus": 8})  # fmt: skip
        tokens[answer["node"]] = answer["token"]
    # A job placed on node-00 and started there, as its agent would have it.
    job, _ = job_submit(user=world.alice, share_name="research", gpu_type="h100", gpus=8,
                        command="python train.py")  # fmt: skip
    cycle_run(force=True)
    attempt = Job.objects.get(pk=job.pk).attempts.get()
    node = attempt.allocations[0]["node"]
    post(system.url, "start", {"attempts": [attempt.pk]}, tokens[node])
    # A first poll puts the server's one Redis subscription in place (polls waiting before it
    # is are woken once it is, to read their orders again).
    post(system.url, "poll", {"running": [attempt.pk], "wait": 0}, tokens[node])
    idle_threads = web_threads(web)

    answers: dict[str, dict] = {}

    def long_poll(name: str) -> None:
        running = [attempt.pk] if name == node else []
        body = {"running": running, "stopping": [], "wait": WAIT_SECONDS}
        answers[name] = post(system.url, "poll", body, tokens[name], timeout=WAIT_SECONDS * 1.8)

    polls = [threading.Thread(target=long_poll, args=(name,)) for name in tokens]
    for thread in polls:
        thread.start()
    # Every poll has reached the server and waits there. Meanwhile the server holds no more
    # threads than before (none per poll) and at most its pool's connections.
    wait_for(lambda: polls_connected(web, system.port) >= NODES, what="the polls to connect")
    peak_threads, peak_connections = 0, 0
    for _ in range(20):
        peak_threads = max(peak_threads, web_threads(web))
        peak_connections = max(peak_connections, server_connections())
        threading.Event().wait(0.1)
    assert not answers, "a poll answered although nothing changed"
    assert peak_threads < idle_threads + NODES // 4, (idle_threads, peak_threads)
    assert peak_connections <= POOL, peak_connections

    # The job is cancelled; the cycle turns that into a stop order for its node.
    job_cancel(job=Job.objects.get(pk=job.pk), user=world.alice)
    cycle_run(force=True)
    polls[list(tokens).index(node)].join(timeout=WAIT_SECONDS / 2)
    assert node in answers, "the stop order did not wake its agent's poll"
    # Carried by the node's wake-up (scheduler.cycle.wake), as the orders would read.
    assert answers[node]["stop"] == [{"attempt": attempt.pk, "grace_seconds": 2, "started": True}]
    assert len(answers) == 1, "other nodes' polls were answered too"
    for thread in polls:
        thread.join()
    assert all(a == {"run": [], "stop": [], "results": []} for n, a in answers.items() if n != node)
