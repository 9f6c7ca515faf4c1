"""The outbox reads job events and share changes after the fact: none is lost when
transactions commit out of id order, and the past before the first subscription is not
told."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, connections, transaction

from notifications.models import Delivery, Kind, OutboxCursor, Subscription
from notifications.outbox import _advance
from notifications.services import dispatch, subscription_create
from scheduler.jobs.services import job_submit
from scheduler.models import Job, JobEvent
from scheduler.transitions import job_transition
from tests.conftest import make_node

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_ids_skipped_are_looked_for_until_they_show_up_or_settle(settings):
    """Reading 5 and 8 after 3 leaves 4, 6 and 7 to look for; 6 showing up later splits the
    range; what is still missing after the settle time is given up."""
    settings.NOTIFICATIONS_OUTBOX_SETTLE_SECONDS = 600
    position, gaps = _advance(3, [], [5, 8], NOW)
    stamp = NOW.timestamp()
    assert (position, gaps) == (8, [[4, 4, stamp], [6, 7, stamp]])
    later = NOW + timedelta(seconds=60)
    position, gaps = _advance(position, gaps, [6, 9], later)
    assert (position, gaps) == (9, [[4, 4, stamp], [7, 7, stamp]])
    assert _advance(position, gaps, [], NOW + timedelta(seconds=600)) == (9, [])


@pytest.mark.django_db
def test_the_past_before_the_first_subscription_is_not_told(world, receiver):
    make_node("node-0")
    job, _ = job_submit(user=world.bob, share_name="research", gpu_type="h100", gpus=8,
                        command="true")  # fmt: skip
    job_transition(job=Job.objects.get(pk=job.pk), to_state=Job.State.FAILED, reason="before")
    subscription_create(
        user=world.bob, scope=Subscription.Scope.OWN_JOBS, kinds=[Kind.JOB_FAILED],
        channel="webhook", target=receiver.url(),
    )  # fmt: skip
    dispatch()
    assert receiver.requests == []
    assert OutboxCursor.objects.get(name="job_event").position == JobEvent.objects.latest("pk").pk


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite commits writers in order")
@pytest.mark.django_db(transaction=True)
def test_an_event_committed_after_a_later_one_is_not_lost(world, receiver):
    """A transaction takes an event id and commits only after a later event was read: the
    next dispatch finds it."""
    make_node("node-0")
    subscription_create(
        user=world.bob, scope=Subscription.Scope.OWN_JOBS, kinds=[Kind.JOB_FAILED],
        channel="webhook", target=receiver.url(),
    )  # fmt: skip
    slow, fast = (
        job_submit(user=world.bob, share_name="research", gpu_type="h100", gpus=8,
                   command="true", name=name)[0]
        for name in ("slow", "fast")
    )  # fmt: skip
    inserted, commit = threading.Event(), threading.Event()

    def slow_writer() -> None:
        try:
            with transaction.atomic():
                job_transition(job=Job.objects.get(pk=slow.pk), to_state="FAILED", reason="slow")
                inserted.set()
                commit.wait(30)
        finally:
            connections.close_all()

    writer = threading.Thread(target=slow_writer)
    writer.start()
    assert inserted.wait(30)
    job_transition(job=Job.objects.get(pk=fast.pk), to_state=Job.State.FAILED, reason="fast")
    dispatch()
    assert [r.json["job"]["name"] for r in receiver.requests] == ["fast"]
    commit.set()
    writer.join()
    dispatch()
    assert [r.json["job"]["name"] for r in receiver.requests] == ["fast", "slow"]
    assert Delivery.objects.filter(state=Delivery.State.SENT).count() == 2
    # The slow event is no longer looked for (ids of earlier tests' rows, never to show up
    # here, are, until they settle).
    found = JobEvent.objects.get(job=slow, to_state=Job.State.FAILED).pk
    gaps = OutboxCursor.objects.get(name="job_event").gaps
    assert not any(first <= found <= last for first, last, _noticed in gaps)
