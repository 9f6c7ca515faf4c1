"""What a caller may hand the engine ready-made (the GPUs held on each node) or send again (the
same tuple of nodes) changes no plan."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.engine import Snapshot, plan
from scheduler.engine.snapshot import DRAINING, READY
from scheduler.engine.tests.test_properties import busy_clusters, clusters, next_cycle


def held_masks(snapshot: Snapshot) -> dict[str, int]:
    held: dict[str, int] = defaultdict(int)
    for job in snapshot.placed:
        for allocation in job.allocations:
            for index in allocation.gpu_indices:
                held[allocation.node] |= 1 << index
    return dict(held)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters(), finishes=st.lists(st.booleans(), min_size=4, max_size=4))
def test_held_gpus_given_plan_as_worked_out(cluster, finishes):
    """Over several cycles (jobs placed, stopping, finishing), a snapshot carrying the GPUs its
    placed jobs hold gives the plan of the same snapshot without them."""
    snapshot = cluster
    history: dict[str, tuple[float, ...]] = {}
    for cycle, finish in enumerate(finishes):
        outcome = plan(snapshot)
        assert plan(replace(snapshot, held_gpus=held_masks(snapshot))) == outcome
        snapshot = next_cycle(snapshot, outcome, cycle, finish, history)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=busy_clusters())
def test_held_gpus_given_plan_as_worked_out_on_a_busy_cluster(cluster):
    """Nodes full of small jobs, and victim searches: the same plan with the GPUs held given."""
    assert plan(replace(cluster, held_gpus=held_masks(cluster))) == plan(cluster)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=busy_clusters())
def test_nodes_sent_again_or_changed_plan_as_new(cluster):
    """The same tuple of nodes sent again plans as a copy of it; a new tuple where a node is
    draining is planned with that node draining, whatever was planned before."""
    outcome = plan(cluster)
    assert plan(cluster) == outcome
    assert plan(replace(cluster, nodes=tuple(list(cluster.nodes)))) == outcome
    drained = cluster.nodes[0].name
    nodes = tuple(
        replace(node, state=DRAINING) if node.name == drained else node for node in cluster.nodes
    )
    assert cluster.nodes[0].state == READY
    fresh = plan(replace(cluster, nodes=tuple(list(nodes))))
    assert plan(replace(cluster, nodes=nodes)) == fresh
    assert plan(cluster) == outcome
    assert all(
        allocation.node != drained
        for placement in fresh.placements
        for allocation in placement.allocations
    )
