"""The Celery app of the live tests' workers: the portal's own, with two test hooks connected to
the cycle's signals (scheduler.cycle.run), each off unless its environment variable is set:

- CYCLE_TEST_TRACE_FILE: each cycle appends "cycle PID LOCKED_NS DONE_NS" (CLOCK_MONOTONIC,
  taken while the cycle lock is held), so a test can check that cycles never overlap;
- CYCLE_TEST_PAUSE_BEFORE_COMMIT_SECONDS: a cycle that placed or preempted something appends
  "paused PID PLACED PREEMPTED" and sleeps this long before its commit, so a test can kill the
  worker in the middle of a cycle.

`celery -A tests.live_worker worker ...` (tests/live.py starts it so)."""

import os
import time

import django

from portal.celery import app

django.setup()

from scheduler.cycle.run import cycle_done, plan_applied  # noqa: E402

__all__ = ["app"]

TRACE_FILE = os.environ.get("CYCLE_TEST_TRACE_FILE", "")
PAUSE_SECONDS = float(os.environ.get("CYCLE_TEST_PAUSE_BEFORE_COMMIT_SECONDS") or 0)


def _trace(*fields: object) -> None:
    """Append one line, in one write."""
    line = " ".join(str(f) for f in (fields[0], os.getpid(), *fields[1:])) + "\n"
    fd = os.open(TRACE_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _traced(sender, *, result, locked_ns, **kwargs) -> None:
    _trace("cycle", locked_ns, time.monotonic_ns())


def _paused(sender, *, result, **kwargs) -> None:
    if result.placed or result.preempted:
        if TRACE_FILE:
            _trace("paused", result.placed, result.preempted)
        time.sleep(PAUSE_SECONDS)


if TRACE_FILE:
    cycle_done.connect(_traced, weak=False)
if PAUSE_SECONDS > 0:
    plan_applied.connect(_paused, weak=False)
