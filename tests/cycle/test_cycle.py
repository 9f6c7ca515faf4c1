"""The scheduling cycle in process: one `cycle_run()` call is one cycle, no sleeping. Agents are
played by calling the node services they call over HTTP (attempt_started, attempt_exited), with
the real database and Redis; nothing is mocked."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduler import engine
from scheduler.cycle.apply import cycle_apply
from scheduler.cycle.idle import note_change
from scheduler.cycle.result import CycleResult
from scheduler.cycle.run import cycle_run
from scheduler.cycle.snapshot import cycle_snapshot
from scheduler.jobs.services import job_cancel, job_submit
from scheduler.models import GpuAssignment, Job, JobAttempt, Node
from scheduler.nodes.attempts import (
    END_EXIT,
    END_NEVER_STARTED,
    END_TIMEOUT,
    attempt_exited,
)
from scheduler.nodes.services import node_orders, node_set_state
from shares.services import share_update
from tests.conftest import make_node
from tests.conftest import start_latest_attempt as run

pytestmark = pytest.mark.django_db


def submit(user, share: str, gpus: int, nodes: int = 1, **fields) -> Job:
    job, _ = job_submit(
        user=user, share_name=share, gpu_type="h100", gpus=gpus, nodes=nodes, command="true",
        **fields,
    )  # fmt: skip
    return job


def reload(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def attempt_of(job: Job) -> JobAttempt:
    return JobAttempt.objects.filter(job=job).order_by("-number").first()


def exit_everywhere(job: Job, *, end: str = END_EXIT, exit_code: int | None = 0, signalled=False):
    attempt = attempt_of(job)
    for allocation in attempt.allocations:
        node = Node.objects.get(name=allocation["node"])
        attempt_exited(
            node=node, attempt_id=attempt.pk, end=end, exit_code=exit_code, signalled=signalled
        )


@pytest.fixture
def two_nodes(world):
    return make_node("node-0"), make_node("node-1")


def test_placement_creates_attempts_and_gpu_assignments(world, two_nodes):
    """A placed job gets attempt 1, one GpuAssignment per GPU, and goes SCHEDULED; when its
    agent, which has the order, starts it, STARTING then RUNNING."""
    job = submit(world.alice, "research", gpus=8, nodes=2)
    result = cycle_run(force=True)
    assert result.placed == 1
    job = reload(job)
    assert job.state == Job.State.SCHEDULED
    assert job.attempt_count == 1
    attempt = attempt_of(job)
    assert attempt.number == 1
    assert sorted(a["node"] for a in attempt.allocations) == ["node-0", "node-1"]
    held = GpuAssignment.objects.filter(attempt=attempt, released=False)
    assert held.count() == 8
    assert {a.node.name for a in held} == {"node-0", "node-1"}
    node_orders(node=two_nodes[0])
    assert reload(job).state == Job.State.SCHEDULED
    run(job)
    job = reload(job)
    assert job.state == Job.State.RUNNING
    assert job.started_at is not None
    assert [e.to_state for e in job.events.all()] == [
        "SUBMITTED", "RUNNABLE", "SCHEDULED", "STARTING", "RUNNING",
    ]  # fmt: skip


def test_reclaim_preempts_the_borrower_then_requeues_it(world, two_nodes):
    """A borrower fills both nodes; when the lender submits, the borrower on the lender's GPUs
    gets a stop order (PREEMPTING, stop_requested_at, preempted_for); when its agent confirms,
    its attempt ends PREEMPTED, it is RUNNABLE again (not a failure), and the owner runs."""
    borrowers = [submit(world.alice, "research", gpus=8) for _ in range(2)]
    cycle_run(force=True)
    for job in borrowers:
        run(job)
    owner = submit(world.carol, "vision", gpus=8)
    result = cycle_run(force=True)
    assert result.preempted == 1
    victim = next(j for j in map(reload, borrowers) if j.state == Job.State.PREEMPTING)
    attempt = attempt_of(victim)
    assert attempt.stop_requested_at is not None
    assert attempt.preempted_for_id == owner.pk
    assert reload(owner).state == Job.State.RUNNABLE
    assert "reclaim" in reload(owner).reason
    stop = node_orders(node=Node.objects.get(name=attempt.allocations[0]["node"])).stop
    assert stop == [{"attempt": attempt.pk, "grace_seconds": 2, "started": True}]

    assert cycle_run(force=True).preempted == 0  # the stop order is not repeated
    exit_everywhere(victim, exit_code=0, signalled=True)
    victim = reload(victim)
    assert victim.state == Job.State.RUNNABLE
    assert victim.preemption_count == 1
    assert victim.failure_count == 0
    assert attempt_of(victim).outcome == JobAttempt.Outcome.PREEMPTED
    assert not GpuAssignment.objects.filter(attempt=attempt, released=False).exists()
    # The requeued victim tells the engine whom it was stopped for, until that job is placed.
    claims = {j.id: j.preempted_for for j in cycle_snapshot()[0].runnable}
    assert claims == {str(victim.pk): str(owner.pk), str(owner.pk): None}
    cycle_run(force=True)
    assert reload(owner).state == Job.State.SCHEDULED
    assert all(j.preempted_for is None for j in cycle_snapshot()[0].runnable)


def one_node_research_limit_4(world) -> None:
    """One 8-GPU node; research's limit is 4 h100, so its 8-GPU jobs borrow 4."""
    Node.objects.filter(name="node-1").delete()
    share_update(share=world.research, actor=None, source="command", capacity_limits={"h100": 4})


def test_max_preemptions_requeues_n_times_then_fails(world, two_nodes):
    """max_preemptions=1: requeued after the first preemption, FAILED at the second."""
    one_node_research_limit_4(world)
    victim = submit(world.alice, "research", gpus=8, max_preemptions=1)
    for round_ in (1, 2):
        cycle_run(force=True)
        run(victim)
        owner = submit(world.carol, "vision", gpus=8)
        cycle_run(force=True)
        assert reload(victim).state == Job.State.PREEMPTING
        exit_everywhere(victim, exit_code=-15, signalled=True)
        if round_ == 1:
            assert reload(victim).state == Job.State.RUNNABLE
            cycle_run(force=True)
            run(owner)
            exit_everywhere(owner)  # the owner finishes; the borrower comes back
            assert reload(owner).state == Job.State.SUCCEEDED
    victim = reload(victim)
    assert victim.state == Job.State.FAILED
    assert victim.preemption_count == 2
    assert "max_preemptions is 1" in victim.reason
    outcomes = list(victim.attempts.values_list("outcome", flat=True))
    assert outcomes == ["PREEMPTED", "PREEMPTED"]


def test_node_lost_ends_attempts_and_requeues(world, two_nodes, settings):
    """A node silent for longer than NODE_HEARTBEAT_TIMEOUT_SECONDS goes DOWN; its attempt
    ends NODE_LOST with its GPUs released, and the job is placed again elsewhere."""
    settings.NODE_HEARTBEAT_TIMEOUT_SECONDS = 30
    job = submit(world.alice, "research", gpus=8)
    cycle_run(force=True)
    run(job)
    first = attempt_of(job)
    lost = Node.objects.get(name=first.allocations[0]["node"])
    Node.objects.filter(pk=lost.pk).update(last_heartbeat=timezone.now() - timedelta(minutes=5))
    result = cycle_run()
    assert result.nodes_lost == 1
    assert Node.objects.get(pk=lost.pk).state == Node.State.DOWN
    first.refresh_from_db()
    assert first.outcome == JobAttempt.Outcome.NODE_LOST
    assert first.ended_at is not None
    assert not GpuAssignment.objects.filter(attempt=first, released=False).exists()
    job = reload(job)
    assert job.state == Job.State.SCHEDULED
    second = attempt_of(job)
    assert second.number == 2
    assert second.allocations[0]["node"] != lost.name
    assert job.events.filter(to_state=Job.State.RUNNABLE, reason__contains="lost").exists()
    # The lost agent reports late: nothing changes.
    assert attempt_exited(node=lost, attempt_id=first.pk, end=END_EXIT, exit_code=0) == "ignored"
    assert reload(job).state == Job.State.SCHEDULED


def test_draining_node_keeps_its_jobs_and_gets_no_new_ones(world, two_nodes):
    """A DRAINING node's running job finishes normally; new jobs go elsewhere or wait."""
    job = submit(world.alice, "research", gpus=8)
    cycle_run(force=True)
    run(job)
    node = Node.objects.get(name=attempt_of(job).allocations[0]["node"])
    other = Node.objects.exclude(pk=node.pk).get()
    node_set_state(node=node, state=Node.State.DRAINING)
    node_set_state(node=other, state=Node.State.DRAINING)
    waiting = submit(world.alice, "research", gpus=8)
    cycle_run(force=True)
    assert reload(job).state == Job.State.RUNNING
    assert reload(waiting).state == Job.State.RUNNABLE
    exit_everywhere(job)
    assert reload(job).state == Job.State.SUCCEEDED
    cycle_run(force=True)
    assert reload(waiting).state == Job.State.RUNNABLE
    node_set_state(node=other, state=Node.State.READY)
    cycle_run(force=True)
    assert attempt_of(reload(waiting)).allocations[0]["node"] == other.name


def test_a_stale_plan_does_not_place_a_cancelled_job(world, two_nodes):
    """A job cancelled between the snapshot and the apply is not placed, and no GPU is held."""
    job = submit(world.alice, "research", gpus=4)
    snapshot, context = cycle_snapshot()
    plan = engine.plan(snapshot)
    assert [p.job_id for p in plan.placements] == [str(job.pk)]
    job_cancel(job=job, user=world.alice)
    result = CycleResult()
    cycle_apply(plan, context, result=result)
    assert result.placed == 0
    assert result.stale
    assert reload(job).state == Job.State.CANCELLED
    assert not JobAttempt.objects.filter(job=job).exists()
    assert not GpuAssignment.objects.exists()


def test_a_stale_plan_never_gives_a_held_gpu_twice(world, two_nodes):
    """Applying the same plan twice places its jobs once: the second apply finds them placed."""
    job = submit(world.alice, "research", gpus=8)
    snapshot, context = cycle_snapshot()
    plan = engine.plan(snapshot)
    cycle_apply(plan, context, result=CycleResult())
    other = submit(world.alice, "research", gpus=8)
    # A forged plan putting the other job on the GPUs the first one holds.
    forged = engine.Plan(
        placements=(
            engine.Placement(
                job_id=str(other.pk), allocations=plan.placements[0].allocations, borrowed=0
            ),
        )
    )
    result = CycleResult()
    cycle_apply(forged, context, result=result)
    assert result.placed == 0
    assert reload(other).state == Job.State.RUNNABLE
    assert GpuAssignment.objects.filter(released=False).count() == 8
    assert reload(job).state == Job.State.SCHEDULED


def test_cancel_of_a_running_job_stops_it_then_cancels(world, two_nodes):
    """Cancelling a running job gives a stop order; it ends CANCELLED when its node confirms."""
    job = submit(world.alice, "research", gpus=2)
    cycle_run(force=True)
    run(job)
    job_cancel(job=job, user=world.alice)
    cycle_run()
    attempt = attempt_of(job)
    assert attempt.stop_requested_at is not None
    node = Node.objects.get(name=attempt.allocations[0]["node"])
    stop = node_orders(node=node).stop
    assert stop == [{"attempt": attempt.pk, "grace_seconds": 2, "started": True}]
    exit_everywhere(job, exit_code=-15, signalled=True)
    job = reload(job)
    assert job.state == Job.State.CANCELLED
    assert attempt_of(job).outcome == JobAttempt.Outcome.CANCELLED


def test_failing_command_is_retried_then_fails(world, two_nodes):
    """retry_attempts=1: a failing command runs twice, then the job is FAILED."""
    job = submit(world.alice, "research", gpus=1, retry_attempts=1)
    for _ in range(2):
        cycle_run(force=True)
        run(job)
        exit_everywhere(job, exit_code=3)
    job = reload(job)
    assert job.state == Job.State.FAILED
    assert job.failure_count == 2
    assert list(job.attempts.values_list("outcome", "exit_code")) == [
        ("FAILED", 3), ("FAILED", 3),
    ]  # fmt: skip


def test_timeout_fails_the_job(world, two_nodes):
    """An attempt stopped at timeout_seconds ends TIMEOUT and the job FAILED (not retried)."""
    job = submit(world.alice, "research", gpus=1, timeout_seconds=5, retry_attempts=2)
    cycle_run(force=True)
    run(job)
    exit_everywhere(job, end=END_TIMEOUT, exit_code=-9, signalled=True)
    job = reload(job)
    assert job.state == Job.State.FAILED
    assert attempt_of(job).outcome == JobAttempt.Outcome.TIMEOUT


def test_preempted_before_start_ends_without_running(world, two_nodes):
    """A borrower preempted while still SCHEDULED: its agent reports it never started."""
    one_node_research_limit_4(world)
    victim = submit(world.alice, "research", gpus=8)
    cycle_run(force=True)
    owner = submit(world.carol, "vision", gpus=8)
    cycle_run(force=True)
    assert reload(victim).state == Job.State.PREEMPTING
    exit_everywhere(victim, end=END_NEVER_STARTED, exit_code=None)
    assert reload(victim).state == Job.State.RUNNABLE
    cycle_run(force=True)
    assert reload(owner).state == Job.State.SCHEDULED


def test_a_replayed_report_changes_nothing(world, two_nodes):
    """The same exit reported twice (an agent retrying) ends the attempt once."""
    job = submit(world.alice, "research", gpus=1, retry_attempts=3)
    cycle_run(force=True)
    run(job)
    exit_everywhere(job, exit_code=1)
    assert reload(job).failure_count == 1
    exit_everywhere(job, exit_code=1)
    assert reload(job).failure_count == 1
    assert reload(job).state == Job.State.RUNNABLE


def test_an_idle_cycle_is_skipped_and_reasons_are_written_once(world, two_nodes):
    """With nothing changed, a cycle skips the engine; a waiting job's reason is written once.
    After a cycle that placed jobs, the next one plans once more (it keeps no fingerprint of
    what it changed), changes nothing, and from then on cycles are skipped."""
    jobs = [submit(world.alice, "research", gpus=8) for _ in range(3)]
    first = cycle_run()
    assert first.placed == 2
    assert first.reasons_updated == 1
    waiting = next(j for j in map(reload, jobs) if j.state == Job.State.RUNNABLE)
    assert waiting.reason and "queued" not in waiting.reason
    second = cycle_run()
    assert not second.skipped and not second.changed and second.reasons_updated == 0
    assert cycle_run().skipped
    assert cycle_run(force=True).reasons_updated == 0


def test_a_cycle_asked_for_after_the_last_one_started_is_not_skipped(world, two_nodes):
    """A change committed while a cycle runs (after its snapshot) may already show in the
    fingerprint that cycle keeps, though its plan did not see it: the change's request for a
    cycle is counted, so the next cycle plans instead of skipping until the periodic one."""
    submit(world.alice, "research", gpus=8)
    cycle_run()
    cycle_run()  # after a cycle that placed a job, the next plans once more
    assert cycle_run().skipped
    note_change()  # what request_cycle does after a commit
    assert not cycle_run().skipped
    assert cycle_run().skipped


def test_a_cycle_asked_for_by_a_change_a_cycle_has_seen_does_nothing(
    world, two_nodes, django_capture_on_commit_callbacks
):
    """A request queued while a cycle ran is covered once a cycle that read the count of changes
    after it has committed: it returns at once. A change after that cycle's read is not."""
    submit(world.alice, "research", gpus=8)
    change = note_change().number  # what request_cycle does after the submit's commit
    with django_capture_on_commit_callbacks(execute=True):
        assert not cycle_run(after_change=change).covered  # no cycle has seen it yet
    assert cycle_run(after_change=change).covered
    submit(world.alice, "research", gpus=8)
    result = cycle_run(after_change=note_change().number)
    assert not result.covered and result.placed == 1


def test_rejected_job_fails_with_the_reason(world, two_nodes):
    """A job that can no longer fit any set of nodes is FAILED with the engine's reason."""
    job = submit(world.alice, "research", gpus=16, nodes=2)
    Node.objects.filter(name="node-1").delete()
    result = cycle_run(force=True)
    assert result.rejected == 1
    job = reload(job)
    assert job.state == Job.State.FAILED
    assert job.reason


def test_the_snapshot_tells_the_engine_which_jobs_borrow(world, two_nodes):
    """research (limit 8) runs two 8-GPU jobs: the second one's attempt records 8 borrowed GPUs,
    and the next snapshot hands that to the engine, which prefers such jobs as victims."""
    first, second = (
        submit(world.alice, "research", gpus=8),
        submit(world.alice, "research", gpus=8),
    )
    cycle_run(force=True)
    assert (attempt_of(first).borrowed_gpus, attempt_of(second).borrowed_gpus) == (0, 8)
    snapshot, _ = cycle_snapshot()
    assert {p.id: p.borrowed for p in snapshot.placed} == {str(first.pk): 0, str(second.pk): 8}


def test_gang_member_lost_requeues_the_job_instead_of_failing_it(world, two_nodes):
    """A 2-node gang: the agent on one node restarts and no longer has the process (lost); the
    other node is told to stop and its process exits from the SIGTERM. The attempt ends as
    NODE_LOST and the job is requeued, not FAILED for the signal's exit code."""
    from scheduler.nodes.attempts import END_LOST

    job = submit(world.alice, "research", gpus=8, nodes=2)
    cycle_run(force=True)
    run(job)
    attempt = attempt_of(job)
    lost_node, other = (Node.objects.get(name=a["node"]) for a in attempt.allocations)
    attempt_exited(node=lost_node, attempt_id=attempt.pk, end=END_LOST)
    assert JobAttempt.objects.get(pk=attempt.pk).stop_requested_at is not None
    attempt_exited(node=other, attempt_id=attempt.pk, end=END_EXIT, exit_code=-15,
                   signalled=True)  # fmt: skip
    attempt = JobAttempt.objects.get(pk=attempt.pk)
    assert attempt.outcome == JobAttempt.Outcome.NODE_LOST
    job = reload(job)
    assert job.state == Job.State.RUNNABLE
    assert job.failure_count == 0
