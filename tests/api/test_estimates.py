"""Estimated starts over the API, the Python client and the CLI, against a live server: the
what-if before a submit (nothing stored), the estimate on a waiting job, and the bad requests
that get a 400 naming the field. The cluster of the API tests: two 8-GPU h100 nodes."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from portal_client import Client, PortalError
from scheduler.cycle.estimates import estimates_refresh
from scheduler.cycle.run import cycle_run
from scheduler.models import Job
from tests.api.helpers import job_request
from tests.api.test_client import cli

ESTIMATE = "/api/v1/jobs/estimate/"


@pytest.fixture
def bob_client(world, live_server) -> Client:
    return Client(live_server.url, world.tokens["bob"])


def busy(client: Client, seconds: int = 3600) -> None:
    """research fills both h100 nodes (its own 8 and vision's lent 8), each for `seconds`."""
    for _ in range(2):
        client.submit(share="research", gpus=8, gpu_type="h100", command="x",
                      expected_seconds=seconds)  # fmt: skip
    cycle_run(force=True)


def test_what_if_says_when_a_job_would_start_and_stores_nothing(world, bob_client):
    """Both nodes busy for an hour: a research job would wait (research at its limit) and start
    in about an hour; vision's would reclaim its lent GPUs and start after research's grace
    period (2 s). No job is created."""
    busy(bob_client)
    before = Job.objects.count()
    answer = bob_client.estimate(share="research", gpus=8, gpu_type="h100", command="x",
                                 expected_seconds=60)  # fmt: skip
    start = datetime.fromisoformat(answer["estimated_start"])
    assert timedelta(minutes=55) < start - datetime.now(start.tzinfo) <= timedelta(hours=1)
    assert answer["reason"] and "no new job" in answer["estimate_basis"]
    carol = world.client("carol")
    owner = carol.post(ESTIMATE, job_request(share="vision"), format="json").json()
    soon = datetime.fromisoformat(owner["estimated_start"]) - datetime.now(start.tzinfo)
    assert soon <= timedelta(seconds=3) and owner["reason"].startswith("reclaiming 8 h100")
    (on,) = owner["estimated_allocations"]  # the borrower's node, all of it
    assert on["gpu_indices"] == list(range(8)) and owner["estimated_nodes"] == [on["node"]]
    # The command changes no estimate: a what-if may leave it out.
    body = {k: v for k, v in job_request(share="vision").items() if k != "command"}
    without = carol.post(ESTIMATE, body, format="json")
    assert without.status_code == 200 and without.json()["reason"] == owner["reason"]
    assert bob_client.estimate(share="research", gpus=8, gpu_type="h100")["reason"]
    assert Job.objects.count() == before


def test_what_if_checks_the_request_as_a_submit_does(world, bob_client):
    bob = world.client("bob")
    for body, field in (
        (job_request(gpus=0), "gpus"),
        (job_request(expected_seconds=0), "expected_seconds"),
        (job_request(gpu_type="l4", gpus=8), "gpus"),  # no l4 node holds 8
    ):
        response = bob.post(ESTIMATE, body, format="json")
        assert response.status_code == 400 and field in response.json(), body
    hidden = world.client("oscar").post(ESTIMATE, job_request(), format="json")
    assert hidden.status_code == 404 and "share" in hidden.json()
    with pytest.raises(PortalError) as error:
        bob_client.estimate(share="research", gpus=8, gpu_type="h100", command="x",
                            expected_seconds=-3)  # fmt: skip
    assert error.value.status == 400


def test_a_waiting_job_shows_its_estimate_in_the_api_and_the_cli(world, bob_client, live_server):
    busy(bob_client, seconds=1800)
    waiting = bob_client.submit(share="research", gpus=8, gpu_type="h100", command="x",
                                expected_seconds=600)  # fmt: skip
    estimates_refresh()
    shown = bob_client.job(waiting["id"])
    start = datetime.fromisoformat(shown["estimated_start"])
    assert timedelta(minutes=25) < start - datetime.now(start.tzinfo) <= timedelta(minutes=30)
    assert shown["estimated_nodes"] and "its expected_seconds" in shown["estimate_basis"]
    assert [a["node"] for a in shown["estimated_allocations"]] == shown["estimated_nodes"]
    assert len(shown["estimated_allocations"][0]["gpu_indices"]) == 8
    token = world.tokens["bob"]
    listing = cli(live_server, token, "ls", "--state", "RUNNABLE")
    assert "estimated start" in listing.stdout
    described = cli(live_server, token, "show", str(waiting["id"]))
    assert "estimated start" in described.stdout and "no new job" in described.stdout
    assert " GPUs 0,1,2,3,4,5,6,7" in described.stdout
    what_if = cli(live_server, token, "estimate", "--share", "research", "--gpus", "8",
                  "--gpu-type", "h100", "--expected-seconds", "60")  # fmt: skip
    assert what_if.returncode == 0, what_if.stderr
    assert what_if.stdout.startswith("would start: ") and "no new job" in what_if.stdout


def test_who_is_ahead_of_a_waiting_job_and_whose_jobs_hold_its_gpus(world, bob_client, live_server):
    """Three research jobs wait: the last one sees the other two ahead of it in the engine's
    order (the higher priority first), in the API and in the CLI. vision's owner job sees
    research's jobs that borrow (above research's limit) hold what it waits for, and once the
    cycle reclaims, research's borrower stopping for it; another team's jobs without ids."""
    busy(bob_client)
    first = bob_client.submit(share="research", gpus=8, gpu_type="h100", command="x")
    urgent = bob_client.submit(share="research", gpus=8, gpu_type="h100", command="x",
                               priority=5)  # fmt: skip
    last = bob_client.submit(share="research", gpus=8, gpu_type="h100", command="x")
    where = bob_client.ahead(last["id"])
    assert (where["position"], where["count"], where["gpus"]) == (3, 2, 16)
    assert [entry["job"] for entry in where["ahead"]] == [urgent["id"], first["id"]]
    assert where["holders"] == []
    shown = cli(live_server, world.tokens["bob"], "show", str(last["id"])).stdout
    assert "2 job(s) ahead of it (16 GPUs):" in shown
    assert f"  1. job {urgent['id']} of share research, 8 GPUs, priority 5" in shown
    carol = world.client("carol")
    owner = carol.post("/api/v1/jobs/", job_request(share="vision"), format="json").json()
    borrowing = carol.get(f"/api/v1/jobs/{owner['id']}/ahead/").json()
    assert (
        borrowing["holders"]
        == [{"job": None, "share": "research", "gpus": 8, "stopping": False}] * 2
    )
    cycle_run(force=True)
    seen = carol.get(f"/api/v1/jobs/{owner['id']}/ahead/").json()
    assert seen["position"] == 1 and seen["count"] == 0
    assert seen["holders"] == [{"job": None, "share": "research", "gpus": 8, "stopping": True}]
    shown = cli(live_server, world.tokens["carol"], "show", str(owner["id"])).stdout
    assert "  held: a job of share research, 8 GPUs, stopping for it" in shown
    running = bob_client.jobs(state="SCHEDULED")[0]
    assert bob_client.ahead(running["id"])["position"] is None
    assert world.client("oscar").get(f"/api/v1/jobs/{last['id']}/ahead/").status_code == 404
