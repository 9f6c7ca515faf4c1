"""Cycle requests share a cycle without waiting for one: while a published cycle has not
started reading, it covers every request; once it has, the next request publishes again. None
is left waiting for beat."""

from __future__ import annotations

from unittest import mock

import pytest
import redis
from django.db import connection

from portal.redis import redis_client
from scheduler.cycle import idle, trigger
from scheduler.cycle.run import cycle_run


@pytest.fixture
def no_cycle_queued():
    key = idle.QUEUED_KEY.format(db=connection.settings_dict["NAME"])
    try:
        redis_client().delete(key)
    except redis.RedisError:
        pytest.skip("no Redis at REDIS_URL")
    yield key
    redis_client().delete(key)


def published(django_capture_on_commit_callbacks, requests: int) -> list:
    """The cycles `requests` requests (each after its commit) publish: their after_change."""
    with mock.patch("scheduler.cycle.trigger.cycle") as cycle:
        for _ in range(requests):
            with django_capture_on_commit_callbacks(execute=True):
                trigger.request_cycle()
    return [call.kwargs["after_change"] for call in cycle.delay.call_args_list]


@pytest.mark.django_db
def test_a_burst_publishes_one_cycle_at_once(no_cycle_queued, django_capture_on_commit_callbacks):
    """The first request publishes a cycle at once (no waiting window), with the number of
    its change; the others, while that cycle has not started, are covered by it."""
    (change,) = published(django_capture_on_commit_callbacks, 5)
    assert isinstance(change, int)


@pytest.mark.django_db
def test_once_the_cycle_started_reading_the_next_request_publishes(
    world, no_cycle_queued, django_capture_on_commit_callbacks
):
    """A cycle clears the mark when it holds the lock, before it reads: a request after that
    may not be in what it reads, so it publishes the next cycle at once."""
    assert len(published(django_capture_on_commit_callbacks, 2)) == 1
    cycle_run()
    assert len(published(django_capture_on_commit_callbacks, 2)) == 1


@pytest.mark.django_db
def test_a_cycle_found_covered_clears_the_mark(
    world, no_cycle_queued, django_capture_on_commit_callbacks
):
    """A request may mark a cycle queued just after the cycle that covers its change cleared
    the mark: that cycle, found covered, clears the mark too, so later requests publish."""
    change = idle.note_change().number
    with django_capture_on_commit_callbacks(execute=True):
        cycle_run()  # it reads the count: `change` is covered
    assert idle.note_change().publish  # the late mark of the request
    assert cycle_run(after_change=change).covered
    assert len(published(django_capture_on_commit_callbacks, 1)) == 1


def test_without_redis_every_request_publishes():
    broken = mock.Mock(pipeline=mock.Mock(side_effect=redis.ConnectionError("down")))
    with mock.patch("scheduler.cycle.idle.redis_client", return_value=broken):
        assert idle.note_change() == idle.Change(None, True)
