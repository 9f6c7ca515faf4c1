"""A plan's working memory is freed when the plan returns.

A plan runs with Python's cycle collector off (a large snapshot would be rescanned many times
over), so anything of its own it left in a reference cycle would stay allocated until some
later collection: on a large cluster, megabytes a long-running cycle worker holds for nothing.
"""

from __future__ import annotations

import gc

from hypothesis import HealthCheck, given, settings

from scheduler.engine import Snapshot, plan
from scheduler.engine.tests.test_properties import busy_clusters


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=busy_clusters())
def test_a_plan_leaves_nothing_for_the_cycle_collector(cluster: Snapshot):
    gc.collect()
    plan(cluster)
    assert gc.collect() == 0
