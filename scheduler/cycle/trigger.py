"""How services ask for a scheduling cycle: `request_cycle()`, after their commit, with requests
close together sharing one. Only services ask for a cycle."""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.db import connection, transaction

from portal.redis import redis_client
from scheduler.cycle.idle import note_change
from scheduler.cycle.tasks import cycle

logger = logging.getLogger(__name__)

# Two keys per database: a request that finds neither publishes a cycle now and sets the first;
# one that finds the first publishes a cycle for the end of the window and sets the second; one
# that finds both publishes nothing (see _cycle_publish_delay).
CYCLE_REQUESTED_KEY = "portal:cycle:requested:{db}"
CYCLE_TRAILING_KEY = "portal:cycle:trailing:{db}"
# KEYS: requested, trailing; ARGV: the window in ms. Returns [0, 0]: publish now; [1, window]:
# publish for the end of the window; [2, ms left]: the cycle published for the end of the window
# covers this request. The second value: how long the trailing key still stands, in ms.
_CYCLE_COALESCE_SCRIPT = """
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then return {0, 0} end
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[1]) then return {1, tonumber(ARGV[1])} end
return {2, redis.call('PTTL', KEYS[2])}
"""
# Per process and database: until when (time.monotonic()) a cycle published for the end of the
# window is known to start later. Until then a request is covered without asking Redis: at a
# burst of submits, a process asks once or twice per window, not once per submit.
_trailing_cycle_until: dict[str, float] = {}


def _cycle_publish_delay() -> float | None:
    """Seconds to delay the cycle this request asks for, or None when no cycle need be
    published: one published earlier starts after this request's commit anyway.

    At most two cycles are published per CYCLE_REQUEST_WINDOW_SECONDS: the first request of a
    window gets one now; the next gets one at the end of the window, and it covers every
    request until then, since each of those committed before that cycle starts (and a cycle
    runs every runnable job). So no request is left waiting for beat, whichever comes last.
    The trailing key expires no later than that cycle's start, so while it stands (as this
    process last saw it) a request need not ask."""
    window = settings.CYCLE_REQUEST_WINDOW_SECONDS
    if window <= 0:
        return 0.0
    db = connection.settings_dict["NAME"]
    asked_at = time.monotonic()  # before Redis sets or reads the key: its TTL runs from later
    if asked_at < _trailing_cycle_until.get(db, 0.0):
        return None
    keys = [CYCLE_REQUESTED_KEY.format(db=db), CYCLE_TRAILING_KEY.format(db=db)]
    try:
        outcome, trailing_ms = redis_client().eval(
            _CYCLE_COALESCE_SCRIPT, 2, *keys, int(window * 1000)
        )
    except Exception:  # noqa: BLE001 — without the keys, publish as if the window were empty
        return 0.0
    if outcome:
        _trailing_cycle_until[db] = asked_at + int(trailing_ms) / 1000
    return {0: 0.0, 1: window}.get(int(outcome))


def request_cycle() -> None:
    """Ask for a scheduling cycle that starts after the current transaction commits.
    Requests close together share one (see _cycle_publish_delay); beat runs the cycle anyway
    every CYCLE_INTERVAL_SECONDS."""

    def enqueue() -> None:
        change = note_change()
        try:
            delay = _cycle_publish_delay()
            if delay is None:
                return
            if delay:
                # It covers the requests until it starts: it always runs.
                cycle.apply_async(countdown=delay)
            else:
                # It may find a cycle has already run since this change (see cycle_run).
                cycle.delay(after_change=change)
        except Exception:  # noqa: BLE001 — the broker being down must not fail a submit
            logger.warning("could not enqueue a cycle; beat will run it", exc_info=True)

    transaction.on_commit(enqueue)
