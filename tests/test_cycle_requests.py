"""Cycle requests close together share one cycle, and none is left waiting for beat."""

from __future__ import annotations

from unittest import mock

import pytest
import redis
from django.db import connection

from scheduler import services
from scheduler.notify import redis_client


@pytest.fixture
def window(settings):
    """An empty coalescing window of 0.2 s on the test Redis."""
    settings.CYCLE_REQUEST_WINDOW_SECONDS = 0.2
    db = connection.settings_dict["NAME"]
    keys = [services.CYCLE_REQUESTED_KEY.format(db=db), services.CYCLE_TRAILING_KEY.format(db=db)]
    try:
        redis_client().delete(*keys)
    except redis.RedisError:
        pytest.skip("no Redis at REDIS_URL")
    yield keys
    redis_client().delete(*keys)


@pytest.mark.django_db
def test_a_burst_publishes_one_cycle_now_and_one_at_the_end_of_the_window(window):
    """The first request publishes at once, the second for the end of the window (it covers
    every later request of the window, all committed before it starts), the others nothing."""
    delays = [services._cycle_publish_delay() for _ in range(5)]
    assert delays == [0.0, 0.2, None, None, None]


@pytest.mark.django_db
def test_after_the_window_a_request_publishes_at_once_again(window):
    requested, trailing = window
    assert services._cycle_publish_delay() == 0.0
    assert services._cycle_publish_delay() == 0.2
    redis_client().delete(requested, trailing)  # the window ran out (the keys expire with it)
    assert services._cycle_publish_delay() == 0.0


@pytest.mark.django_db
def test_the_last_request_of_a_window_is_covered_when_the_trailing_cycle_ran_out(window):
    """A request after the trailing key expired, while the first one still stands, publishes a
    cycle for the end of a new window rather than nothing."""
    requested, trailing = window
    assert services._cycle_publish_delay() == 0.0
    assert services._cycle_publish_delay() == 0.2
    redis_client().delete(trailing)
    assert services._cycle_publish_delay() == 0.2


def test_without_redis_every_request_publishes_at_once(settings):
    settings.CYCLE_REQUEST_WINDOW_SECONDS = 0.2
    broken = mock.Mock(eval=mock.Mock(side_effect=redis.ConnectionError("down")))
    with mock.patch("scheduler.notify.redis_client", return_value=broken):
        assert services._cycle_publish_delay() == 0.0


def test_a_zero_window_publishes_every_request_at_once(settings):
    settings.CYCLE_REQUEST_WINDOW_SECONDS = 0
    assert services._cycle_publish_delay() == 0.0


@pytest.mark.django_db
def test_request_cycle_publishes_after_the_commit_as_the_window_says(
    window, django_capture_on_commit_callbacks
):
    with mock.patch("scheduler.tasks.cycle") as cycle:
        for _ in range(3):
            with django_capture_on_commit_callbacks(execute=True):
                services.request_cycle()
    cycle.delay.assert_called_once_with()
    cycle.apply_async.assert_called_once_with(countdown=0.2)
