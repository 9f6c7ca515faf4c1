"""Writes that come from node agents: registration, heartbeats, orders, and what became of
each attempt. Reports may arrive late, twice or out of order (an agent retries after the
portal was unreachable): every write is conditional on the attempt still holding GPUs on the
reporting node, so a replayed or stale report changes nothing."""

from __future__ import annotations

import hashlib
import secrets
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, models, transaction
from django.utils import timezone

from portal.sql import prepared_cursor, select_rows
from scheduler.bulk import rows_update
from scheduler.engine import outcomes
from scheduler.models import ClusterSettings, GpuAssignment, Job, JobAttempt, Node
from scheduler.services import JobChanges, request_cycle

JOIN_TOKEN_INVALID = (
    "join_token: not this cluster's join token (see Cluster settings in the admin)."
)

STARTING_REASON = "order delivered to {node}; starting"
RUNNING_REASON = "running on {where}"

EVENT_STARTED = "started"
EVENT_EXITED = "exited"
EVENT_LOG = "log"
EVENT_TYPES = (EVENT_STARTED, EVENT_EXITED, EVENT_LOG)
# Why a process ended, as the agent saw it.
END_EXIT = "exit"  # it exited by itself, or after a stop order
END_TIMEOUT = "timeout"  # the agent stopped it at timeout_seconds
END_NEVER_STARTED = "never_started"  # stopped before it started, or could not start
END_LOST = "lost"  # the agent does not have it (restarted since)
END_REASONS = (END_EXIT, END_TIMEOUT, END_NEVER_STARTED, END_LOST)
LOG_TAIL_CHARS = 8000


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


# --- Written-out reads of the agent requests -------------------------------------------------
# Every poll and report reads its node and its orders; the ORM spent more CPU building those
# queries than PostgreSQL spent running them. Here the SQL is written once per process and
# prepared once per connection (portal.sql.prepared_cursor).


def _columns(*names: str) -> tuple[models.Field, ...]:
    """The fields named "model.field" (model: node, job, attempt, gpu, share), in order."""
    from shares.models import QuotaShare

    models_by_alias = {"node": Node, "job": Job, "attempt": JobAttempt, "gpu": GpuAssignment,
                       "share": QuotaShare}  # fmt: skip
    fields = []
    for name in names:
        alias, _, field = name.partition(".")
        fields.append(models_by_alias[alias]._meta.get_field(field))
    return tuple(fields)


def _in_model_order(fields: tuple[models.Field, ...]) -> tuple[models.Field, ...]:
    """`fields` of one model in the model's order, as Model.from_db() takes their values."""
    return tuple(f for f in fields[0].model._meta.concrete_fields if f in fields)


def _sql(template: str, fields: Sequence[models.Field]) -> str:
    """`template` with {columns} (`fields` as alias.column) and {table} placeholders
    ({job}, {attempt}, ... : the models' quoted table names) filled in."""
    from shares.models import QuotaShare

    quote = connection.ops.quote_name
    alias = {Node: "node", Job: "job", JobAttempt: "attempt", GpuAssignment: "gpu",
             QuotaShare: "share"}  # fmt: skip
    columns = ", ".join(f"{alias[f.model]}.{quote(f.column)}" for f in fields)
    tables = {name: quote(model._meta.db_table) for model, name in alias.items()}
    return template.format(columns=columns, **tables)


# What an agent request needs of its node (not its gpu_details nor labels).
_NODE_FIELDS = ("id", "name", "gpu_type", "gpus", "state", "last_heartbeat")


@cache
def _node_for_token_query() -> tuple[str, tuple[models.Field, ...]]:
    fields = _in_model_order(_columns(*(f"node.{name}" for name in _NODE_FIELDS)))
    template = (
        "SELECT {columns} FROM {node} node WHERE node.token_hash = %s ORDER BY node.id LIMIT 1"
    )
    return _sql(template, fields), fields


def node_for_token(token: str) -> Node | None:
    if not token:
        return None
    sql, fields = _node_for_token_query()
    rows = select_rows(sql, [hash_token(token)], fields)
    if not rows:
        return None
    return Node.from_db(DEFAULT_DB_ALIAS, [f.attname for f in fields], rows[0])


@transaction.atomic
def node_register(
    *, join_token: str, name: str, gpu_type: str, gpus: int, gpu_details: list[dict]
) -> tuple[Node, str]:
    """Register (or re-register) a node; returns it and its new token. The token is stored
    hashed; registering again replaces it, so a replaced agent's old token stops working.
    Raises PermissionError on a wrong join token."""
    expected = ClusterSettings.load().agent_join_token
    if not join_token or not secrets.compare_digest(join_token.encode(), expected.encode()):
        raise PermissionError(JOIN_TOKEN_INVALID)
    token = secrets.token_urlsafe(32)
    node, created = Node.objects.select_for_update().get_or_create(
        name=name,
        defaults={"gpu_type": gpu_type, "gpus": gpus},
    )
    node.gpu_type = gpu_type
    node.gpus = gpus
    node.gpu_details = gpu_details
    node.token_hash = hash_token(token)
    node.last_heartbeat = timezone.now()
    if node.state == Node.State.DOWN:
        node.state = Node.State.READY
    node.full_clean(exclude=["token_hash"])
    node.save()
    request_cycle()
    return node, token


def heartbeat_write_seconds() -> float:
    """How stale `last_heartbeat` may be before a heartbeat writes it again: a tenth of the
    heartbeat timeout. Every poll and report is a heartbeat; writing each one would cost a
    commit per agent request for nothing (the node is lost only after the whole timeout)."""
    return settings.NODE_HEARTBEAT_TIMEOUT_SECONDS / 10


@cache
def _heartbeat_sql() -> str:
    return _sql("UPDATE {node} SET last_heartbeat = %s WHERE id = %s", ())


def node_heartbeat(*, node: Node) -> None:
    """The agent is alive. A node marked DOWN for missing heartbeats is READY again. `node` is
    as loaded for this request (its `last_heartbeat` decides whether to write)."""
    now = timezone.now()
    last = node.last_heartbeat
    if last is None or (now - last).total_seconds() >= heartbeat_write_seconds():
        with prepared_cursor() as cursor:
            cursor.execute(
                _heartbeat_sql(), [connection.ops.adapt_datetimefield_value(now), node.pk]
            )
        node.last_heartbeat = now
    if node.state == Node.State.DOWN:
        with transaction.atomic():
            if Node.objects.filter(pk=node.pk, state=Node.State.DOWN).update(
                state=Node.State.READY
            ):
                request_cycle()
        node.state = Node.State.READY


@dataclass
class Orders:
    run: list[dict]
    stop: list[dict]

    def as_json(self) -> dict:
        return {"run": self.run, "stop": self.stop}


@cache
def _orders_query() -> tuple[str, tuple[models.Field, ...]]:
    fields = _columns(
        "gpu.gpu_index", "attempt.id", "attempt.number", "attempt.started_at",
        "attempt.stop_requested_at", "job.id", "job.state", "job.command", "job.env",
        "job.timeout_seconds", "share.grace_seconds",
    )  # fmt: skip
    template = (
        "SELECT {columns} FROM {gpu} gpu "
        "JOIN {attempt} attempt ON attempt.id = gpu.attempt_id "
        "JOIN {job} job ON job.id = attempt.job_id "
        "JOIN {share} share ON share.id = job.share_id "
        "WHERE gpu.node_id = %s AND gpu.released = %s AND attempt.ended_at IS NULL "
        "ORDER BY gpu.attempt_id, gpu.gpu_index"
    )
    return _sql(template, fields), fields


def node_orders(*, node: Node) -> Orders:
    """What the node should be doing: every attempt holding GPUs on it, to run or to stop.
    Orders are declarative; the agent reconciles them with what it runs (and kills what is
    in neither list, see `orphan_stops`). Delivering a run order moves its job from SCHEDULED to
    STARTING. One query while there is nothing to deliver (most polls)."""
    # One row per GPU held here, with what the order needs of its attempt and job.
    sql, fields = _orders_query()
    held = select_rows(sql, [node.pk, False], fields)
    run: list[dict] = []
    stop: list[dict] = []
    scheduled = []
    order: dict = {}  # the order of the attempt of the previous row
    for (
        index, attempt_id, number, started_at, stop_requested_at,
        job_id, job_state, command, env, timeout_seconds, grace,
    ) in held:  # fmt: skip
        if order.get("attempt") == attempt_id:
            if "gpu_indices" in order:
                order["gpu_indices"].append(index)
            continue
        if stop_requested_at is not None:
            order = {
                "attempt": attempt_id,
                "grace_seconds": grace,
                "started": started_at is not None,
            }
            stop.append(order)
            continue
        order = {
            "attempt": attempt_id,
            "job": job_id,
            "number": number,
            "command": command,
            "env": env,
            "gpu_indices": [index],
            "timeout_seconds": timeout_seconds,
            "grace_seconds": grace,
            # Already started once: an agent that does not have it lost it.
            "started": started_at is not None,
        }
        run.append(order)
        if job_state == Job.State.SCHEDULED:
            scheduled.append(job_id)
    if scheduled:
        # One transaction for all of them; rows locked in id order, as the cycle locks them.
        with transaction.atomic():
            reason = STARTING_REASON.format(node=node)
            changes = JobChanges()
            for job in _jobs_locked(_scheduled_lock_query(len(scheduled)),
                                    [Job.State.SCHEDULED, *scheduled]):  # fmt: skip
                changes.transition(job, to_state=Job.State.STARTING, reason=reason)
            changes.save()
    return Orders(run=run, stop=stop)


def orphan_stops(*, node: Node, running: set[int], orders: Orders) -> list[dict]:
    """Processes the agent runs that hold no GPUs here any more (their attempt ended, e.g. as
    NODE_LOST while the agent was cut off): stop them with their share's grace."""
    known = {o["attempt"] for o in orders.run} | {o["attempt"] for o in orders.stop}
    extra = running - known
    if not extra:
        return []
    graces = dict(
        JobAttempt.objects.filter(pk__in=extra).values_list("pk", "job__share__grace_seconds")
    )
    return [{"attempt": a, "grace_seconds": graces.get(a, 0)} for a in sorted(extra)]


# --- What became of the attempts ------------------------------------------------------------

# What the reports read and write of an attempt, and of its job.
_ATTEMPT_FIELDS = (
    "job_id", "number", "allocations", "started_at", "stop_requested_at", "ended_at", "outcome",
    "exit_code", "preempted_for_id",
)  # fmt: skip
_JOB_FIELDS = (
    *JobChanges.FIELDS, "max_preemptions", "retry_attempts", "cancel_requested", "timeout_seconds",
)  # fmt: skip


def _placeholders(count: int) -> str:
    return ", ".join(["%s"] * count)


def _job_lock_query(condition: str) -> tuple[str, tuple[models.Field, ...]]:
    """The jobs that meet `condition` (SQL about `job`), locked in id order, as Jobs with
    _JOB_FIELDS loaded."""
    fields = _in_model_order(_columns("job.id", *(f"job.{name}" for name in _JOB_FIELDS)))
    lock = " FOR UPDATE OF job" if connection.features.has_select_for_update_of else ""
    template = f"SELECT {{columns}} FROM {{job}} job WHERE {condition} ORDER BY job.id{lock}"
    return _sql(template, fields), fields


def _jobs_locked(query: tuple[str, tuple[models.Field, ...]], params: Sequence) -> list[Job]:
    sql, columns = query
    names = [field.attname for field in columns]
    return [Job.from_db(DEFAULT_DB_ALIAS, names, row) for row in select_rows(sql, params, columns)]


@cache
def _jobs_lock_query(count: int) -> tuple[str, tuple[models.Field, ...]]:
    """The jobs of `count` attempts."""
    return _job_lock_query(
        f"job.id IN (SELECT job_id FROM {{attempt}} WHERE id IN ({_placeholders(count)}))"
    )


@cache
def _scheduled_lock_query(count: int) -> tuple[str, tuple[models.Field, ...]]:
    """`count` jobs, those still in a state (the first parameter)."""
    return _job_lock_query(f"job.state = %s AND job.id IN ({_placeholders(count)})")


@cache
def _holders_query(count: int) -> tuple[str, tuple[models.Field, ...]]:
    """The nodes where `count` attempts (given twice) hold GPUs, with their _ATTEMPT_FIELDS."""
    fields = _columns("gpu.node", "gpu.attempt", *(f"attempt.{name}" for name in _ATTEMPT_FIELDS))
    template = (
        "SELECT {columns} FROM {gpu} gpu JOIN {attempt} attempt ON attempt.id = gpu.attempt_id "
        f"WHERE gpu.released = %s AND gpu.attempt_id IN ({_placeholders(count)}) "
        # The same ids again, on the attempts' primary key: without it PostgreSQL may hash the
        # GPUs' rows against a scan of every attempt ever run (seen without table statistics,
        # a scan per report).
        f"AND attempt.id IN ({_placeholders(count)})"
    )
    return _sql(template, fields), fields


@cache
def _release_sql(count: int) -> str:
    """Release the GPUs `count` attempts hold on a node."""
    return _sql(
        "UPDATE {gpu} SET released = %s WHERE node_id = %s AND released = %s "
        f"AND attempt_id IN ({_placeholders(count)})",
        (),
    )


def attempt_started(*, node: Node, attempt_id: int) -> str:
    """The agent started the attempt's command: the job is RUNNING."""
    (result,) = node_report(node=node, events=[{"type": EVENT_STARTED, "attempt": attempt_id}])
    return result


def attempt_log(*, node: Node, attempt_id: int, log_tail: str) -> str:
    event = {"type": EVENT_LOG, "attempt": attempt_id, "log": log_tail}
    (result,) = node_report(node=node, events=[event])
    return result


def attempt_exited(
    *,
    node: Node,
    attempt_id: int,
    end: str,
    exit_code: int | None = None,
    signalled: bool = False,
    log_tail: str = "",
    detail: str = "",
) -> str:
    """The attempt's process on this node ended. Releases its GPUs here; when no node of the
    attempt holds GPUs any more, the attempt ends with its outcome and the job moves on:
    SUCCEEDED, FAILED (or RUNNABLE for a retry), RUNNABLE after a preemption (or FAILED past
    max_preemptions), CANCELLED. `signalled`: the agent had sent SIGTERM before the exit.
    Returns "ok", or "ignored" for a report that no longer applies (replayed, stale)."""
    event = {
        "type": EVENT_EXITED,
        "attempt": attempt_id,
        "end": end,
        "exit_code": exit_code,
        "signalled": signalled,
        "log": log_tail,
        "detail": detail,
    }
    (result,) = node_report(node=node, events=[event])
    return result


def node_report(*, node: Node, events: list[dict]) -> list[str]:
    """Apply what a node's agent reports, in order: events {type: started|log|exited, attempt,
    log (its log tail), and for an exit: end, exit_code, signalled, detail} (see
    `attempt_started`, `attempt_log`, `attempt_exited`). Returns "ok" or "ignored" (a replay,
    a stale report) for each.

    Events about distinct attempts do not depend on each other: a run of them is applied in one
    transaction, with a statement per kind of read and write (on PostgreSQL) however many
    there are; their jobs are locked in one statement, in id order, as the cycle locks jobs
    (a run of log tails alone, which change no state, takes no lock). An event about an
    attempt already in the run starts the next run, so it sees what the earlier one did."""
    results: list[str] = []
    batch: list[dict] = []
    for event in events:
        if any(e["attempt"] == event["attempt"] for e in batch):
            results += _apply_reports(node, batch)
            batch = []
        batch.append(event)
    if batch:
        results += _apply_reports(node, batch)
    return results


def _apply_reports(node: Node, events: list[dict]) -> list[str]:
    """Apply events about distinct attempts (see `node_report`)."""
    if all(event["type"] == EVENT_LOG for event in events):
        return _apply_logs(node, events)
    with transaction.atomic():
        return _apply_changes(node, events)


def _apply_logs(node: Node, events: list[dict]) -> list[str]:
    """Log tails change no state: no lock, each written only while its attempt runs."""
    held = set(
        GpuAssignment.objects.filter(
            node=node, attempt_id__in=[event["attempt"] for event in events], released=False
        ).values_list("attempt_id", flat=True)
    )
    for event in events:
        if event["attempt"] in held:
            JobAttempt.objects.filter(pk=event["attempt"], ended_at__isnull=True).update(
                log_tail=event["log"][-LOG_TAIL_CHARS:]
            )
    return ["ok" if event["attempt"] in held else "ignored" for event in events]


def _apply_changes(node: Node, events: list[dict]) -> list[str]:
    """Apply events about distinct attempts, some of them starts or exits, in the caller's
    transaction."""
    ids = [event["attempt"] for event in events]
    # Their jobs first, in id order, as the cycle locks jobs before it writes their attempts
    # and GPUs. The attempts need no lock of their own: every other write to them or their
    # GPUs holds the job's lock too, except a cancel's stop order, which only fills in an
    # unset stop_requested_at.
    jobs = {job.pk: job for job in _jobs_locked(_jobs_lock_query(len(ids)), ids)}
    # Then, read under those locks, the GPUs the attempts hold, with the attempts: an attempt
    # that holds none on this node has nothing to report here.
    holders: dict[int, set[int]] = defaultdict(set)
    attempts: dict[int, JobAttempt] = {}
    sql, columns = _holders_query(len(ids))
    for node_id, attempt_id, *values in select_rows(sql, [False, *ids, *ids], columns):
        holders[attempt_id].add(node_id)
        if attempt_id not in attempts:
            fields = dict(zip(_ATTEMPT_FIELDS, values, strict=True))
            attempts[attempt_id] = JobAttempt(
                pk=attempt_id, job=jobs[fields.pop("job_id")], **fields
            )
    exits_here = [
        event["attempt"]
        for event in events
        if event["type"] == EVENT_EXITED and node.pk in holders[event["attempt"]]
    ]
    if exits_here:
        with prepared_cursor() as cursor:
            cursor.execute(_release_sql(len(exits_here)), [True, node.pk, False, *exits_here])
    now = timezone.now()
    changes = JobChanges()
    written: dict[int, set[str]] = defaultdict(set)  # attempt id → the fields events changed
    notify: set[int] = set()
    ended = False
    results = []
    for event in events:
        attempt = attempts.get(event["attempt"])
        if attempt is None or node.pk not in holders[attempt.pk]:
            results.append("ignored")
            continue
        if event["type"] == EVENT_LOG:
            if attempt.ended_at is None:
                attempt.log_tail = event["log"][-LOG_TAIL_CHARS:]
                written[attempt.pk].add("log_tail")
            results.append("ok")
            continue
        if attempt.ended_at is not None:
            results.append("ignored")
            continue
        if event["type"] == EVENT_STARTED:
            written[attempt.pk] |= _mark_started(attempt, changes, now=now)
        else:
            others = holders[attempt.pk] - {node.pk}
            fields = _mark_exited(attempt, event, changes, node=node, others=others, now=now)
            if "stop_requested_at" in fields:
                notify |= others  # the gang's other nodes get their stop orders now
            written[attempt.pk] |= fields
            ended = ended or attempt.ended_at is not None
        results.append("ok")
    by_fields: dict[tuple[str, ...], list[JobAttempt]] = defaultdict(list)
    for attempt_id, names in written.items():
        if names:
            by_fields[tuple(sorted(names))].append(attempts[attempt_id])
    for names, group in by_fields.items():
        rows_update(JobAttempt, names, [(a.pk, *(getattr(a, n) for n in names)) for a in group])
    changes.save()
    if notify:
        from scheduler.notify import notify_nodes

        transaction.on_commit(lambda: notify_nodes(notify))
    if ended:
        request_cycle()
    return results


def _mark_started(attempt: JobAttempt, changes: JobChanges, *, now) -> set[str]:
    """The attempt's process runs (or ran): started_at, and the job RUNNING. Returns the
    attempt fields written."""
    job = attempt.job
    if job.state in (Job.State.SCHEDULED, Job.State.STARTING):
        changes.transition(
            job,
            to_state=Job.State.RUNNING,
            reason=RUNNING_REASON.format(
                where=", ".join(
                    f"{a['node']} (GPU {','.join(map(str, a['gpu_indices']))})"
                    for a in attempt.allocations
                )
            ),
            started_at=job.started_at or now,
        )
    if attempt.started_at is not None:
        return set()
    attempt.started_at = now
    return {"started_at"}


def _mark_exited(
    attempt: JobAttempt, event: dict, changes: JobChanges, *, node: Node, others: set[int], now
) -> set[str]:
    """The attempt's process on `node` ended and its GPUs there are released; `others`: the
    nodes where the attempt still holds GPUs (a gang). Returns the attempt fields written."""
    end, exit_code = event["end"], event["exit_code"]
    written = set()
    if attempt.started_at is None and end in (END_EXIT, END_TIMEOUT):
        # Its process ran: an exit whose "started" report has not arrived yet (it may come
        # on another request, later; it is then ignored) implies the start.
        written |= _mark_started(attempt, changes, now=now)
    if event["log"]:
        attempt.log_tail = event["log"][-LOG_TAIL_CHARS:]
        written.add("log_tail")
    outcome = _outcome(attempt, end=end, exit_code=exit_code, signalled=event["signalled"])
    if exit_code is not None and (attempt.exit_code is None or attempt.exit_code == 0):
        attempt.exit_code = exit_code
        written.add("exit_code")
    if others:
        # A gang: one node's end that fails the attempt stops the others.
        if outcome in (JobAttempt.Outcome.FAILED, JobAttempt.Outcome.TIMEOUT) or (end == END_LOST):
            attempt.outcome = attempt.outcome or outcome
            written.add("outcome")
            if attempt.stop_requested_at is None:
                attempt.stop_requested_at = now
                written.add("stop_requested_at")
        return written
    if attempt.outcome in (
        JobAttempt.Outcome.FAILED,
        JobAttempt.Outcome.TIMEOUT,
        JobAttempt.Outcome.NODE_LOST,
    ):
        # Decided by an earlier node of the gang; the others only exited from the stop
        # order that decision sent them (a SIGTERM's exit code is not a failure).
        outcome = attempt.outcome
    if attempt.job.cancel_requested:
        outcome = JobAttempt.Outcome.CANCELLED
    attempt.outcome = outcome
    attempt.ended_at = now
    attempt.end_reason = _job_after(
        attempt.job, attempt, outcome, changes, node=node, detail=event["detail"]
    )
    return written | {"outcome", "ended_at", "end_reason"}


def _outcome(attempt: JobAttempt, *, end: str, exit_code: int | None, signalled: bool) -> str:
    if end == END_LOST:
        return JobAttempt.Outcome.NODE_LOST
    if end == END_TIMEOUT:
        return JobAttempt.Outcome.TIMEOUT
    if attempt.stop_requested_at is not None and attempt.preempted_for_id is not None:
        # A job that finished on its own before its SIGTERM succeeded all the same.
        if exit_code == 0 and not signalled:
            return JobAttempt.Outcome.SUCCEEDED
        return JobAttempt.Outcome.PREEMPTED
    if end == END_NEVER_STARTED:
        return (
            JobAttempt.Outcome.PREEMPTED
            if attempt.stop_requested_at is not None
            else JobAttempt.Outcome.FAILED
        )
    if exit_code == 0:
        return JobAttempt.Outcome.SUCCEEDED
    return JobAttempt.Outcome.FAILED


def _job_after(
    job: Job, attempt: JobAttempt, outcome: str, changes: JobChanges, *, node: Node, detail: str
) -> str:
    """Move the job on after its attempt ended (`outcomes.after_attempt`); returns the reason,
    for the attempt too."""
    if job.state not in Job.PLACED_STATES:
        return f"attempt ended ({outcome}) while the job was {job.state}"
    step = outcomes.after_attempt(
        outcome,
        preemptions=job.preemption_count,
        failures=job.failure_count,
        max_preemptions=job.max_preemptions,
        retry_attempts=job.retry_attempts,
        exit_code=attempt.exit_code,
        timeout_seconds=job.timeout_seconds,
        node=node.name,
        detail=detail,
    )
    counts = {}
    if step.preemptions != job.preemption_count:
        counts["preemption_count"] = step.preemptions
    if step.failures != job.failure_count:
        counts["failure_count"] = step.failures
    changes.transition(job, to_state=step.state, reason=step.reason, **counts)
    return step.reason


def poll_wait_seconds(requested: float | None) -> float:
    """How long a long poll may wait: what the agent asks, capped well below the heartbeat
    timeout (each poll is the node's heartbeat)."""
    cap = settings.AGENT_POLL_MAX_WAIT_SECONDS
    if requested is None:
        return cap
    return max(0.0, min(float(requested), cap))
