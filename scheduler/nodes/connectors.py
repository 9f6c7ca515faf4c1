"""Writes about connectors (`gpu-agent slurm`): one process that brings a whole cluster
manager's nodes to the portal. It registers them together, long-polls for all their orders at
once, and reports what its cluster manager did with each attempt.

A connector's nodes are portal nodes like an agent's, and every rule about an attempt on a node
is the agents' (`scheduler.nodes.attempts`, `scheduler.nodes.services`): a connector's report
about an attempt is applied on each of its nodes holding the attempt, as that node's agent
would report it. What is the connector's own: node states and the GPUs held outside the
portal come from the cluster manager, and a run order carries all the nodes of its attempt
(a gang is one job of the cluster manager)."""

from __future__ import annotations

import secrets
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from portal.db.sql import json_value, prepared_cursor
from scheduler.agent.protocol import EVENT_CHECKPOINT, EVENT_LOG, EVENT_STARTED
from scheduler.cycle.housekeeping import HEARTBEAT_LOST
from scheduler.cycle.trigger import request_cycle
from scheduler.cycle.wake import OrderWaiter
from scheduler.models import ClusterSettings, Connector, GpuAssignment, JobAttempt, Node
from scheduler.nodes import queries
from scheduler.nodes.attempts import attempts_start, nodes_report
from scheduler.nodes.services import (
    JOIN_TOKEN_INVALID,
    NodeConflict,
    PollStart,
    hash_token,
    heartbeat_write_seconds,
)

NODE_OF_AGENT = "nodes[{i}].name: node {name} is registered by its own node agent, not a connector."
NODE_OF_OTHER = "nodes[{i}].name: node {name} belongs to the connector of cluster {other}."
NODE_TWICE = "nodes[{i}].name: node {name} is listed twice."
NOT_IN_CLUSTER = "no longer among the GPU nodes of the connector's cluster"


@dataclass(frozen=True)
class ClusterNode:
    """A node as its cluster manager sees it."""

    name: str
    gpu_type: str
    gpus: int
    state: str  # Node.State
    reason: str = ""
    outside_gpus: int = 0


def connector_for_token(token: str) -> Connector | None:
    if not token:
        return None
    return Connector.objects.filter(token_hash=hash_token(token)).order_by("id").first()


@transaction.atomic
def connector_register(
    *, join_token: str, name: str, kind: str, nodes: list[ClusterNode]
) -> tuple[Connector, str]:
    """Register (or re-register) a connector with every node of its cluster; returns it and its
    new token (stored hashed; registering again replaces it). Its nodes that are not in `nodes`
    any more go DOWN. Raises PermissionError on a wrong join token, NodeConflict for a node
    another agent or connector has."""
    expected = ClusterSettings.load().agent_join_token
    if not join_token or not secrets.compare_digest(join_token.encode(), expected.encode()):
        raise PermissionError(JOIN_TOKEN_INVALID)
    token = secrets.token_urlsafe(32)
    now = timezone.now()
    connector, _ = Connector.objects.select_for_update().get_or_create(
        name=name, defaults={"kind": kind}
    )
    connector.kind = kind
    connector.token_hash = hash_token(token)
    connector.last_heartbeat = now
    connector.full_clean(exclude=["token_hash"])
    connector.save()
    existing = {
        node.name: node
        for node in Node.objects.select_for_update().filter(name__in=[n.name for n in nodes])
    }
    seen: set[str] = set()
    for i, reported in enumerate(nodes):
        if reported.name in seen:
            raise NodeConflict(f"nodes[{i}].name", NODE_TWICE.format(i=i, name=reported.name))
        seen.add(reported.name)
        node = existing.get(reported.name)
        if node is not None and node.connector_id != connector.pk:
            if node.connector_id is None:
                raise NodeConflict(f"nodes[{i}].name", NODE_OF_AGENT.format(i=i, name=node.name))
            raise NodeConflict(
                f"nodes[{i}].name",
                NODE_OF_OTHER.format(i=i, name=node.name, other=node.connector.name),
            )
        node = node or Node(name=reported.name, connector=connector)
        _set_node(node, reported)
        node.asks_to_start = True  # a connector starts only what the portal grants
        node.last_heartbeat = now
        node.full_clean(exclude=["token_hash", "connector"])
        node.save()
    Node.objects.filter(connector=connector).exclude(name__in=seen).exclude(
        state=Node.State.DOWN, state_reason=NOT_IN_CLUSTER
    ).update(state=Node.State.DOWN, state_reason=NOT_IN_CLUSTER)
    request_cycle()
    return connector, token


def _set_node(node: Node, reported: ClusterNode) -> bool:
    """Take what the cluster manager says of the node; returns whether anything changed."""
    changed = (node.gpu_type, node.gpus, node.state, node.state_reason, node.outside_gpus) != (
        reported.gpu_type, reported.gpus, reported.state, reported.reason, reported.outside_gpus,
    )  # fmt: skip
    node.gpu_type = reported.gpu_type
    node.gpus = reported.gpus
    node.state = reported.state
    node.state_reason = reported.reason
    node.outside_gpus = reported.outside_gpus
    return changed


def connector_nodes_update(*, connector: Connector, nodes: list[ClusterNode]) -> None:
    """What the cluster manager now says of some of the connector's nodes (those that changed,
    or all of them). A node the connector has not registered is ignored: it registers again
    when its cluster's nodes change (`Connector.read_inventory`)."""
    if not nodes:
        return
    changed = False
    with transaction.atomic():
        by_name = {
            node.name: node
            for node in Node.objects.select_for_update().filter(
                connector=connector, name__in=[n.name for n in nodes]
            )
        }
        for reported in nodes:
            node = by_name.get(reported.name)
            if node is None:
                continue
            if _set_node(node, reported):
                changed = True
                node.full_clean(exclude=["token_hash", "connector"])
                node.save(
                    update_fields=["gpu_type", "gpus", "state", "state_reason", "outside_gpus"]
                )
    if changed:
        request_cycle()


def connector_heartbeat(*, connector: Connector) -> bool:
    """The connector is alive: so are its nodes (their heartbeats are the connector's, written
    as seldom as an agent's). Returns whether it should send its whole inventory: the cycle
    marked some of its nodes DOWN while it was not heard from."""
    now = timezone.now()
    last = connector.last_heartbeat
    if last is None or (now - last).total_seconds() >= heartbeat_write_seconds():
        Connector.objects.filter(pk=connector.pk).update(last_heartbeat=now)
        Node.objects.filter(connector=connector).update(last_heartbeat=now)
        connector.last_heartbeat = now
    return Node.objects.filter(
        connector=connector, state=Node.State.DOWN, state_reason=HEARTBEAT_LOST
    ).exists()


def _node_ids(connector: Connector) -> list[int]:
    return list(Node.objects.filter(connector=connector).values_list("pk", flat=True))


def connector_orders(
    *, connector: Connector, running: set[int], full: bool = False
) -> dict[str, list[dict]]:
    """What the connector's cluster should be doing: every attempt holding GPUs on its nodes,
    to run (with all its nodes: a gang is one job of the cluster manager) or to stop, and stops
    for the attempts it runs that hold no GPUs there any more (`orphan`: their GPUs are free in
    the portal's eyes, but not yet in the cluster's). As an agent's (`node_orders`), run orders
    of the attempts it says it runs are left out, unless it asks for them all (`full`: a
    connector that restarted finds its attempts in its cluster and needs their orders)."""
    with prepared_cursor() as cursor:
        cursor.execute(queries.connector_orders_sql(), [connector.pk, False])
        held = cursor.fetchall()
    run: dict[int, dict] = {}
    stop: dict[int, dict] = {}
    known: set[int] = set()
    for (
        node_name, index, attempt_id, number, started_at, stop_requested_at,
        job_id, command, env, image, working_dir, timeout_seconds, grace, share, cluster_job,
    ) in held:  # fmt: skip
        known.add(attempt_id)
        if stop_requested_at is not None:
            if attempt_id not in stop:
                stop[attempt_id] = _with_cluster_job(
                    {"attempt": attempt_id, "grace_seconds": grace,
                     "started": started_at is not None},
                    cluster_job,
                )  # fmt: skip
            continue
        if attempt_id in running and not full:
            continue
        order = run.get(attempt_id)
        if order is None:
            order = run[attempt_id] = {
                "attempt": attempt_id,
                "job": job_id,
                "share": share,
                "number": number,
                "command": command,
                "env": json_value(env),
                "image": image,
                "working_dir": working_dir,
                "nodes": [],
                "timeout_seconds": timeout_seconds,
                "grace_seconds": grace,
                "started": started_at is not None,
            }
            _with_cluster_job(order, cluster_job)
        nodes = order["nodes"]
        if not nodes or nodes[-1]["node"] != node_name:
            nodes.append({"node": node_name, "gpu_indices": []})
        nodes[-1]["gpu_indices"].append(index)
    orphans = running - known
    graces = dict(
        JobAttempt.objects.filter(pk__in=orphans).values_list("pk", "job__share__grace_seconds")
    )
    orphan_stops = [
        {"attempt": a, "grace_seconds": graces.get(a, 0), "started": True, "orphan": True}
        for a in sorted(orphans)
    ]
    return {"run": list(run.values()), "stop": [*stop.values(), *orphan_stops]}


def _with_cluster_job(order: dict, cluster_job) -> dict:
    """The order, with the cluster's job id when the attempt has one: a connector that
    restarted and no longer lists the job may still learn how it ended (sacct, the
    job-completion log)."""
    job_id = (json_value(cluster_job) or {}).get("id")
    if job_id:
        order["cluster_job_id"] = job_id
    return order


def _holders(connector: Connector, attempt_ids: set[int]) -> dict[int, list[Node]]:
    """The connector's nodes where each attempt holds GPUs, in name order."""
    pairs = list(
        GpuAssignment.objects.filter(
            attempt_id__in=attempt_ids, released=False, node__connector=connector
        )
        .order_by("node__name")
        .values_list("attempt_id", "node_id")
        .distinct()
    )
    nodes = Node.objects.in_bulk({node_id for _, node_id in pairs})
    holders: dict[int, list[Node]] = defaultdict(list)
    for attempt_id, node_id in pairs:
        holders[attempt_id].append(nodes[node_id])
    return holders


def connector_start(*, connector: Connector, attempt_ids: set[int]) -> set[int]:
    """The connector has these attempts' run orders and asks to start them: it submits to its
    cluster manager only those this grants (`attempts_start`, on each node of the attempt)."""
    holders = _holders(connector, attempt_ids)
    by_node: dict[int, set[int]] = defaultdict(set)
    nodes: dict[int, Node] = {}
    for attempt_id, held_on in holders.items():
        for node in held_on:
            by_node[node.pk].add(attempt_id)
            nodes[node.pk] = node
    refused: set[int] = set()
    for node_id in sorted(by_node):
        asked = by_node[node_id] - refused
        refused |= asked - attempts_start(node=nodes[node_id], attempt_ids=asked)
    return set(holders) - refused


# Events about an attempt as a whole, applied on the first of its nodes only.
FIRST_NODE_ONLY = (EVENT_STARTED, EVENT_LOG, EVENT_CHECKPOINT)


def connector_report(*, connector: Connector, events: list[dict]) -> list[str]:
    """Apply what the connector reports about its attempts, in order: each event as the agent
    of each of the connector's nodes holding the attempt would report it (a start and a log
    tail on the first, an exit on every one, which ends a gang's attempt as its last node's
    exit does). A start may say what the cluster manager runs the attempt as (`cluster_job`),
    and so may the exit of an attempt whose start the connector never saw.
    Returns "ok" or "ignored" for each event."""
    if not events:
        return []
    holders = _holders(connector, {event["attempt"] for event in events})
    results = ["ignored"] * len(events)
    # Round k applies each event on the k-th node holding its attempt, the events of one node
    # together, in order, as its agent's report would carry them; all rounds' reports in one
    # step (`nodes_report`: a gang's ends lock its job once).
    rounds = max((len(nodes) for nodes in holders.values()), default=0)
    reports: list[tuple[Node, list[tuple[int, dict]]]] = []
    for k in range(rounds):
        by_node: dict[int, list[tuple[int, dict]]] = defaultdict(list)
        nodes: dict[int, Node] = {}
        for i, event in enumerate(events):
            held_on = holders.get(event["attempt"], [])
            if k >= len(held_on) or (k > 0 and event["type"] in FIRST_NODE_ONLY):
                continue
            by_node[held_on[k].pk].append((i, event))
            nodes[held_on[k].pk] = held_on[k]
        reports += [(nodes[node_id], numbered) for node_id, numbered in by_node.items()]
    answers = nodes_report([(node, [e for _, e in numbered]) for node, numbered in reports])
    for (_, numbered), node_answers in zip(reports, answers, strict=True):
        for (i, _), answer in zip(numbered, node_answers, strict=True):
            if answer == "ok":
                results[i] = "ok"
    for event, result in zip(events, results, strict=True):
        if result == "ok" and event.get("cluster_job"):
            JobAttempt.objects.filter(pk=event["attempt"]).update(cluster_job=event["cluster_job"])
    return results


def connector_poll_start(
    *,
    connector: Connector,
    running: set[int],
    stopping: set[int],
    events: list[dict],
    nodes: list[ClusterNode],
    waiter: OrderWaiter,
    full: bool = False,
) -> PollStart:
    """The database step of a connector's long poll, as `node_poll_start` is an agent's: a
    heartbeat, what the cluster says of its nodes, the events, then the orders (with
    `resend_nodes` when the portal wants the whole inventory). News: orders that differ from
    what the connector runs and stops."""
    connector_nodes_update(connector=connector, nodes=nodes)
    resend = connector_heartbeat(connector=connector)
    results = connector_report(connector=connector, events=events)
    waiter.watch(_node_ids(connector))
    orders: dict[str, Any] = connector_orders(connector=connector, running=running, full=full)
    to_run = {o["attempt"] for o in orders["run"]}
    to_stop = {o["attempt"] for o in orders["stop"]}
    news = full or bool(to_run - running) or bool(to_stop - stopping) or resend
    if resend:
        orders["resend_nodes"] = True
    return PollStart(results=results, orders=orders, news=news)
