"""What the API shows of a node a Slurm connector brings (its connector, why it is in its state,
the GPUs used outside the portal) and of an attempt Slurm runs (Slurm's job id and the GPU
indices Slurm really gave), beside the portal's own nodes and attempts."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from schemathesis.specs.openapi.checks import response_schema_conformance

from scheduler.jobs.services import job_submit
from scheduler.models import Connector, Job, JobAttempt
from tests.api.test_client import cli
from tests.api.test_schema import keep_the_test_connection, schema  # noqa: F401
from tests.api.test_submit_queries import statements
from tests.conftest import make_node

SLURM_JOB = {"id": "4242", "allocations": [{"node": "sn1", "gpu_indices": [5, 7]}]}


@pytest.fixture
def slurm(world) -> Connector:
    """Connector `slurm` with node sn1 (8 h100, 6 held by Slurm's own jobs) and node sn2
    (drained in Slurm), beside the agents' nodes of the world."""
    connector = Connector.objects.create(name="slurm", kind=Connector.Kind.SLURM)
    world.nodes["sn1"] = make_node("sn1", connector=connector, outside_gpus=6)
    world.nodes["sn2"] = make_node(
        "sn2", connector=connector, state="DRAINING", state_reason="Slurm: drained (maint)"
    )
    return connector


def nodes_by_name(world, persona: str) -> dict[str, dict]:
    response = world.client(persona).get("/api/v1/nodes/")
    assert response.status_code == 200, response.content
    return {node["name"]: node for node in response.json()}


def test_every_persona_sees_which_cluster_brings_a_node_and_what_it_holds_outside(world, slurm):
    """The connector by name, Slurm's reason for a drained node and the GPUs Slurm's own jobs
    hold; a node its own agent runs has no connector, no reason and nothing outside."""
    for persona in ("root", "alice", "bob", "carol", "oscar"):
        nodes = nodes_by_name(world, persona)
        sn1, sn2, agent = nodes["sn1"], nodes["sn2"], nodes["h100-0"]
        assert (sn1["connector"], sn1["outside_gpus"], sn1["state_reason"]) == ("slurm", 6, "")
        assert (sn2["state"], sn2["state_reason"]) == ("DRAINING", "Slurm: drained (maint)")
        assert (agent["connector"], agent["outside_gpus"], agent["state_reason"]) == (None, 0, "")


def test_a_node_s_describe_and_drain_show_its_cluster_fields(world, slurm):
    described = world.client("bob").get("/api/v1/nodes/sn1/").json()
    assert (described["connector"], described["outside_gpus"]) == ("slurm", 6)
    drained = world.client("root").post("/api/v1/nodes/sn1/drain/")
    assert drained.status_code == 200, drained.content
    assert (drained.json()["state"], drained.json()["connector"]) == ("DRAINING", "slurm")


def test_the_node_list_reads_the_connectors_with_the_nodes(world, slurm):
    """Showing each node's connector costs no query per node: as many SELECTs for ten Slurm
    nodes as for two."""

    def selects() -> int:
        with CaptureQueriesContext(connection) as context:
            assert world.client("root").get("/api/v1/nodes/").status_code == 200
        return len(statements(context, "SELECT"))

    before = selects()
    for i in range(3, 11):
        make_node(f"sn{i}", connector=slurm)
    assert selects() == before


@pytest.fixture
def slurm_job(world, slurm) -> Job:
    """bob's 2-GPU job: its first attempt ran on an agent's node and was preempted, its second
    runs in Slurm as job 4242, on GPUs 5 and 7 of sn1 where the portal placed it on 0 and 1."""
    job, _ = job_submit(
        user=world.users["bob"], share_name="research", gpu_type="h100", gpus=2, command="x"
    )
    now = timezone.now()
    JobAttempt.objects.create(
        job=job, number=1, allocations=[{"node": "h100-0", "gpu_indices": [0, 1]}],
        started_at=now, ended_at=now, outcome=JobAttempt.Outcome.PREEMPTED,
    )  # fmt: skip
    JobAttempt.objects.create(
        job=job, number=2, allocations=[{"node": "sn1", "gpu_indices": [0, 1]}],
        started_at=now, cluster_job=SLURM_JOB,
    )  # fmt: skip
    Job.objects.filter(pk=job.pk).update(state=Job.State.RUNNING, attempt_count=2)
    return job


def test_a_job_s_describe_shows_what_slurm_runs_each_attempt_as(world, slurm_job):
    """Each attempt shows Slurm's job id and the GPU indices Slurm gave ({} for the attempt an
    agent ran), beside the portal's own indices; the job shows its latest attempt's."""
    data = world.client("bob").get(f"/api/v1/jobs/{slurm_job.pk}/").json()
    on_agent, in_slurm = data["attempts"]
    assert on_agent["cluster_job"] == {}
    assert in_slurm["cluster_job"] == SLURM_JOB
    assert in_slurm["allocations"] == [{"node": "sn1", "gpu_indices": [0, 1]}]
    assert data["cluster_job"] == SLURM_JOB
    assert data["allocations"] == [{"node": "sn1", "gpu_indices": [0, 1]}]
    assert data["preemptions"]["recent"][0]["cluster_job"] == {}


def test_the_job_page_and_the_cli_show_the_gpus_slurm_gave(world, slurm_job, live_server):
    """Where a person looks, the attempt Slurm runs shows Slurm's job and GPUs 5 and 7, not the
    portal's nominal 0 and 1."""
    browser = Client()
    browser.force_login(world.users["bob"])
    page = browser.get(f"/dash/jobs/{slurm_job.pk}/").content.decode()
    assert 'sn1: 5,7<br><span class="muted">as 4242</span>' in page
    shown = cli(live_server, world.tokens["bob"], "show", str(slurm_job.pk))
    assert shown.returncode == 0, shown.stderr
    assert "  on node sn1: GPUs 5,7\n  as 4242 of its cluster manager\n" in shown.stdout


def test_a_job_that_never_ran_or_ran_on_agents_shows_no_cluster_job(world, slurm):
    job, _ = job_submit(
        user=world.users["alice"], share_name="research", gpu_type="h100", gpus=1, command="x"
    )
    assert world.client("alice").get(f"/api/v1/jobs/{job.pk}/").json()["cluster_job"] == {}
    JobAttempt.objects.create(job=job, number=1, allocations=[], started_at=timezone.now())
    data = world.client("alice").get(f"/api/v1/jobs/{job.pk}/").json()
    assert (data["cluster_job"], data["attempts"][0]["cluster_job"]) == ({}, {})


def test_the_cluster_fields_match_the_api_schema(world, slurm_job):
    """The nodes list and the describe of a job that ran on an agent and then in Slurm are
    what the OpenAPI schema says they are (a connector's name or null; {} or Slurm's job)."""
    headers = {"Authorization": f"Token {world.tokens['bob']}"}
    checks = [response_schema_conformance]
    schema["/api/v1/nodes/"]["GET"].Case().call_and_validate(headers=headers, checks=checks)
    describe = schema["/api/v1/jobs/{job_id}/"]["GET"]
    case = describe.Case(path_parameters={"job_id": slurm_job.pk})
    response = case.call_and_validate(headers=headers, checks=checks)
    assert response.json()["cluster_job"] == SLURM_JOB
