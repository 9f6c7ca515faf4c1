"""Cycle requests close together share one cycle, and none is left waiting for beat."""

from __future__ import annotations

import time
from unittest import mock

import pytest
import redis
from django.db import connection

from portal.redis import redis_client
from scheduler.cycle import trigger


@pytest.fixture
def window(settings):
    """An empty coalescing window of 0.2 s on the test Redis."""
    settings.CYCLE_REQUEST_WINDOW_SECONDS = 0.2
    db = connection.settings_dict["NAME"]
    keys = [trigger.CYCLE_REQUESTED_KEY.format(db=db), trigger.CYCLE_TRAILING_KEY.format(db=db)]
    try:
        window_runs_out(*keys)
    except redis.RedisError:
        pytest.skip("no Redis at REDIS_URL")
    yield keys
    window_runs_out(*keys)


def window_runs_out(*keys: str) -> None:
    """The keys expire, as they do at the end of their window; and so does what this process
    remembers of the trailing key (it remembers no longer than the key stands)."""
    redis_client().delete(*keys)
    trigger._trailing_cycle_until.clear()


@pytest.mark.django_db
def test_a_burst_publishes_one_cycle_now_and_one_at_the_end_of_the_window(window):
    """The first request publishes at once, the second for the end of the window (it covers
    every later request of the window, all committed before it starts), the others nothing."""
    delays = [trigger._cycle_publish_delay() for _ in range(5)]
    assert delays == [0.0, 0.2, None, None, None]


@pytest.mark.django_db
def test_after_the_window_a_request_publishes_at_once_again(window):
    requested, trailing = window
    assert trigger._cycle_publish_delay() == 0.0
    assert trigger._cycle_publish_delay() == 0.2
    window_runs_out(requested, trailing)
    assert trigger._cycle_publish_delay() == 0.0


@pytest.mark.django_db
def test_the_last_request_of_a_window_is_covered_when_the_trailing_cycle_ran_out(window):
    """A request after the trailing key expired, while the first one still stands, publishes a
    cycle for the end of a new window rather than nothing."""
    requested, trailing = window
    assert trigger._cycle_publish_delay() == 0.0
    assert trigger._cycle_publish_delay() == 0.2
    window_runs_out(trailing)
    assert trigger._cycle_publish_delay() == 0.2


@pytest.mark.django_db
def test_while_the_trailing_cycle_stands_a_process_does_not_ask_redis_again(window, settings):
    """Once a process has seen the trailing key, its requests until the key's expiry are
    covered without a round trip to Redis (here the keys are gone from Redis, and yet nothing
    is published); after it, the process asks again."""
    settings.CYCLE_REQUEST_WINDOW_SECONDS = 0.05
    assert trigger._cycle_publish_delay() == 0.0
    assert trigger._cycle_publish_delay() == 0.05
    redis_client().delete(*window)
    assert trigger._cycle_publish_delay() is None
    time.sleep(0.06)
    assert trigger._cycle_publish_delay() == 0.0


def test_without_redis_every_request_publishes_at_once(settings):
    settings.CYCLE_REQUEST_WINDOW_SECONDS = 0.2
    broken = mock.Mock(eval=mock.Mock(side_effect=redis.ConnectionError("down")))
    with mock.patch("scheduler.cycle.trigger.redis_client", return_value=broken):
        assert trigger._cycle_publish_delay() == 0.0


def test_a_zero_window_publishes_every_request_at_once(settings):
    settings.CYCLE_REQUEST_WINDOW_SECONDS = 0
    assert trigger._cycle_publish_delay() == 0.0


@pytest.mark.django_db
def test_request_cycle_publishes_after_the_commit_as_the_window_says(
    window, django_capture_on_commit_callbacks
):
    with mock.patch("scheduler.cycle.trigger.cycle") as cycle:
        for _ in range(3):
            with django_capture_on_commit_callbacks(execute=True):
                trigger.request_cycle()
    (call,) = cycle.delay.call_args_list
    assert isinstance(call.kwargs["after_change"], int)
    cycle.apply_async.assert_called_once_with(countdown=0.2)
