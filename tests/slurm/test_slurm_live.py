"""The portal on a real Slurm cluster (tests/slurm/conftest.py): the portal decides who runs
where and who is preempted, Slurm runs the jobs. Real processes throughout: the web server,
the Celery worker, the connector (`gpu-agent slurm`), slurmctld and four slurmd; the GPUs are
fake device files, the one stand-in (no GPU machine runs these tests)."""

from __future__ import annotations

import pytest

from scheduler.jobs.services import job_submit
from scheduler.models import Job, JobAttempt, Node
from tests.live import job_command, wait_for
from tests.reliability.invariants import check_invariants
from tests.slurm.conftest import NODES

pytestmark = [pytest.mark.live, pytest.mark.django_db(transaction=True)]


def submit(user, share: str, command: str, gpus: int = 8, **fields) -> Job:
    job, _ = job_submit(user=user, share_name=share, gpu_type="h100", gpus=gpus,
                        command=command, **fields)  # fmt: skip
    return job


def state(job: Job) -> str:
    return Job.objects.get(pk=job.pk).state


def wait_state(job: Job, *states: str, timeout: float = 60) -> Job:
    wait_for(lambda: state(job) in states, timeout=timeout, what=f"job {job.pk} {states}")
    return Job.objects.get(pk=job.pk)


def attempts(job: Job) -> list[JobAttempt]:
    return list(JobAttempt.objects.filter(job=job).order_by("number"))


def start(live, slurm, **env):
    system = live(**env)
    system.start_web()
    system.start_worker()
    system.start_connector(slurm.conf)
    wait_for(lambda: Node.objects.filter(name__in=NODES, state=Node.State.READY).count() == 4,
             timeout=60, what="the Slurm nodes registered")  # fmt: skip
    return system


def test_reclaim_on_slurm_borrower_checkpoints_and_resumes_as_a_new_slurm_job(world, live, slurm):
    """Borrowers fill the four Slurm nodes; the lender's job reclaims one: its borrower gets
    SIGTERM through Slurm, checkpoints, ends PREEMPTED, and comes back as a new Slurm job that
    resumes from its checkpoint. Every job SUCCEEDED; squeue named each job after its share."""
    system = start(live, slurm)
    borrowers = [submit(world.alice, "research", job_command(80, 0.1)) for _ in range(4)]
    for job in borrowers:
        wait_state(job, Job.State.RUNNING)
    wait_for(lambda: len(slurm.active()) == 4, what="four Slurm jobs")
    names = {j["name"] for j in slurm.active()}
    assert all(any(f"-research-job{job.pk}-" in name for name in names) for job in borrowers)
    wait_for(lambda: all(system.checkpoint_dir(j.pk).joinpath("checkpoint").exists()
                         for j in borrowers), what="borrowers checkpointing")  # fmt: skip
    owner = submit(world.carol, "vision", job_command(10, 0.1))
    wait_state(owner, Job.State.SUCCEEDED)
    (victim,) = [j for j in borrowers if JobAttempt.objects.filter(job=j, outcome="PREEMPTED")]
    assert system.checkpoint_dir(victim.pk).joinpath("sigterm-1").exists()
    for job in borrowers:
        wait_state(job, Job.State.SUCCEEDED, timeout=90)
    first, second = attempts(victim)
    assert first.outcome == JobAttempt.Outcome.PREEMPTED and first.preempted_for_id == owner.pk
    assert second.outcome == JobAttempt.Outcome.SUCCEEDED
    assert first.cluster_job["id"] != second.cluster_job["id"]
    resumed_from = int(system.checkpoint_dir(victim.pk).joinpath("attempt-2.start").read_text())
    assert resumed_from > 0
    check_invariants(accepted_job_ids=[j.pk for j in [*borrowers, owner]])


def test_a_gang_runs_as_one_slurm_job_on_two_nodes(world, live, slurm):
    """A job of 16 GPUs on 2 nodes is one Slurm job over two nodes, its command on each; the
    attempt records the GPU indices Slurm gave on each node."""
    system = start(live, slurm)
    # Each node's process leaves a file naming its node, with the GPUs it was given.
    command = 'echo "$CUDA_VISIBLE_DEVICES" > "on-$SLURMD_NODENAME"; sleep 2'
    job = submit(world.alice, "research", command, gpus=16, nodes=2)
    running = wait_for(lambda: [j for j in slurm.active() if j["state"] == "RUNNING"],
                       what="the gang's Slurm job running")  # fmt: skip
    (slurm_job,) = running
    assert slurm_job["nodes"] in ("node[1-2]", "node[2-3]", "node[3-4]", "node[1,3]")
    wait_state(job, Job.State.SUCCEEDED)
    (attempt,) = attempts(job)
    given = attempt.cluster_job["allocations"]
    assert sorted(a["node"] for a in given) == sorted(a["node"] for a in attempt.allocations)
    assert all(len(a["gpu_indices"]) == 8 for a in given)
    assert attempt.cluster_job["id"] == slurm_job["id"]
    for allocation in given:
        seen = system.checkpoint_dir(job.pk).joinpath(f"on-{allocation['node']}").read_text()
        assert len(seen.strip().split(",")) == 8


def test_gpus_of_slurm_jobs_the_portal_did_not_submit_are_never_planned_on(world, live, slurm):
    """A job someone submitted to Slurm directly holds 6 GPUs of node1: the portal counts them
    as used outside the portal, places no 4-GPU job there while it runs, and uses them again
    once it has ended."""
    start(live, slurm)
    foreign = slurm.run("sbatch", "--parsable", "-J", "someone-else", "-p", "gpu",
                        "--nodelist=node1", "--gres=gpu:6", "-o", "/dev/null",
                        "--wrap", "sleep 300").strip()  # fmt: skip
    wait_for(lambda: Node.objects.get(name="node1").outside_gpus == 6,
             what="node1's GPUs used outside the portal")  # fmt: skip
    jobs = [submit(world.alice, "research", job_command(40, 0.1), gpus=4) for _ in range(8)]
    wait_for(lambda: Job.objects.filter(pk__in=[j.pk for j in jobs],
                                        state=Job.State.RUNNING).count() == 6,
             what="six jobs running")  # fmt: skip
    placed_on = {a["node"] for a in JobAttempt.objects.values_list("allocations", flat=True)
                 for a in a}  # fmt: skip
    assert "node1" not in placed_on
    assert Job.objects.filter(pk__in=[j.pk for j in jobs], state=Job.State.RUNNABLE).count() == 2
    slurm.run("scancel", foreign)
    for job in jobs:
        wait_state(job, Job.State.SUCCEEDED, timeout=90)
    assert not JobAttempt.objects.exclude(outcome=JobAttempt.Outcome.SUCCEEDED).exists()
    check_invariants(accepted_job_ids=[j.pk for j in jobs])


def test_a_slurm_node_set_down_requeues_its_job_elsewhere(world, live, slurm):
    """An operator sets a node down in Slurm: its Slurm job ends, the attempt is NODE_LOST, the
    job resumes from its checkpoint on another node; the portal shows the node DOWN with
    Slurm's reason."""
    system = start(live, slurm)
    job = submit(world.alice, "research", job_command(60, 0.1))
    wait_state(job, Job.State.RUNNING)
    wait_for(lambda: system.checkpoint_dir(job.pk).joinpath("checkpoint").exists(),
             what="a checkpoint")  # fmt: skip
    (node,) = [a["node"] for a in attempts(job)[0].allocations]
    slurm.run("scontrol", "update", f"nodename={node}", "state=down", "reason=broken-fan")
    wait_for(lambda: Node.objects.filter(name=node, state=Node.State.DOWN,
                                         state_reason__contains="broken-fan").exists(),
             what=f"{node} DOWN in the portal, with Slurm's reason")  # fmt: skip
    wait_state(job, Job.State.SUCCEEDED, timeout=90)
    first, second = attempts(job)
    assert first.outcome == JobAttempt.Outcome.NODE_LOST
    assert second.outcome == JobAttempt.Outcome.SUCCEEDED
    assert node not in {a["node"] for a in second.allocations}


def test_a_job_slurm_keeps_pending_is_withdrawn_and_requeued(world, live, slurm):
    """Slurm will not start the portal's job (its partition is down, though its nodes are
    idle): after the pending timeout the connector withdraws it and the portal requeues it,
    with Slurm's reason; once Slurm runs jobs again it runs and succeeds."""
    start(live, slurm, CONNECTOR_PENDING_TIMEOUT="3")
    slurm.run("scontrol", "update", "partitionname=gpu", "state=down")
    try:
        job = submit(world.alice, "research", job_command(5, 0.1))
        wait_for(lambda: JobAttempt.objects.filter(job=job, outcome="WITHDRAWN").exists(),
                 timeout=60, what="a withdrawn attempt")  # fmt: skip
    finally:
        slurm.run("scontrol", "update", "partitionname=gpu", "state=up")
    job = wait_state(job, Job.State.SUCCEEDED, timeout=90)
    assert (job.failure_count, job.preemption_count) == (0, 0)
    reasons = list(job.events.values_list("reason", flat=True))
    assert any("withdrawn and requeued" in r and "PartitionDown" in r for r in reasons), reasons


@pytest.mark.slow
def test_slurmctld_stopped_and_restarted_mid_run_loses_nothing(world, live, slurm):
    """slurmctld stops while the portal's jobs run on Slurm: the connector stops its heartbeats,
    the portal marks the nodes DOWN after its timeout and requeues the attempts. When slurmctld
    is back, what Slurm still runs is reconciled with what the portal believes: the old attempts
    are cancelled, their GPUs counted outside the portal's until free, the jobs run again and
    all succeed; no GPU is ever held twice (the reliability suite's invariants)."""
    start(live, slurm, NODE_HEARTBEAT_TIMEOUT_SECONDS="6")
    jobs = [submit(world.alice, "research", job_command(60, 0.2)) for _ in range(3)]
    wait_for(lambda: len([j for j in slurm.active() if j["state"] == "RUNNING"]) == 3,
             what="three Slurm jobs running")  # fmt: skip
    slurm.script("stop-controller")
    try:
        wait_for(lambda: Node.objects.filter(state=Node.State.DOWN).count() == 4, timeout=60,
                 what="the Slurm nodes DOWN")  # fmt: skip
        check_invariants(accepted_job_ids=[j.pk for j in jobs])
        assert JobAttempt.objects.filter(outcome=JobAttempt.Outcome.NODE_LOST).count() == 3
    finally:
        slurm.script("start-controller")
    for job in jobs:
        wait_state(job, Job.State.SUCCEEDED, timeout=120)
        check_invariants(accepted_job_ids=[j.pk for j in jobs])
    for job in jobs:
        assert [a.outcome for a in attempts(job)][-1] == JobAttempt.Outcome.SUCCEEDED


def test_one_pool_over_agent_and_slurm_nodes_lends_and_reclaims_across_both(world, live, slurm):
    """An agent node and the Slurm nodes make one h100 pool: borrowers run on both, and the
    lender's job reclaims what it needs from whichever borrowers the rules pick."""
    system = start(live, slurm)
    system.start_agent("agent-node")
    wait_for(lambda: Node.objects.filter(state=Node.State.READY).count() == 5,
             what="five nodes")  # fmt: skip
    borrowers = [submit(world.alice, "research", job_command(80, 0.1)) for _ in range(5)]
    for job in borrowers:
        wait_state(job, Job.State.RUNNING)
    nodes = {a["node"] for job in borrowers for a in attempts(job)[0].allocations}
    assert nodes == {*NODES, "agent-node"}
    owner = submit(world.carol, "vision", job_command(5, 0.1), gpus=8)
    wait_state(owner, Job.State.SUCCEEDED)
    assert JobAttempt.objects.filter(outcome="PREEMPTED", preempted_for=owner).count() == 1
    for job in borrowers:
        wait_state(job, Job.State.SUCCEEDED, timeout=120)
    check_invariants(accepted_job_ids=[j.pk for j in [*borrowers, owner]])


def test_a_restarted_connector_adopts_the_jobs_slurm_runs(world, live, slurm):
    """The connector dies (SIGKILL) while its jobs run on Slurm, and one of them ends meanwhile;
    the connector started again finds them in Slurm by name: the running ones go on, the
    ended one is reported with its exit code, and no job is run twice."""
    system = start(live, slurm)
    short = submit(world.alice, "research", job_command(10, 0.1))
    long = submit(world.alice, "research", job_command(60, 0.1))
    wait_for(lambda: len([j for j in slurm.active() if j["state"] == "RUNNING"]) == 2,
             what="two Slurm jobs running")  # fmt: skip
    system.kill_agent("slurm")
    wait_for(lambda: len(slurm.active()) == 1, what="the short job ended in Slurm")
    system.start_connector(slurm.conf)
    wait_state(short, Job.State.SUCCEEDED)
    wait_state(long, Job.State.SUCCEEDED)
    assert [a.outcome for a in attempts(short)] == [JobAttempt.Outcome.SUCCEEDED]
    assert [a.outcome for a in attempts(long)] == [JobAttempt.Outcome.SUCCEEDED]


def test_a_job_that_ended_and_was_purged_while_its_connector_was_away_keeps_its_outcome(
    world, live, slurm
):
    """The connector is away while its job ends and Slurm forgets it (MinJobAge 2 s here): the
    connector started again reads the job's end from Slurm's job-completion log (this cluster
    has no accounting), by the Slurm job id the portal recorded; the job SUCCEEDED, once."""
    slurm.env = {**slurm.env, "SLURM_MIN_JOB_AGE": "2"}
    slurm.script("start")
    try:
        system = start(live, slurm, NODE_HEARTBEAT_TIMEOUT_SECONDS="300")
        job = submit(world.alice, "research", job_command(10, 0.1))
        wait_for(lambda: attempts(job) and attempts(job)[0].cluster_job.get("id"),
                 what="the Slurm job recorded")  # fmt: skip
        system.kill_agent("slurm")
        slurm_id = attempts(job)[0].cluster_job["id"]
        wait_for(lambda: all(j["id"] != slurm_id for j in slurm.jobs()), timeout=180,
                 what=f"Slurm purging job {slurm_id}")  # fmt: skip
        system.start_connector(slurm.conf)
        wait_state(job, Job.State.SUCCEEDED)
        assert [a.outcome for a in attempts(job)] == [JobAttempt.Outcome.SUCCEEDED]
    finally:
        slurm.env = {k: v for k, v in slurm.env.items() if k != "SLURM_MIN_JOB_AGE"}
