"""The portal on a real Kubernetes control plane (tests/kubernetes/conftest.py): the portal
decides who runs where and who is preempted, the kubelets run the jobs as pods. Real processes
throughout: the web server, the Celery worker, the connector (`gpu-agent kubernetes`, with the
least rights of deploy/kubernetes/connector-rbac.yaml), etcd, kube-apiserver, the
controller-manager, the scheduler, and the real kubelet `kube1` running real containers
(busybox) through containerd. The GPUs are fake (a device plugin; no GPU machine runs these
tests), and nodes beyond kube1 are simulated kubelets, each said where it is used."""

from __future__ import annotations

import json

import pytest

from scheduler.jobs.services import job_submit
from scheduler.models import Job, JobAttempt, Node
from scheduler.nodes.connectors import NOT_IN_CLUSTER
from shares.services import share_update
from tests.kubernetes.conftest import (
    JOB_IMAGE,
    NAMESPACE,
    OTHER_NAMESPACE,
    REAL_NODE,
    control,
    start_simulated_kubelets,
)
from tests.live import stop, wait_for
from tests.reliability.invariants import check_invariants
from tests.slurm.conftest import NODES as SLURM_NODES

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def shell_job(steps: int, step_seconds: float = 0.1) -> str:
    """A job for a busybox container (and the host's sh on a simulated node): it counts
    `steps` steps in its CHECKPOINT_DIR (its working directory), saving its count after each
    (its checkpoint), resumes from the saved count, notes each attempt's start and SIGTERM, and
    the GPUs it was given."""
    return (
        'n=$(cat step 2>/dev/null || echo 0); echo "$n" > "attempt-$ATTEMPT.start"; '
        'echo "$CUDA_VISIBLE_DEVICES" >> gpus; '
        "trap 'touch sigterm-$ATTEMPT; exit 143' TERM; "
        f'while [ "$n" -lt {steps} ]; do sleep {step_seconds} & wait $!; '
        'n=$((n+1)); echo "$n" > step; done; touch done'
    )


def submit(user, share: str, command: str, gpus: int = 8, **fields) -> Job:
    job, _ = job_submit(
        user=user, share_name=share, gpu_type="h100", gpus=gpus, command=command, **fields
    )
    return job


def state(job: Job) -> str:
    return Job.objects.get(pk=job.pk).state


def wait_state(job: Job, *states: str, timeout: float = 90) -> Job:
    wait_for(lambda: state(job) in states, timeout=timeout, what=f"job {job.pk} {states}")
    return Job.objects.get(pk=job.pk)


def attempts(job: Job) -> list[JobAttempt]:
    return list(JobAttempt.objects.filter(job=job).order_by("number"))


def nodes_of(job: Job) -> set[str]:
    return {a["node"] for attempt in attempts(job) for a in attempt.allocations}


def start(live, kube, *simulated: str, **env):
    """The web server, the worker and the connector; kube1 and `simulated` nodes READY."""
    system = live(**env)
    system.start_web()
    system.start_worker()
    if simulated:
        start_simulated_kubelets(system, kube, *simulated)
    system.start_kubernetes_connector(kube.connector_kubeconfig, image=JOB_IMAGE)
    names = {REAL_NODE, *simulated}
    wait_for(
        lambda: Node.objects.filter(name__in=names, state=Node.State.READY).count() == len(names),
        timeout=90,
        what=f"{sorted(names)} registered",
    )
    return system


def test_reclaim_on_the_real_kubelet_sigterms_the_borrower_which_resumes_as_a_new_pod(
    world, live, kube
):
    """The borrower's 8-GPU job fills kube1, a real kubelet; the lender's job reclaims it: the
    kubelet SIGTERMs the borrower's container (the pod deleted with the share's grace), the
    attempt ends PREEMPTED as soon as the container has terminated, and the job comes back as
    a new pod that resumes from its checkpoint. Each container saw the device plugin's 8
    GPUs. The share's 2 s grace: the container stopped by itself, well before SIGKILL."""
    share_update(
        share=world.shares["research"],
        actor=None,
        source="api",
        capacity_limits={"h100": 4, "l4": 2},
    )
    system = start(live, kube)
    borrower = submit(world.alice, "research", shell_job(150))
    wait_state(borrower, Job.State.RUNNING)
    checkpoints = system.checkpoint_dir(borrower.pk)
    wait_for(lambda: checkpoints.joinpath("step").exists(), what="the borrower's checkpoints")
    # The kubelet reports a container running up to a second after it starts; the reclaim
    # comes once the connector has seen it run (stopped before that, the attempt would be
    # withdrawn: tests/nodes/test_connector_api.py).
    wait_for(lambda: attempts(borrower)[0].cluster_job.get("id"), what="the borrower's start")
    (first_pod,) = kube.pods()
    assert first_pod["spec"]["nodeName"] == REAL_NODE
    assert first_pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert first_pod["spec"]["containers"][0]["image"] == JOB_IMAGE
    owner = submit(world.carol, "vision", shell_job(5))
    wait_state(owner, Job.State.SUCCEEDED)
    borrower = wait_state(borrower, Job.State.SUCCEEDED, timeout=120)
    first, second = attempts(borrower)
    assert first.outcome == JobAttempt.Outcome.PREEMPTED and first.preempted_for_id == owner.pk
    assert checkpoints.joinpath("sigterm-1").exists()  # its trap ran: SIGTERM, not SIGKILL
    assert second.outcome == JobAttempt.Outcome.SUCCEEDED
    assert first.cluster_job["id"] != second.cluster_job["id"]
    assert first.cluster_job["id"] == f"{NAMESPACE}/{first_pod['metadata']['name']}"
    assert int(checkpoints.joinpath("attempt-2.start").read_text()) > 0
    gpus = checkpoints.joinpath("gpus").read_text().split()
    assert len(gpus) == 2 and all(len(line.split(",")) == 8 for line in gpus)
    wait_for(lambda: not kube.pods(), what="the ended attempts' pods deleted")
    check_invariants(accepted_job_ids=[borrower.pk, owner.pk])


def test_a_gang_is_one_pod_on_each_of_its_nodes(world, live, kube):
    """A job of 16 GPUs on 2 nodes runs as two pods, one bound to kube1 (real) and one to a
    simulated node, each with 8 GPUs and the job's command; it succeeds once both have."""
    system = start(live, kube, "sim1")
    job = submit(world.alice, "research", shell_job(5), gpus=16, nodes=2)
    pods = wait_for(lambda: len(kube.pods()) == 2 and kube.pods(), what="the gang's two pods")
    assert sorted(p["spec"]["nodeName"] for p in pods) == [REAL_NODE, "sim1"]
    assert {p["metadata"]["name"][-2:] for p in pods} == {"-0", "-1"}
    job = wait_state(job, Job.State.SUCCEEDED)
    (attempt,) = attempts(job)
    assert nodes_of(job) == {REAL_NODE, "sim1"}
    assert attempt.cluster_job["id"] == f"{NAMESPACE}/{pods[0]['metadata']['name'][:-2]}"
    gpus = system.checkpoint_dir(job.pk).joinpath("gpus").read_text().split()
    assert len(gpus) == 2 and all(len(line.split(",")) == 8 for line in gpus)


@pytest.mark.slow  # jobs that run for tens of seconds: make test-slow
def test_a_gpu_pod_the_portal_did_not_create_is_never_planned_on(world, live, kube):
    """Someone's pod holds 6 of kube1's GPUs: the portal counts them as used outside it and
    places no 4-GPU job there while it runs; once it is gone, kube1 takes jobs again."""
    start(live, kube, "sim1")
    foreign = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "someone-elses", "namespace": OTHER_NAMESPACE},
        "spec": {
            "nodeName": REAL_NODE,
            "hostNetwork": True,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": JOB_IMAGE,
                    "command": ["sleep", "3600"],
                    "resources": {"limits": {"nvidia.com/gpu": "6"}},
                }
            ],
        },
    }
    kube.kubectl("apply", "-f", "-", stdin=json.dumps(foreign))
    wait_for(
        lambda: Node.objects.get(name=REAL_NODE).outside_gpus == 6,
        what="kube1's GPUs used outside the portal",
    )
    # The two that run on sim1 last 40 s: far longer than the foreign pod takes to go, so the
    # third starts on kube1 because kube1 is free again, not because sim1 freed first (with
    # 10 s jobs, a slow deletion under load let it start on sim1).
    jobs = [submit(world.alice, "research", shell_job(steps), gpus=4) for steps in (400, 400, 100)]
    wait_for(
        lambda: (
            Job.objects.filter(pk__in=[j.pk for j in jobs], state=Job.State.RUNNING).count() == 2
        ),
        what="two jobs running, on sim1",
    )
    assert all(nodes_of(j) <= {"sim1"} for j in jobs)
    waiting = Job.objects.get(pk__in=[j.pk for j in jobs], state=Job.State.RUNNABLE)
    kube.kubectl("delete", "pod", "someone-elses", "-n", OTHER_NAMESPACE, "--wait=false")
    wait_state(waiting, Job.State.RUNNING)
    assert nodes_of(waiting) == {REAL_NODE}
    for job in jobs:
        wait_state(job, Job.State.SUCCEEDED, timeout=120)
    check_invariants(accepted_job_ids=[j.pk for j in jobs])


def test_gpu_nodes_that_join_the_cluster_are_brought_to_the_portal_and_those_gone_go_down(
    world, live, kube
):
    """A GPU node that joins the cluster while the connector runs (a simulated one) becomes a
    portal node and takes jobs; once it is deleted from the cluster, the portal shows it
    DOWN, no longer a node of the cluster."""
    system = start(live, kube)
    start_simulated_kubelets(system, kube, "sim2", name="late")
    wait_for(lambda: Node.objects.filter(name="sim2", state=Node.State.READY).exists(),
             timeout=60, what="sim2 READY in the portal")  # fmt: skip
    jobs = [submit(world.alice, "research", shell_job(5)) for _ in range(2)]
    for job in jobs:
        wait_state(job, Job.State.SUCCEEDED)
    assert {n for job in jobs for n in nodes_of(job)} == {REAL_NODE, "sim2"}
    stop(system.agents.pop("late"))
    kube.kubectl("delete", "node", "sim2")
    wait_for(lambda: Node.objects.filter(name="sim2", state=Node.State.DOWN).exists(),
             timeout=60, what="sim2 DOWN in the portal")  # fmt: skip
    assert Node.objects.get(name="sim2").state_reason == NOT_IN_CLUSTER


@pytest.mark.slow  # jobs that run for tens of seconds: make test-slow
def test_a_cordoned_node_drains_and_a_node_gone_not_ready_loses_its_attempt(world, live, kube):
    """kubectl cordon makes kube1 DRAINING in the portal (no new job there) and uncordon READY
    again. When kube1's kubelet stops, the node goes NotReady: the portal shows it DOWN with
    Kubernetes' reason, the attempt there ends NODE_LOST, and the job resumes on another node
    (simulated) from its checkpoint. The kubelet back, kube1 is READY and the old pod gone."""
    system = start(live, kube, "sim1")
    kube.kubectl("cordon", REAL_NODE)
    wait_for(
        lambda: Node.objects.get(name=REAL_NODE).state == Node.State.DRAINING, what="kube1 DRAINING"
    )
    assert Node.objects.get(name=REAL_NODE).state_reason == "Kubernetes: cordoned"
    kube.kubectl("uncordon", REAL_NODE)
    wait_for(lambda: Node.objects.get(name=REAL_NODE).state == Node.State.READY, what="kube1 READY")
    control(system, "die sim1 keep-processes")  # only kube1 takes the job
    job = submit(world.alice, "research", shell_job(150))
    wait_state(job, Job.State.RUNNING)
    assert nodes_of(job) == {REAL_NODE}
    wait_for(lambda: system.checkpoint_dir(job.pk).joinpath("step").exists(), what="a checkpoint")
    control(system, "revive sim1")
    kube.script("stop-kubelet")
    try:
        wait_for(
            lambda: Node.objects.get(name=REAL_NODE).state == Node.State.DOWN,
            timeout=60,
            what="kube1 DOWN",
        )
        assert "NotReady" in Node.objects.get(name=REAL_NODE).state_reason
        job = wait_state(job, Job.State.SUCCEEDED, timeout=120)
    finally:
        kube.script("start-kubelet")
    first, second = attempts(job)
    assert first.outcome == JobAttempt.Outcome.NODE_LOST
    assert second.outcome == JobAttempt.Outcome.SUCCEEDED
    assert {a["node"] for a in second.allocations} == {"sim1"}
    assert int(system.checkpoint_dir(job.pk).joinpath("attempt-2.start").read_text()) > 0
    wait_for(
        lambda: Node.objects.get(name=REAL_NODE).state == Node.State.READY,
        timeout=60,
        what="kube1 READY again",
    )
    wait_for(lambda: not kube.pods(), timeout=60, what="the lost attempt's pod gone")
    check_invariants(accepted_job_ids=[job.pk])


def test_an_api_server_restart_mid_run_loses_nothing(world, live, kube):
    """kube-apiserver stops while the portal's pods run and starts again: the connector's
    watches resume (or list again), every job runs to its end in its first attempt, and no
    GPU is ever held twice."""
    system = start(live, kube, "sim1")
    jobs = [submit(world.alice, "research", shell_job(80)) for _ in range(2)]
    for job in jobs:
        wait_state(job, Job.State.RUNNING)
    log = system.tmp / "connector-k8s.log"
    kube.script("stop-apiserver")
    try:
        wait_for(lambda: "Kubernetes does not answer" in log.read_text(),
                 what="the connector to find the API server gone")  # fmt: skip
        check_invariants(accepted_job_ids=[j.pk for j in jobs])
    finally:
        kube.script("start-apiserver")
    wait_for(lambda: "Kubernetes answers again" in log.read_text(),
             what="the connector's watches back")  # fmt: skip
    for job in jobs:
        job = wait_state(job, Job.State.SUCCEEDED, timeout=120)
        assert [a.outcome for a in attempts(job)] == [JobAttempt.Outcome.SUCCEEDED]
    check_invariants(accepted_job_ids=[j.pk for j in jobs])


def test_pods_evicted_or_deleted_outside_the_portal_requeue_their_job(world, live, kube):
    """A kubelet's eviction (on a simulated node: the real kubelet evicts only under real
    pressure) and an operator's `kubectl delete pod` (on kube1: the kubelet SIGTERMs it, with
    its grace) each lose the attempt: the job runs again from its checkpoint, nothing counted
    against it (no failure, no preemption)."""
    system = start(live, kube, "sim1")
    control(system, "die sim1 keep-processes")  # the first job goes to kube1
    deleted = submit(world.alice, "research", shell_job(100))
    wait_state(deleted, Job.State.RUNNING)
    control(system, "revive sim1")
    control(system, "die sim1 keep-processes")
    evicted = submit(world.alice, "research", shell_job(100))
    wait_state(evicted, Job.State.RUNNABLE)
    control(system, "revive sim1")
    wait_state(evicted, Job.State.RUNNING)
    assert (nodes_of(deleted), nodes_of(evicted)) == ({REAL_NODE}, {"sim1"})
    for job in (deleted, evicted):
        wait_for(
            lambda job=job: system.checkpoint_dir(job.pk).joinpath("step").exists(),
            what="a checkpoint",
        )
    pods = {p["spec"]["nodeName"]: p["metadata"]["name"] for p in kube.pods()}
    kube.kubectl("delete", "pod", pods[REAL_NODE], "-n", NAMESPACE, "--wait=false")
    control(system, f"evict {NAMESPACE}/{pods['sim1']}")
    for job, why in ((deleted, "outside the portal"), (evicted, "evicted by the kubelet")):
        job = wait_state(job, Job.State.SUCCEEDED, timeout=120)
        first, second = attempts(job)[:2]
        assert first.outcome == JobAttempt.Outcome.NODE_LOST
        assert (job.failure_count, job.preemption_count) == (0, 0)
        assert int(system.checkpoint_dir(job.pk).joinpath("attempt-2.start").read_text()) > 0
        reasons = " ".join(job.events.values_list("reason", flat=True))
        assert why in reasons, reasons
    check_invariants(accepted_job_ids=[deleted.pk, evicted.pk])


def test_a_job_whose_image_cannot_be_pulled_fails_saying_so(world, live, kube):
    """A job naming an image no registry has: its pod never starts, and the job fails with
    the kubelet's reason (nothing can be pulled here, as on a cluster without that image)."""
    start(live, kube)
    job = submit(world.alice, "research", "true", image="registry.invalid/nope:1")
    job = wait_state(job, Job.State.FAILED)
    assert "registry.invalid/nope:1" in job.reason and "could not start" in job.reason


@pytest.mark.slow  # jobs that run for tens of seconds: make test-slow
def test_one_share_lends_on_agent_slurm_and_kubernetes_nodes_and_reclaims_from_each(
    world, live, kube, slurm
):
    """Three estates in one h100 pool: an agent node, a Slurm node (its three others drained in
    Slurm) and kube1. The borrower's three jobs run one on each; the lender's three jobs
    reclaim all of them: each borrower gets SIGTERM through its own estate (the agent, scancel,
    the kubelet), each resumes from its checkpoint, and every job succeeds."""
    share_update(
        share=world.shares["vision"], actor=None, source="api", capacity_limits={"h100": 24}
    )
    share_update(
        share=world.shares["research"],
        actor=None,
        source="api",
        capacity_limits={"h100": 1, "l4": 2},
    )
    for node in SLURM_NODES[1:]:
        slurm.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=not-in-test")
    system = start(live, kube)
    system.start_connector(slurm.conf)
    system.start_agent("agent-node")
    wait_for(
        lambda: Node.objects.filter(state=Node.State.READY).count() == 3,
        timeout=60,
        what="one READY node in each estate",
    )
    borrowers = [submit(world.alice, "research", shell_job(200)) for _ in range(3)]
    for job in borrowers:
        wait_state(job, Job.State.RUNNING)
    placed = {node for job in borrowers for node in nodes_of(job)}
    assert placed == {"agent-node", SLURM_NODES[0], REAL_NODE}
    for job in borrowers:
        wait_for(
            lambda job=job: system.checkpoint_dir(job.pk).joinpath("step").exists(),
            what="the borrowers' checkpoints",
        )
    owners = [submit(world.carol, "vision", shell_job(5)) for _ in range(3)]
    for job in owners:
        wait_state(job, Job.State.SUCCEEDED, timeout=120)
    for job in borrowers:
        job = wait_state(job, Job.State.SUCCEEDED, timeout=180)
        first = attempts(job)[0]
        assert first.outcome == JobAttempt.Outcome.PREEMPTED
        assert system.checkpoint_dir(job.pk).joinpath("sigterm-1").exists()
        assert int(system.checkpoint_dir(job.pk).joinpath("attempt-2.start").read_text()) > 0
    check_invariants(accepted_job_ids=[j.pk for j in [*borrowers, *owners]])
