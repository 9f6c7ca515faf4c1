"""Writes about nodes: registration, heartbeats, the orders a node's agent polls for (one
`node_poll_start` per long poll), and an admin's drain/undrain, with who and why. What agents
report about their attempts is `scheduler.nodes.attempts`."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import DEFAULT_DB_ALIAS, connection, transaction
from django.utils import timezone

from portal.db.sql import json_value, prepared_cursor, select_rows
from scheduler.cycle.orders import run_order, stop_order
from scheduler.cycle.trigger import request_cycle
from scheduler.cycle.wake import OrderWaiter
from scheduler.models import ClusterSettings, JobAttempt, Node
from scheduler.nodes import queries
from scheduler.nodes.attempts import attempts_start, node_report, stops_ordered_first

JOIN_TOKEN_INVALID = (
    "join_token: not this cluster's join token (see Cluster settings in the admin)."
)
NODE_OF_CONNECTOR = (
    "name: node {name} belongs to the connector of cluster {connector}; a node agent cannot "
    "register it."
)


class NodeConflict(Exception):
    """A node's name is taken by another kind of owner: an agent's node by a connector, or a
    connector's by an agent (answered 409)."""

    def __init__(self, field: str, message: str) -> None:
        self.errors = {field: message}


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def node_for_token(token: str) -> Node | None:
    if not token:
        return None
    sql, fields = queries.node_for_token_query()
    rows = select_rows(sql, [hash_token(token)], fields)
    if not rows:
        return None
    return Node.from_db(DEFAULT_DB_ALIAS, [f.attname for f in fields], rows[0])


@transaction.atomic
def node_register(
    *,
    join_token: str,
    name: str,
    gpu_type: str,
    gpus: int,
    gpu_details: list[dict],
    asks_to_start: bool = False,
) -> tuple[Node, str]:
    """Register (or re-register) a node; returns it and its new token. The token is stored
    hashed; registering again replaces it, so a replaced agent's old token stops working.
    `asks_to_start`: the agent says it starts only what the portal grants (`Node.asks_to_start`;
    an agent of an earlier release does not say so). Raises PermissionError on a wrong join
    token, NodeConflict for a node of a connector's cluster (its attempts are the connector's
    to start and report)."""
    expected = ClusterSettings.load().agent_join_token
    if not join_token or not secrets.compare_digest(join_token.encode(), expected.encode()):
        raise PermissionError(JOIN_TOKEN_INVALID)
    token = secrets.token_urlsafe(32)
    node, created = Node.objects.select_for_update().get_or_create(
        name=name,
        defaults={"gpu_type": gpu_type, "gpus": gpus},
    )
    if node.connector_id is not None:
        raise NodeConflict(
            "name", NODE_OF_CONNECTOR.format(name=name, connector=node.connector.name)
        )
    node.gpu_type = gpu_type
    node.gpus = gpus
    node.gpu_details = gpu_details
    node.asks_to_start = asks_to_start
    node.token_hash = hash_token(token)
    node.last_heartbeat = timezone.now()
    if node.state == Node.State.DOWN:
        node.state = Node.State.READY
        node.state_reason = ""  # why it was down ("no heartbeat ...") is over
    node.full_clean(exclude=["token_hash"])
    node.save()
    request_cycle()
    return node, token


def heartbeat_write_seconds() -> float:
    """How stale `last_heartbeat` may be before a heartbeat writes it again: a tenth of the
    heartbeat timeout. Every poll and report is a heartbeat; writing each one would cost a
    commit per agent request for nothing (the node is lost only after the whole timeout)."""
    return settings.NODE_HEARTBEAT_TIMEOUT_SECONDS / 10


def node_heartbeat(*, node: Node) -> None:
    """The agent is alive. A node marked DOWN for missing heartbeats is READY again. `node` is
    as loaded for this request (its `last_heartbeat` decides whether to write)."""
    now = timezone.now()
    last = node.last_heartbeat
    if last is None or (now - last).total_seconds() >= heartbeat_write_seconds():
        with prepared_cursor() as cursor:
            cursor.execute(
                queries.heartbeat_sql(), [connection.ops.adapt_datetimefield_value(now), node.pk]
            )
        node.last_heartbeat = now
    if node.state == Node.State.DOWN:
        with transaction.atomic():
            if Node.objects.filter(pk=node.pk, state=Node.State.DOWN).update(
                state=Node.State.READY, state_reason=""
            ):
                request_cycle()
        node.state = Node.State.READY


@dataclass
class Orders:
    run: list[dict]
    stop: list[dict]
    # Every attempt that should run here, those left out of `run` included.
    to_run: set[int]


def node_orders(*, node: Node, running: set[int] = frozenset()) -> Orders:
    """What the node should be doing: every attempt holding GPUs on it, to run or to stop.
    Orders are declarative; the agent reconciles them with what it runs (and kills what is
    in neither list, see `orphan_stops`). The run orders of attempts the agent says it runs
    (`running`) are left out: it has them, and a busy node would otherwise be sent its every
    job's order with every answer. One query, and no write: the agent's request to start the
    attempt records that its order was delivered (STARTING) and its start (RUNNING) together
    (`scheduler.nodes.attempts.attempts_start`)."""
    # One row per GPU held here, with what the order needs of its attempt and job. Its values
    # are used as the database gives them but for `env`, JSON text decoded only for the orders
    # sent (a busy node holds a row for each of its GPUs at every poll); the times are only
    # compared with None.
    with prepared_cursor() as cursor:
        cursor.execute(queries.orders_sql(), [node.pk, False])
        held = cursor.fetchall()
    run: list[dict] = []
    stop: list[dict] = []
    to_run: set[int] = set()
    previous = None  # the attempt of the previous row
    order: dict | None = None  # its order, if it is sent
    for (
        index, attempt_id, number, started_at, stop_requested_at,
        job_id, command, env, working_dir, timeout_seconds, grace, nodes,
    ) in held:  # fmt: skip
        if attempt_id == previous:
            if order is not None and "gpu_indices" in order:
                order["gpu_indices"].append(index)
            continue
        previous = attempt_id
        if stop_requested_at is not None:
            order = stop_order(attempt_id, grace_seconds=grace, started=started_at is not None)
            stop.append(order)
            continue
        to_run.add(attempt_id)
        if attempt_id in running:
            order = None
            continue
        order = run_order(
            attempt_id, job_id=job_id, number=number, command=command, env=json_value(env),
            working_dir=working_dir, gpu_indices=[index], timeout_seconds=timeout_seconds,
            grace_seconds=grace, started=started_at is not None, node_count=nodes,
        )  # fmt: skip
        run.append(order)
    return Orders(run=run, stop=stop, to_run=to_run)


def orphan_stops(*, node: Node, running: set[int], orders: Orders) -> list[dict]:
    """Processes the agent runs that hold no GPUs here any more (their attempt ended, e.g. as
    NODE_LOST while the agent was cut off): stop them with their share's grace."""
    known = orders.to_run | {o["attempt"] for o in orders.stop}
    extra = running - known
    if not extra:
        return []
    graces = dict(
        JobAttempt.objects.filter(pk__in=extra).values_list("pk", "job__share__grace_seconds")
    )
    return [{"attempt": a, "grace_seconds": graces.get(a, 0)} for a in sorted(extra)]


def poll_wait_seconds(requested: float | None) -> float:
    """How long a long poll may wait: what the agent asks, capped well below the heartbeat
    timeout (each poll is the node's heartbeat). Capped before it is made a float: an integer
    too large for one is a wait as long as any."""
    cap = settings.AGENT_POLL_MAX_WAIT_SECONDS
    if requested is None:
        return cap
    return float(max(0.0, min(requested, cap)))


@dataclass
class PollStart:
    """What a long poll found before it waits: the results of the events it carried, the
    orders, and whether they are news to the agent (then it answers at once)."""

    results: list[str]
    orders: dict[str, Any]
    news: bool


def node_poll_start(
    *, node: Node, running: set[int], stopping: set[int], events: list[dict], waiter: OrderWaiter,
    grants: bool = False,
) -> PollStart:  # fmt: skip
    """The database step of a long poll (`scheduler.nodes.views.poll`): a heartbeat; `events`
    applied first, as a report would apply them; `waiter` watching the node's changes before
    the orders are read (a change committed in between is not missed); then the orders. They
    are news when they differ from what the agent says it runs (`running`) and stops
    (`stopping`), and are answered at once (`grants`: with their starts granted, see
    `starts_granted`); otherwise the poll waits on `waiter` and reads them again
    (`node_poll_orders`) if it is woken."""
    node_heartbeat(node=node)
    results = node_report(node=node, events=events)
    waiter.watch(node.pk)
    orders = _orders(node, running)
    news = _news(orders, running, stopping)
    if news:
        orders = node_poll_answer(node=node, orders=orders, grants=grants)
    return PollStart(results=results, orders=orders, news=news)


def node_poll_orders(*, node: Node, running: set[int], grants: bool = False) -> dict[str, Any]:
    """The orders again, after a waiting poll was woken (`grants`: with their starts
    granted)."""
    return node_poll_answer(node=node, orders=_orders(node, running), grants=grants)


def node_poll_answer(*, node: Node, orders: dict[str, Any], grants: bool) -> dict[str, Any]:
    """The orders as the poll answers them: with their starts granted if the agent asked for
    grants (`starts_granted`)."""
    return starts_granted(node=node, orders=orders) if grants else orders


def starts_granted(*, node: Node, orders: dict[str, Any]) -> dict[str, Any]:
    """The orders a poll answers with, the starts of their one-node attempts granted in the
    answer (`granted: true` in their run orders), for an agent that says it starts what a
    poll grants (its poll's `grants`): it need not ask for them (`start/`), a round trip less
    between a placement and its process. They are granted as a start request grants them
    (`attempts_start`): an attempt whose stop was ordered first is refused, and its stop order
    comes instead of its run order; one that ended meanwhile is left out. A gang's nodes
    still ask, as before: the first decides for all of them. An answer with stop orders grants
    nothing: a grant may wait for its job's lock, which a cycle holds while it orders stops,
    and a stop order never waits behind a start (the agent asks to start beside its polls).
    An answer that is lost on its way leaves the attempt started with no process: the agent's
    next poll does not list it as running, so it is ordered to run again and granted again."""
    single = starts_grantable(orders)
    if not single:
        return orders
    granted = attempts_start(node=node, attempt_ids=single)
    refused = single - granted
    stop = stops_ordered_first(node=node, attempt_ids=refused)
    run = [
        {**order, "granted": True} if order["attempt"] in granted else order
        for order in orders["run"]
        if order["attempt"] not in refused
    ]
    return {"run": run, "stop": stop}


def starts_grantable(orders: dict[str, Any]) -> set[int]:
    """The attempts whose starts `starts_granted` may grant in an answer with these orders:
    those of its one-node run orders, none if it has a stop order."""
    if orders["stop"]:
        return set()
    return {order["attempt"] for order in orders["run"] if order.get("node_count") == 1}


def orders_with_news(orders: dict[str, Any], news: dict[str, list[dict]],
                     running: set[int]) -> dict[str, Any]:  # fmt: skip
    """The orders a poll read (`node_poll_start`) with the orders that its node's
    notifications carried since (`scheduler.cycle.wake`): what reading them again would give,
    without the database. A stop order takes its attempt out of the run orders; the run orders
    of attempts the agent runs (`running`) are left out, as `node_orders` leaves them out."""
    stopped = {o["attempt"] for o in news["stop"]}
    listed = {o["attempt"] for o in orders["run"]} | {o["attempt"] for o in orders["stop"]}
    run = {o["attempt"]: o for o in orders["run"] if o["attempt"] not in stopped}
    for order in news["run"]:
        attempt = order["attempt"]
        if attempt not in listed and attempt not in stopped and attempt not in running:
            run[attempt] = order
    stop = {o["attempt"]: o for o in orders["stop"]}
    for order in news["stop"]:
        stop.setdefault(order["attempt"], order)
    return {"run": [run[a] for a in sorted(run)], "stop": list(stop.values())}


def _orders(node: Node, running: set[int]) -> dict[str, Any]:
    orders = node_orders(node=node, running=running)
    stop = orders.stop + orphan_stops(node=node, running=running, orders=orders)
    return {"run": orders.run, "stop": stop}


def _news(orders: dict, running: set[int], stopping: set[int]) -> bool:
    to_run = {o["attempt"] for o in orders["run"]}
    to_stop = {o["attempt"] for o in orders["stop"]}
    return bool(to_run - running) or bool(to_stop - stopping)


# The recorded reason is "<what> by <user>: <reason>" and fits Node.state_reason (300 characters)
# with the longest user name (150).
MAX_NODE_REASON = 120
NODE_REASON_TOO_LONG = f"reason: at most {MAX_NODE_REASON} characters."
NODE_REASON_NOT_TEXT = "reason: must be text."
NODE_STATE_SET = {
    Node.State.READY: "undrained",
    Node.State.DRAINING: "drained",
    Node.State.DOWN: "marked down",
}


def node_state_reason(*, state: str, user=None, reason: str = "") -> str:
    """What `node_set_state` records: what was done, by whom, and why."""
    if not isinstance(reason, str):
        raise ValidationError({"reason": NODE_REASON_NOT_TEXT})
    reason = " ".join(reason.split())
    if len(reason) > MAX_NODE_REASON:
        raise ValidationError({"reason": NODE_REASON_TOO_LONG})
    text = NODE_STATE_SET[state]
    if user is not None:
        text += f" by {user.get_username()}"
    return f"{text}: {reason}" if reason else text


def node_set_state(*, node: Node, state: str, user=None, reason: str = "") -> Node:
    """Drain (finish running jobs, take no new ones), undrain, or mark a node down, and record
    who did it and why as the node's `state_reason` ("drained by alice: ECC errors on GPU 3"),
    which the admin's node list, the nodes API and the overview page show. `user`: who acts
    (None: the portal itself); `reason`: theirs, at most MAX_NODE_REASON characters, or
    ValidationError naming `reason`, before anything is written. No job changes state here: a
    draining node's jobs finish; a node marked down ends none of its attempts (its agent's next
    heartbeat makes it READY again). A connector's node takes its state and reason from its
    cluster again when the cluster reports it."""
    node.state_reason = node_state_reason(state=state, user=user, reason=reason)
    Node.objects.filter(pk=node.pk).update(state=state, state_reason=node.state_reason)
    node.state = state
    request_cycle()
    return node
