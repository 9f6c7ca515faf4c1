"""A plan's working memory is freed when the plan returns.

A plan runs with Python's cycle collector off (scheduler/engine/collector.py: a large snapshot
would be rescanned many times over), so anything of its own it left in a reference cycle would
stay allocated until some later collection: on a large cluster, megabytes a long-running cycle
worker holds for nothing.

Threads that earlier tests of the same run left behind (a server's, a client's) make garbage of
their own. So that only the plan's is counted, this thread keeps the interpreter to itself from
the collection before the plan to the one after it: a plan never blocks, and the switch interval
is raised for that time, so no other thread runs in between. And what was alive before is
frozen (`gc.freeze`) meanwhile: the collections look only at what came after, not at the whole
heap of a long test run (which made each example take a second late in the suite).
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import HealthCheck, given, settings

from scheduler.engine import Snapshot, plan
from scheduler.engine.tests.test_properties import busy_clusters


@contextmanager
def no_other_thread_runs() -> Iterator[None]:
    interval = sys.getswitchinterval()
    sys.setswitchinterval(60.0)
    try:
        time.sleep(0.001)  # threads already waiting to switch have their turn now, not later
        gc.freeze()
        yield
    finally:
        gc.unfreeze()
        sys.setswitchinterval(interval)


def collect_all() -> None:
    """Collects until nothing is left (finalizers run by a collection may leave new garbage)."""
    for _ in range(5):
        if gc.collect() == 0:
            return


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=busy_clusters())
def test_a_plan_leaves_nothing_for_the_cycle_collector(cluster: Snapshot):
    with no_other_thread_runs():
        collect_all()
        plan(cluster)
        assert gc.collect() == 0
