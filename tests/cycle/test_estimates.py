"""Estimated starts stored on the waiting jobs by the refresh the worker runs after cycles
(docs/estimates.md); the real database, one cycle per `cycle_run()`, agents played through the
node services."""

from __future__ import annotations

import gc
import os
import sys
import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import Client
from django.utils import timezone

from portal.priority import LOWER_BY
from scheduler.agent.protocol import END_EXIT
from scheduler.cycle.estimates import (
    BASIS_DEFAULT,
    BASIS_EXPECTED,
    BASIS_HISTORY,
    BASIS_TIMEOUT,
    History,
    estimates_refresh,
    expected_time,
)
from scheduler.cycle.run import cycle_run
from scheduler.jobs.services import job_estimate, job_submit
from scheduler.models import Job, JobAttempt, Node
from scheduler.nodes.attempts import attempt_exited
from shares.models import QuotaShare
from tests.conftest import make_node, place_a_borrower
from tests.conftest import start_latest_attempt as run

pytestmark = pytest.mark.django_db


def submit(user, share: str, gpus: int = 8, **fields) -> Job:
    job, _ = job_submit(
        user=user, share_name=share, gpu_type="h100", gpus=gpus, command="true", **fields
    )
    return job


def one_running_two_waiting(world, **third_fields) -> tuple[Node, Job, Job, Job]:
    """On one node of 8 h100, research's first job runs (expected 600 s) and two more wait
    behind it, the second expecting 300 s, the third with `third_fields`: (node, jobs)."""
    node = make_node("node-0")
    first = submit(world.alice, "research", expected_seconds=600)
    cycle_run(force=True)
    run(first)
    second = submit(world.alice, "research", expected_seconds=300)
    third = submit(world.alice, "research", **third_fields)
    cycle_run(force=True)
    return node, first, second, third


def test_each_waiting_job_gets_when_and_where_it_would_start(world):
    """One node of 8 h100, research's job runs (expected 600 s); two more wait behind it, one
    expecting 300 s, the other giving only a timeout: they start in 600 and 900 s, on the node,
    each saying what its estimate counts on."""
    _node, _first, second, third = one_running_two_waiting(world, timeout_seconds=7200)
    before = timezone.now()
    refresh = estimates_refresh()
    assert (refresh.runnable, refresh.estimated) == (2, 2)
    assert list(refresh.timings) == ["snapshot", "expected times", "replay", "write"]
    assert gc.isenabled()  # paused for the cycle and the refresh only
    second, third = Job.objects.get(pk=second.pk), Job.objects.get(pk=third.pk)
    assert abs((second.estimated_start - before).total_seconds() - 600) < 5
    assert abs((third.estimated_start - before).total_seconds() - 900) < 5
    assert second.estimated_nodes == ["node-0"] == third.estimated_nodes
    whole_node = [{"node": "node-0", "gpu_indices": list(range(8))}]
    assert second.estimated_allocations == whole_node == third.estimated_allocations
    assert BASIS_EXPECTED in second.estimate_basis and "no new job" in second.estimate_basis
    assert BASIS_TIMEOUT in third.estimate_basis
    shown = world.client("alice").get(f"/api/v1/jobs/{third.pk}/").json()
    assert shown["estimated_start"] and shown["estimated_nodes"] == ["node-0"]
    assert shown["estimated_allocations"] == whole_node
    assert shown["estimate_basis"] == third.estimate_basis
    page = Client()
    page.force_login(world.alice)
    queue = page.get("/dash/queue/").content.decode()
    assert "<th>estimated start (UTC)</th>" in queue
    assert f" data-from-now>{third.estimated_start:%Y-%m-%d %H:%M}</time></td>" in queue


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice values")
def test_a_refresh_replays_at_low_priority_and_a_what_if_at_the_caller_s(world, monkeypatch):
    """On a busy machine the refresh takes only the CPU that cycles and requests leave; a what-if
    someone waits for does not."""
    from scheduler.cycle import estimates

    one_running_two_waiting(world, expected_seconds=60)
    replayed_at = []
    real = estimates.estimate_starts

    def replay(*args, **kwargs):
        replayed_at.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        return real(*args, **kwargs)

    monkeypatch.setattr(estimates, "estimate_starts", replay)
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert estimates_refresh().estimated == 2
    job_estimate(user=world.alice, share_name="research", gpu_type="h100", gpus=8)
    assert replayed_at == [min(19, own + LOWER_BY), own]


def test_a_reclaiming_job_starts_when_what_is_left_of_its_victim_s_grace_period_ends(world):
    """research's borrower holds vision's idle node, with a grace period of 120 s; vision's
    own job reclaims it. Refreshed as the stop is ordered, the owner is estimated to start
    when the grace period ends, 120 s later; refreshed 90 s into the grace period, in 30 s,
    not 120 s from then."""
    make_node("node-a")
    make_node("node-b")
    QuotaShare.objects.filter(name="research").update(grace_seconds=120)
    borrower, attempt = place_a_borrower(world)
    run(borrower)
    owner = submit(world.carol, "vision", expected_seconds=600)
    cycle_run(force=True)
    attempt.refresh_from_db()
    assert attempt.preempted_for_id == owner.pk and attempt.stop_requested_at

    estimates_refresh()
    owner.refresh_from_db()
    assert abs((owner.estimated_start - attempt.stop_requested_at).total_seconds() - 120) < 5

    JobAttempt.objects.filter(pk=attempt.pk).update(
        stop_requested_at=timezone.now() - timedelta(seconds=90)
    )
    before = timezone.now()
    estimates_refresh()
    owner.refresh_from_db()
    assert abs((owner.estimated_start - before).total_seconds() - 30) < 5
    assert owner.estimated_nodes == [attempt.allocations[0]["node"]]


def test_a_job_that_leaves_the_queue_loses_its_estimate_at_once(world):
    """Placed by a cycle or cancelled, a job shows no estimated start from that moment, not
    only after the next refresh (which runs seconds later)."""
    node, first, second, third = one_running_two_waiting(world, expected_seconds=300)
    estimates_refresh()
    assert all(job.estimated_start for job in Job.objects.filter(pk__in=[second.pk, third.pk]))
    attempt = JobAttempt.objects.get(job=first)
    attempt_exited(node=node, attempt_id=attempt.pk, end=END_EXIT, exit_code=0)
    cycle_run(force=True)
    second = Job.objects.get(pk=second.pk)
    assert second.state == Job.State.SCHEDULED
    assert (second.estimated_start, second.estimated_nodes, second.estimate_basis) == (None, [], "")
    assert second.estimated_allocations == []
    shown = world.client("alice").get(f"/api/v1/jobs/{second.pk}/").json()
    assert shown["estimated_start"] is None and shown["estimate_basis"] == ""
    world.client("alice").post(f"/api/v1/jobs/{third.pk}/cancel/")
    third = Job.objects.get(pk=third.pk)
    assert third.state == Job.State.CANCELLED and third.estimated_start is None


def test_a_refresh_clears_estimates_left_on_jobs_no_longer_waiting(world):
    """Rows written before jobs lost their estimates on leaving the queue are mended."""
    make_node("node-0")
    job = submit(world.alice, "research")
    Job.objects.filter(pk=job.pk).update(
        state=Job.State.RUNNING, estimated_start=timezone.now(), estimate_basis="old"
    )
    estimates_refresh()
    job = Job.objects.get(pk=job.pk)
    assert job.estimated_start is None and job.estimate_basis == ""


def test_a_job_beyond_the_horizon_has_no_estimate(world):
    make_node("node-0")
    first = submit(world.alice, "research", expected_seconds=86400)
    cycle_run(force=True)
    run(first)
    waiting = submit(world.alice, "research", expected_seconds=60)
    estimates_refresh(horizon=3600)
    waiting = Job.objects.get(pk=waiting.pk)
    assert waiting.estimated_start is None and "no new job" in waiting.estimate_basis
    assert waiting.estimate_basis.startswith("starts after ")


def succeeded(job: Job, seconds: float) -> None:
    ended = timezone.now()
    JobAttempt.objects.create(
        job=job, number=1, allocations=[], outcome=JobAttempt.Outcome.SUCCEEDED,
        started_at=ended - timedelta(seconds=seconds), ended_at=ended,
    )  # fmt: skip
    Job.objects.filter(pk=job.pk).update(state=Job.State.SUCCEEDED)


def test_without_its_own_time_a_job_counts_on_its_share_s_recent_runs(world):
    """The median of the share's recent runs of that size, else of any size, else an hour."""
    make_node("node-0")
    for seconds in (100, 200, 900):
        succeeded(submit(world.alice, "research", gpus=8), seconds)
    succeeded(submit(world.alice, "research", gpus=2), 5000)
    history = History()

    def expected(gpus: int, share: str = "research"):
        return expected_time(
            expected_seconds=None, timeout_seconds=None, share=share, gpus=gpus, history=history
        )

    assert expected(8).seconds == 200
    assert expected(8).basis == BASIS_HISTORY.format(runs=3, share="research", gpus=8)
    assert expected(4).seconds == 550  # the share's four runs
    assert expected(8, share="vision").basis == BASIS_DEFAULT.format(hours=1)


def test_refreshes_are_coalesced_and_none_is_lost(settings):
    """A cycle that planned queues a refresh; those after it within ESTIMATE_EVERY_SECONDS
    queue none but leave one pending, which the next cycle (planning or not) queues once that
    time has passed; with nothing pending, a cycle that did not plan queues nothing."""
    from django.db import connection

    from portal.redis import redis_client
    from scheduler.cycle.estimates import PENDING_KEY, QUEUED_KEY, estimates_wanted

    db = connection.settings_dict["NAME"]
    redis_client().delete(QUEUED_KEY.format(db=db), PENDING_KEY.format(db=db))
    assert estimates_wanted(planned=True)
    assert not estimates_wanted(planned=True)
    assert not estimates_wanted(planned=False)
    redis_client().delete(QUEUED_KEY.format(db=db))  # ESTIMATE_EVERY_SECONDS have passed
    assert estimates_wanted(planned=False)
    redis_client().delete(QUEUED_KEY.format(db=db))
    assert not estimates_wanted(planned=False)
    settings.ESTIMATES_ENABLED = False
    assert not estimates_wanted(planned=True)


@pytest.mark.django_db(transaction=True)
def test_a_refresh_leaves_a_job_another_transaction_holds_to_the_next_refresh(world):
    """A refresh never waits for a job's lock (a cycle placing it, a report): it leaves that
    job's estimate to the next refresh. Its UPDATE of many rows used to wait, and deadlocked
    with the cycle, which locks jobs in id order (seen at 2,000 agents)."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL (SQLite's writes take the whole database)")
    _node, _first, second, third = one_running_two_waiting(world, expected_seconds=100)
    locked, go_on = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                Job.objects.select_for_update().get(pk=second.pk)
                locked.set()
                go_on.wait(60)
        finally:
            connection.close()  # this thread's

    holder = threading.Thread(target=hold)
    holder.start()
    assert locked.wait(60)
    try:
        with connection.cursor() as cursor:  # a refresh that waits fails here, not hangs
            cursor.execute("SET lock_timeout = '20s'")
        estimates_refresh()
    finally:
        go_on.set()
        holder.join()
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")
    second.refresh_from_db()
    third.refresh_from_db()
    assert (second.estimated_start, second.estimate_basis) == (None, "")  # left for the next
    assert third.estimated_start is not None
    estimates_refresh()
    second.refresh_from_db()
    assert second.estimated_start is not None
