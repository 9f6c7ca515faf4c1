"""The cycle's first steps, before it plans: nodes that stopped sending heartbeats lose their
attempts (NODE_LOST, the jobs requeued), and jobs cancelled while they held GPUs get their stop
orders."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from functools import cache

from django.conf import settings
from django.db import connection

from portal.db.sql import prepared_cursor
from scheduler.cycle.orders import new_stop_orders
from scheduler.cycle.result import CycleResult
from scheduler.cycle.unstarted import attempts_end_unstarted
from scheduler.engine import outcomes
from scheduler.models import GpuAssignment, Job, JobAttempt, Node
from scheduler.transitions import Transitions

NODE_DOWN_ATTEMPT = "node {node} stopped sending heartbeats"
# A node's state_reason once marked DOWN for it (a connector heard from again is asked what
# each of its nodes is, see scheduler.nodes.connectors).
HEARTBEAT_LOST = "no heartbeat from its agent or connector"
CANCELLED_NOT_RUNNING = "cancelled: the job was not running any more"


def nodes_mark_lost(*, now: datetime, result: CycleResult) -> None:
    """Mark DOWN every node not heard from for NODE_HEARTBEAT_TIMEOUT_SECONDS; end its attempts
    as NODE_LOST, release their GPUs (on every node of a gang) and requeue their jobs."""
    timeout = settings.NODE_HEARTBEAT_TIMEOUT_SECONDS
    cutoff = now - timedelta(seconds=timeout)
    with prepared_cursor() as cursor:
        at = connection.ops.adapt_datetimefield_value(cutoff)
        cursor.execute(_silent_nodes_sql(), [Node.State.DOWN, at, at])
        lost = dict(cursor.fetchall())
    if not lost:
        return
    Node.objects.filter(pk__in=lost).update(state=Node.State.DOWN, state_reason=HEARTBEAT_LOST)
    result.nodes_lost += len(lost)
    attempt_nodes: dict[int, int] = {}
    for attempt_id, node_id in GpuAssignment.objects.filter(
        node_id__in=lost, released=False
    ).values_list("attempt_id", "node_id"):
        attempt_nodes.setdefault(attempt_id, node_id)
    if not attempt_nodes:
        return
    attempts = list(
        JobAttempt.objects.filter(pk__in=attempt_nodes, ended_at__isnull=True).values_list(
            "pk", "job_id"
        )
    )
    job_ids = [job_id for _, job_id in attempts]
    jobs = {
        row["pk"]: row
        for row in Job.objects.select_for_update()
        .filter(pk__in=job_ids, state__in=Job.PLACED_STATES)
        .values("pk", "state", "cancel_requested")
    }
    for peer in GpuAssignment.objects.filter(
        attempt_id__in=attempt_nodes, released=False
    ).values_list("node_id", flat=True):
        result.nodes_to_notify.add(peer)
    GpuAssignment.objects.filter(attempt_id__in=attempt_nodes, released=False).update(released=True)
    moves: dict[str, list[tuple[int, str, str]]] = defaultdict(list)
    for attempt_id, job_id in attempts:
        node = lost[attempt_nodes[attempt_id]]
        JobAttempt.objects.filter(pk=attempt_id, ended_at__isnull=True).update(
            ended_at=now,
            outcome=JobAttempt.Outcome.NODE_LOST,
            end_reason=NODE_DOWN_ATTEMPT.format(node=node),
        )
        job = jobs.get(job_id)
        if job is None:
            continue
        step = outcomes.after_node_lost(
            node=node, silent_seconds=timeout, cancel_requested=job["cancel_requested"]
        )
        moves[step.state].append((job_id, job["state"], step.reason))
    result.attempts_lost += len(attempts)
    transitions = Transitions()
    for to_state, changes in moves.items():
        transitions.move_rows(to_state=to_state, changes=changes)
    transitions.save()


@cache
def _silent_nodes_sql() -> str:
    """(id, name) of the nodes not DOWN (the first parameter) not heard from since a time (the
    other two), or never heard from and created before it."""
    return (
        f"SELECT id, name FROM {connection.ops.quote_name(Node._meta.db_table)} "
        "WHERE state <> %s AND (last_heartbeat < %s "
        "OR (last_heartbeat IS NULL AND created_at < %s))"
    )


def cancels_to_stop_orders(*, now: datetime, result: CycleResult) -> None:
    """A job cancelled while it held GPUs (PREEMPTING, cancel_requested) gets a stop order on
    its attempt, or, where no agent was granted its start, ends CANCELLED at once
    (`attempts_end_unstarted`, before this cycle's snapshot: the plan sees its GPUs free); one
    with no attempt left ends CANCELLED."""
    with prepared_cursor() as cursor:
        cursor.execute(_cancelled_sql(), [Job.State.PREEMPTING, True])
        pending = dict(cursor.fetchall())
    if not pending:
        return
    attempts = list(
        JobAttempt.objects.filter(job_id__in=pending, ended_at__isnull=True).only(
            "pk", "job_id", "started_at", "stop_requested_at"
        )
    )
    to_stop = [a for a in attempts if a.stop_requested_at is None]
    if to_stop:
        JobAttempt.objects.filter(
            pk__in=[a.pk for a in to_stop], stop_requested_at__isnull=True
        ).update(stop_requested_at=now)
        ended = attempts_end_unstarted(
            to_stop, outcome=JobAttempt.Outcome.CANCELLED, now=now, result=result
        )
        ordered = [a.pk for a in to_stop if a.pk not in ended]
        result.stop_orders += len(to_stop)
        result.orders_given(new_stop_orders(ordered))
    with_attempt = {a.job_id for a in attempts}
    orphans = [
        (job_id, state, CANCELLED_NOT_RUNNING)
        for job_id, state in pending.items()
        if job_id not in with_attempt
    ]
    Transitions().move_rows(to_state=Job.State.CANCELLED, changes=orphans).save()


@cache
def _cancelled_sql() -> str:
    """(id, state) of the jobs in a state (the first parameter) being cancelled (the second),
    locked in id order, as a start grant locks them: whether their attempts started is then
    read under the lock."""
    sql = (
        f"SELECT id, state FROM {connection.ops.quote_name(Job._meta.db_table)} "
        "WHERE state = %s AND cancel_requested = %s ORDER BY id"
    )
    return sql + " FOR UPDATE" if connection.features.has_select_for_update else sql
