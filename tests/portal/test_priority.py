"""`at_low_priority`: work that can wait gets a lower CPU priority than the rest of its process,
and only that work."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from portal.priority import LOWER_BY, at_low_priority

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="per-thread nice values are Linux's"
)


def own_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@linux_only
def test_the_work_runs_at_lower_priority_and_the_caller_keeps_its_own():
    before = own_nice()
    seen = at_low_priority(lambda: (threading.get_native_id(), own_nice()))
    assert seen[0] != threading.get_native_id()
    assert seen[1] == min(19, before + LOWER_BY)
    assert own_nice() == before  # the caller's thread is as it was


def test_what_the_work_returns_or_raises_reaches_the_caller():
    assert at_low_priority(lambda: 42) == 42
    with pytest.raises(ZeroDivisionError):
        at_low_priority(lambda: 1 / 0)
