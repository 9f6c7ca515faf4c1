"""The snapshot the cycle keeps between cycles (scheduler.cycle.snapshot.SnapshotCache): after a
change made by any write path, the next cycle's snapshot, brought up to date from the database's
change feed, is exactly what reading everything gives; whenever it cannot prove itself current
it reads everything."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from scheduler.cycle import apply as cycle_apply_module
from scheduler.cycle import snapshot as snapshot_module
from scheduler.cycle.run import cycle_run
from scheduler.cycle.snapshot import STATE_TABLE, SnapshotCache, cycle_snapshot, snapshot_cache
from scheduler.jobs.services import job_cancel, job_set_priority, job_submit
from scheduler.models import Job, JobAttempt, Node
from scheduler.nodes.attempts import END_EXIT, attempt_exited, attempt_log, attempts_start
from scheduler.nodes.services import node_set_state
from shares.models import CapacityLimit, QuotaShare, ShareChange
from shares.services import share_update
from tests.conftest import make_node

pytestmark = pytest.mark.django_db


def submit(user, share: str, gpus: int, **fields) -> Job:
    job, _ = job_submit(
        user=user, share_name=share, gpu_type="h100", gpus=gpus, command="true", **fields
    )
    return job


def attempt_of(job: Job) -> JobAttempt:
    return JobAttempt.objects.filter(job=job).order_by("-number").first()


def node_of(job: Job) -> Node:
    return Node.objects.get(name=attempt_of(job).allocations[0]["node"])


def kept_snapshot(cache: SnapshotCache = snapshot_cache) -> str:
    """Load the kept snapshot as a cycle does (by default this worker process's); check it is
    what reading everything gives, and that the reasons it compares the plan's with are the
    database's. Returns how it loaded."""
    snapshot, context = cache.load()
    full, full_context = cycle_snapshot()
    assert replace(snapshot, now=None) == replace(full, now=None)  # read a moment apart
    assert context.reasons == full_context.reasons
    assert snapshot.shares == shares_read_with_the_orm()
    return cache.last_load


def shares_read_with_the_orm() -> tuple:
    return tuple(
        share.engine_view() for share in QuotaShare.objects.prefetch_related("capacity_limits")
    )


@pytest.fixture
def cluster(world):
    """Two 8-GPU nodes; alice's `running` job runs on one, `scheduled` waits for its agent on
    the other, `waiting` finds no room; the kept snapshot is current."""
    make_node("node-0")
    make_node("node-1")
    running = submit(world.alice, "research", 8)
    scheduled = submit(world.alice, "research", 8)
    waiting = submit(world.alice, "research", 8)
    assert cycle_run(force=True).placed == 2
    attempts_start(node=node_of(running), attempt_ids={attempt_of(running).pk})
    kept_snapshot()
    return {"running": running, "scheduled": scheduled, "waiting": waiting}


def _submit(world, jobs):
    submit(world.bob, "research", 2, priority=7)


def _cancel_waiting(world, jobs):
    job_cancel(job=jobs["waiting"], user=world.alice)


def _cancel_running(world, jobs):
    job_cancel(job=jobs["running"], user=world.alice)


def _priority_of_waiting(world, jobs):
    job_set_priority(job=jobs["waiting"], priority=9)


def _priority_of_running(world, jobs):
    job_set_priority(job=jobs["running"], priority=9)


def _agent_starts(world, jobs):
    job = jobs["scheduled"]
    attempts_start(node=node_of(job), attempt_ids={attempt_of(job).pk})


def _agent_reports_exit(world, jobs):
    job = jobs["running"]
    attempt_exited(node=node_of(job), attempt_id=attempt_of(job).pk, end=END_EXIT, exit_code=0)


def _agent_reports_log(world, jobs):
    job = jobs["running"]
    attempt_log(node=node_of(job), attempt_id=attempt_of(job).pk, log_tail="epoch 3")


def _node_drained(world, jobs):
    node_set_state(node=node_of(jobs["running"]), state=Node.State.DRAINING)


def _share_limit_lowered(world, jobs):
    share_update(
        share=world.shares["research"], actor=world.root, source=ShareChange.Source.ADMIN,
        capacity_limits={"h100": 4},
    )  # fmt: skip


def _share_limit_edited_in_a_shell(world, jobs):
    CapacityLimit.objects.filter(share=world.shares["research"]).update(max_gpus=2)


def _share_lend_limit_edited_in_a_shell(world, jobs):
    CapacityLimit.objects.filter(share=world.shares["vision"]).update(lend_limit=1)


def _share_renamed(world, jobs):
    share = world.shares["research"]
    share.name = "research-renamed"
    share.save()


def _reason_edited_in_a_shell(world, jobs):
    Job.objects.filter(pk=jobs["waiting"].pk).update(reason="edited in a shell")


def _preemptible_edited_in_a_shell(world, jobs):
    Job.objects.filter(pk=jobs["running"].pk).update(preemptible=False)


def _job_deleted(world, jobs):
    Job.objects.filter(pk=jobs["waiting"].pk).delete()


def _attempt_edited_in_a_shell(world, jobs):
    JobAttempt.objects.filter(job=jobs["running"]).update(stop_requested_at=timezone.now())


def _placing_cycle(world, jobs):
    _agent_reports_exit(world, jobs)
    assert cycle_run(force=True).placed == 1


def _reclaiming_cycle(world, jobs):
    submit(world.carol, "vision", 8)
    assert cycle_run(force=True).preempted == 1


def _node_lost(world, jobs):
    Node.objects.filter(pk=node_of(jobs["running"]).pk).update(
        last_heartbeat=timezone.now() - timedelta(hours=1)
    )
    assert cycle_run(force=True).attempts_lost == 1


WRITE_PATHS = [
    _submit, _cancel_waiting, _cancel_running, _priority_of_waiting, _priority_of_running,
    _agent_starts, _agent_reports_exit, _agent_reports_log, _node_drained, _share_limit_lowered,
    _share_limit_edited_in_a_shell, _share_lend_limit_edited_in_a_shell,
    _reason_edited_in_a_shell, _preemptible_edited_in_a_shell, _job_deleted,
    _attempt_edited_in_a_shell, _placing_cycle, _reclaiming_cycle, _node_lost,
]  # fmt: skip


@pytest.mark.parametrize("write", WRITE_PATHS, ids=lambda write: write.__name__.strip("_"))
def test_a_change_by_any_write_path_is_in_the_next_cycles_snapshot(world, cluster, write):
    """Whatever wrote it (a service, an agent's report, the cycle itself, the ORM in a shell),
    a change between two cycles is in the next cycle's snapshot, read from the change feed
    alone, and that snapshot equals reading everything."""
    write(world, cluster)
    assert kept_snapshot() == "changes"


def test_a_renamed_share_makes_the_next_cycle_read_everything(world, cluster):
    """The kept jobs carry their share's name: a renamed share means reading everything."""
    _share_renamed(world, cluster)
    assert kept_snapshot() == "full"


def test_the_cycles_own_reasons_are_kept_and_written(world, cluster):
    """The reasons a cycle writes are those the next cycle compares with, and the database's:
    a second cycle with nothing new writes none."""
    submit(world.bob, "research", 8)
    assert cycle_run(force=True).reasons_updated == 1  # the new job's
    assert kept_snapshot() == "changes"
    assert cycle_run(force=True).reasons_updated == 0
    waiting = Job.objects.filter(state=Job.State.RUNNABLE)
    assert all(job.reason == snapshot_cache.jobs.reasons[str(job.pk)] for job in waiting)


def test_a_load_the_history_does_not_link_to_makes_the_next_cycle_read_everything(world, cluster):
    """Another token in the feed's state that no load of the history left: changes this copy
    never saw were consumed, and which is not known: the next cycle reads everything."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {STATE_TABLE} SET token = %s", ["another worker"])
    assert kept_snapshot() == "full"
    assert kept_snapshot() == "changes"


def test_a_lost_feed_state_makes_the_next_cycle_read_everything(world, cluster):
    """No token (a new database, a TRUNCATE of the jobs, which clears it): read everything."""
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {STATE_TABLE}")
    assert kept_snapshot() == "full"


def test_a_failed_cycle_makes_the_next_one_read_everything(world, cluster, monkeypatch):
    """After a cycle that failed (rolled back), the kept copy proves nothing: the next cycle
    reads everything, and plans what reading everything gives."""

    def broken(*args, **kwargs):
        raise RuntimeError("the database went away")

    submit(world.bob, "research", 2)
    monkeypatch.setattr(cycle_apply_module, "_apply_waiting", broken)
    with pytest.raises(RuntimeError):
        cycle_run(force=True)
    monkeypatch.undo()
    assert snapshot_cache.token is None
    assert kept_snapshot() == "full"


def test_a_missing_trigger_makes_every_cycle_read_everything(world, cluster):
    """Without every trigger of the feed, changes may go unrecorded: read everything."""
    name = "job_snapshot_update"
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"DROP TRIGGER {name} ON {Job._meta.db_table}")
        else:
            cursor.execute(f"DROP TRIGGER {name}")
    assert kept_snapshot() == "full"
    assert kept_snapshot() == "full"


def test_the_same_nodes_give_the_same_views_and_a_change_of_a_node_new_ones(world):
    """The engine keeps what it derives from the tuple of nodes it saw last: while no node
    changes, every snapshot hands it that same tuple; a drained node is seen at once."""
    make_node("node-0")
    make_node("node-1")
    first, _ = cycle_snapshot()
    again, _ = cycle_snapshot()
    assert again.nodes is first.nodes
    node_set_state(node=Node.objects.get(name="node-1"), state=Node.State.DRAINING)
    drained, _ = cycle_snapshot()
    assert [node.state for node in drained.nodes] == [Node.State.READY, Node.State.DRAINING]


def test_the_same_shares_give_the_same_views_and_a_changed_limit_new_ones(world):
    """While no share changes, the cycle does not make their views again; a limit changed
    anywhere (here in a shell, which leaves the share's own row as it was) is seen at once."""
    first, _ = cycle_snapshot()
    again, _ = cycle_snapshot()
    assert again.shares is first.shares
    CapacityLimit.objects.filter(share=world.shares["vision"]).update(max_gpus=3)
    changed, _ = cycle_snapshot()
    assert {share.name: share.capacity_limits for share in changed.shares}["vision"] == {"h100": 3}
    assert changed.shares == shares_read_with_the_orm()


def test_the_worker_processes_take_turns_and_read_only_what_changed(world, cluster):
    """The worker's processes take the cycles in turn: each brings its copy up to date from
    the history of the other's loads (the jobs they read from the feed, and those whose
    reasons their cycles wrote without recording them) instead of reading everything."""
    other = SnapshotCache()  # the other process's copy
    assert kept_snapshot(other) == "full"  # its first cycle
    submit(world.bob, "research", 8)  # no room: it waits
    assert kept_snapshot(other) == "changes"  # the other process reads it from the feed
    assert cycle_run(force=True).reasons_updated == 1  # this one writes why it waits
    assert snapshot_cache.last_load == "changes"
    assert kept_snapshot(other) == "changes"  # with that reason, as the database has it
    assert kept_snapshot() == "changes"


def test_a_copy_older_than_the_history_reads_everything(world, cluster, monkeypatch):
    monkeypatch.setattr(snapshot_module, "HISTORY_KEEP", 2)
    other = SnapshotCache()
    assert kept_snapshot(other) == "full"
    for _ in range(3):
        submit(world.bob, "research", 2)
        assert kept_snapshot() == "changes"
    assert kept_snapshot(other) == "full"
