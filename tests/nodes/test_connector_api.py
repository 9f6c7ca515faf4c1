"""The connector endpoints (`/api/v1/agent/connector/`) over HTTP with the real database: one
registration for a cluster's nodes, orders naming every node of a gang, reports applied on
each node of the attempt, GPUs held outside the portal never planned on, and a cluster heard
from again after its heartbeats stopped asked for its whole inventory."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone

from scheduler.cycle.housekeeping import HEARTBEAT_LOST
from scheduler.cycle.run import cycle_run
from scheduler.jobs.services import job_cancel, job_submit
from scheduler.models import ClusterSettings, Connector, Job, JobAttempt, Node
from scheduler.nodes.connectors import NOT_IN_CLUSTER

pytestmark = pytest.mark.django_db

JOIN = "the-join-token"


@pytest.fixture
def client_():
    ClusterSettings.objects.update_or_create(pk=1, defaults={"agent_join_token": JOIN})
    return Client()


def post(client, path, body, token=None, scheme="Connector"):
    headers = {"HTTP_AUTHORIZATION": f"{scheme} {token}"} if token else {}
    return client.post(
        f"/api/v1/agent/connector/{path}/", body, content_type="application/json", **headers
    )


def slurm_node(name, state="READY", gpus=8, outside=0, reason=""):
    return {"name": name, "gpu_type": "h100", "gpus": gpus, "state": state, "reason": reason,
            "outside_gpus": outside}  # fmt: skip


def register(client, nodes, name="hpc"):
    response = post(client, "register", {"join_token": JOIN, "name": name, "kind": "slurm",
                                         "nodes": nodes})  # fmt: skip
    assert response.status_code == 201, response.content
    return response.json()["token"]


def submit(world, gpus=8, nodes=1, user="alice", share="research"):
    job, _ = job_submit(user=world.users[user], share_name=share, gpu_type="h100", gpus=gpus,
                        nodes=nodes, command="python train.py")  # fmt: skip
    return job


def test_one_registration_brings_every_node_of_the_cluster(client_):
    """A connector registers its cluster's nodes at once, with the states its cluster manager
    gives them and the reason, each taken to start only what the portal grants (a connector
    asks before it submits); registering again without a node puts that node DOWN."""
    register(client_, [slurm_node("sn1"), slurm_node("sn2", "DRAINING", reason="Slurm: drained")])
    connector = Connector.objects.get(name="hpc")
    nodes = {n.name: n for n in Node.objects.filter(connector=connector)}
    assert all(node.asks_to_start for node in nodes.values())
    assert nodes["sn1"].state == Node.State.READY
    assert (nodes["sn2"].state, nodes["sn2"].state_reason) == ("DRAINING", "Slurm: drained")
    register(client_, [slurm_node("sn1")])
    node = Node.objects.get(name="sn2")
    assert (node.state, node.state_reason) == (Node.State.DOWN, NOT_IN_CLUSTER)


def test_a_node_of_an_agent_or_another_cluster_is_refused_by_name(client_):
    Node.objects.create(name="gpu-box", gpu_type="h100", gpus=8)
    response = post(client_, "register", {"join_token": JOIN, "name": "hpc", "kind": "slurm",
                                          "nodes": [slurm_node("gpu-box")]})  # fmt: skip
    assert response.status_code == 409
    assert "its own node agent" in response.json()["nodes[0].name"]
    register(client_, [slurm_node("sn1")], name="other")
    response = post(client_, "register", {"join_token": JOIN, "name": "hpc", "kind": "slurm",
                                          "nodes": [slurm_node("sn1")]})  # fmt: skip
    assert response.status_code == 409 and "cluster other" in response.json()["nodes[0].name"]


@pytest.mark.parametrize(
    ("nodes", "field"),
    [
        ([{**slurm_node("a"), "state": "idle"}], "nodes[0].state"),
        ([{**slurm_node("a"), "gpus": 0}], "nodes[0].gpus"),
        ([{**slurm_node("a"), "outside_gpus": 9}], "nodes[0].outside_gpus"),
        ([slurm_node("a"), slurm_node("a")], "nodes[1].name"),
        ("node1", "nodes"),
    ],
)
def test_bad_registrations_name_the_field(client_, nodes, field):
    response = post(client_, "register", {"join_token": JOIN, "name": "hpc", "kind": "slurm",
                                          "nodes": nodes})  # fmt: skip
    assert response.status_code in (400, 409)
    assert field in response.json(), response.json()


def test_wrong_join_token_and_node_tokens_are_refused(client_):
    response = post(client_, "register", {"join_token": "nope", "name": "hpc", "kind": "slurm",
                                          "nodes": []})  # fmt: skip
    assert response.status_code == 403
    token = register(client_, [slurm_node("sn1")])
    assert post(client_, "poll", {"wait": 0}, token, scheme="Node").status_code == 401
    assert post(client_, "poll", {"wait": 0}, "not-a-token").status_code == 401
    assert post(client_, "poll", {"wait": 0}, token).status_code == 200


def test_a_gang_is_one_order_naming_all_its_nodes_and_ends_with_one_report(client_, world):
    """A 2-node job on the cluster is one run order with both nodes; granting its start makes it
    RUNNING; one exit report releases both nodes' GPUs and ends the attempt."""
    token = register(client_, [slurm_node("sn1"), slurm_node("sn2")])
    job = submit(world, gpus=16, nodes=2)
    cycle_run(force=True)
    answer = post(client_, "poll", {"wait": 0}, token).json()
    (order,) = answer["run"]
    assert order["job"] == job.pk and order["share"] == "research"
    assert [n["node"] for n in order["nodes"]] == ["sn1", "sn2"]
    assert all(n["gpu_indices"] == list(range(8)) for n in order["nodes"])
    started = post(client_, "start", {"attempts": [order["attempt"]]}, token).json()
    assert started["start"] == [order["attempt"]]
    assert Job.objects.get(pk=job.pk).state == Job.State.RUNNING
    given = {"id": "4711", "allocations": [{"node": "sn1", "gpu_indices": [0, 1, 2, 3, 4, 5, 6,
                                                                           7]}]}  # fmt: skip
    report = {"events": [{"type": "started", "attempt": order["attempt"], "cluster_job": given},
                         {"type": "exited", "attempt": order["attempt"], "end": "exit",
                          "exit_code": 0}]}  # fmt: skip
    assert post(client_, "report", report, token).json()["results"] == ["ok", "ok"]
    attempt = JobAttempt.objects.get(pk=order["attempt"])
    assert attempt.outcome == JobAttempt.Outcome.SUCCEEDED
    assert attempt.cluster_job["id"] == "4711"
    assert not attempt.gpus.filter(released=False).exists()
    assert Job.objects.get(pk=job.pk).state == Job.State.SUCCEEDED
    # A replay changes nothing.
    assert post(client_, "report", report, token).json()["results"] == ["ignored", "ignored"]


def test_gpus_held_outside_the_portal_are_never_planned_on(client_, world):
    """A node whose GPUs Slurm's own jobs hold gets no job that needs them; when they are free
    again (the next report says so), it does."""
    token = register(client_, [slurm_node("sn1", outside=6)])
    job = submit(world, gpus=4)
    cycle_run(force=True)
    assert Job.objects.get(pk=job.pk).state == Job.State.RUNNABLE
    post(client_, "report", {"events": [], "nodes": [slurm_node("sn1", outside=0)]}, token)
    cycle_run(force=True)
    assert Job.objects.get(pk=job.pk).state == Job.State.SCHEDULED


def test_withdrawn_attempt_is_requeued_with_the_reason(client_, world):
    """An attempt Slurm would not start (something else took the GPUs) comes back RUNNABLE,
    with the reason; it counts as neither a failure nor a preemption."""
    token = register(client_, [slurm_node("sn1")])
    job = submit(world, gpus=8)
    cycle_run(force=True)
    (order,) = post(client_, "poll", {"wait": 0}, token).json()["run"]
    post(client_, "start", {"attempts": [order["attempt"]]}, token)
    event = {"type": "exited", "attempt": order["attempt"], "end": "withdrawn",
             "detail": "Slurm kept job 12 pending 60 s (Resources)"}  # fmt: skip
    assert post(client_, "report", {"events": [event]}, token).json()["results"] == ["ok"]
    job.refresh_from_db()
    assert job.state == Job.State.RUNNABLE
    assert (job.failure_count, job.preemption_count) == (0, 0)
    assert JobAttempt.objects.get(pk=order["attempt"]).outcome == JobAttempt.Outcome.WITHDRAWN
    assert "pending 60 s (Resources)" in job.events.order_by("-at", "-id").first().reason


def test_an_attempt_stopped_before_it_was_seen_to_start_keeps_its_cluster_job(client_, world):
    """A job cancelled while its cluster was still starting it: its exit (the connector never
    saw it start) says which cluster job it was, and the attempt keeps it, so an operator can
    find it in the cluster."""
    token = register(client_, [slurm_node("sn1")])
    job = submit(world, gpus=8)
    cycle_run(force=True)
    (order,) = post(client_, "poll", {"wait": 0}, token).json()["run"]
    post(client_, "start", {"attempts": [order["attempt"]]}, token)
    with transaction.atomic():
        job_cancel(job=job, user=world.users["alice"])
    pods = {"id": "gpu-portal/portal-research-job1-a1", "allocations": []}
    event = {"type": "exited", "attempt": order["attempt"], "end": "never_started",
             "cluster_job": pods}  # fmt: skip
    assert post(client_, "report", {"events": [event]}, token).json()["results"] == ["ok"]
    assert JobAttempt.objects.get(pk=order["attempt"]).cluster_job == pods
    event["cluster_job"] = {"id": "x", "allocations": [{"node": "sn1", "gpu_indices": [-1]}]}
    response = post(client_, "report", {"events": [event]}, token)
    assert response.status_code == 400
    assert "events[0].cluster_job" in response.json()
    assert Job.objects.get(pk=job.pk).state == Job.State.CANCELLED


def test_attempts_the_portal_no_longer_holds_are_orphan_stops(client_, world):
    """An attempt the connector says it runs but the portal has ended (e.g. as NODE_LOST while
    the cluster was cut off) is ordered stopped, marked orphan; a full poll brings back the
    run orders of the attempts the connector says it runs."""
    token = register(client_, [slurm_node("sn1")])
    job = submit(world, gpus=8)
    cycle_run(force=True)
    (order,) = post(client_, "poll", {"wait": 0}, token).json()["run"]
    post(client_, "start", {"attempts": [order["attempt"]]}, token)
    answer = post(client_, "poll", {"wait": 0, "running": [order["attempt"]], "full": True},
                  token).json()  # fmt: skip
    assert [o["attempt"] for o in answer["run"]] == [order["attempt"]]
    answer = post(client_, "poll", {"wait": 0, "running": [order["attempt"], 999]}, token).json()
    assert answer["run"] == []
    assert answer["stop"] == [{"attempt": 999, "grace_seconds": 0, "started": True,
                               "orphan": True}]  # fmt: skip
    assert Job.objects.get(pk=job.pk).state == Job.State.RUNNING


def test_a_cluster_heard_from_again_is_asked_for_every_node(client_, world):
    """After the heartbeat timeout the cycle marks the cluster's nodes DOWN; the connector's
    next poll is answered at once with resend_nodes, and the inventory it sends sets the
    nodes' states again."""
    token = register(client_, [slurm_node("sn1"), slurm_node("sn2")])
    silent = timezone.now() - timedelta(hours=1)
    Node.objects.filter(connector__name="hpc").update(last_heartbeat=silent)
    Connector.objects.update(last_heartbeat=silent)
    cycle_run(force=True)
    assert set(Node.objects.values_list("state_reason", flat=True)) == {HEARTBEAT_LOST}
    answer = post(client_, "poll", {"wait": 5}, token).json()
    assert answer["resend_nodes"] is True
    post(client_, "poll", {"wait": 0, "nodes": [slurm_node("sn1"), slurm_node("sn2", "DOWN",
                                                reason="Slurm: down*")]}, token)  # fmt: skip
    states = dict(Node.objects.values_list("name", "state"))
    assert states == {"sn1": Node.State.READY, "sn2": Node.State.DOWN}
    assert "resend_nodes" not in post(client_, "poll", {"wait": 0}, token).json()


def test_a_kubernetes_cluster_registers_and_its_orders_carry_the_jobs_image(client_, world):
    """A Kubernetes connector registers as one; a run order carries the image the job names
    (blank: the connector's default), which its pods run the command in, and the working
    directory it names (blank: its checkpoint directory)."""
    response = post(client_, "register", {"join_token": JOIN, "name": "k8s", "kind": "kubernetes",
                                          "nodes": [slurm_node("kube1")]})  # fmt: skip
    assert response.status_code == 201, response.content
    assert Connector.objects.get(name="k8s").kind == Connector.Kind.KUBERNETES
    token = response.json()["token"]
    image = "nvcr.io/nvidia/pytorch:24.01-py3"
    job, _ = job_submit(user=world.alice, share_name="research", gpu_type="h100", gpus=4,
                        command="python train.py", image=image,
                        working_dir="/workspace/trainer")  # fmt: skip
    plain = submit(world, gpus=4)
    cycle_run(force=True)
    orders = {o["job"]: o for o in post(client_, "poll", {"wait": 0}, token).json()["run"]}
    assert orders[job.pk]["image"] == image
    assert orders[plain.pk]["image"] == ""
    assert orders[job.pk]["working_dir"] == "/workspace/trainer"
    assert orders[plain.pk]["working_dir"] == ""
