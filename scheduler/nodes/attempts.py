"""What became of each attempt, as node agents report it (started, log tail, exited), and
what an attempt's end does to its job (`scheduler.engine.outcomes`). Reports may arrive late,
twice or out of order (an agent retries after the portal was unreachable): every write is
conditional on the attempt still holding GPUs on the reporting node, so a replayed or stale
report changes nothing."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from portal.db.bulk import rows_update
from portal.db.sql import converted_row, prepared_cursor, select_rows
from scheduler.agent.protocol import (
    END_EXIT,
    END_LOST,
    END_NEVER_STARTED,
    END_TIMEOUT,
    END_WITHDRAWN,
    EVENT_CHECKPOINT,
    EVENT_EXITED,
    EVENT_LOG,
    EVENT_STARTED,
    LOG_TAIL_CHARS,
)
from scheduler.cycle.orders import new_stop_orders, stop_order
from scheduler.cycle.trigger import request_cycle
from scheduler.cycle.wake import notify_nodes
from scheduler.engine import outcomes
from scheduler.models import GpuAssignment, Job, JobAttempt, Node
from scheduler.nodes import queries
from scheduler.transitions import Transitions

STARTING_REASON = "order delivered to {node}; starting"
RUNNING_REASON = "running on {where}"


def attempts_start(*, node: Node, attempt_ids: set[int]) -> set[int]:
    """The node's agent has these attempts' run orders and asks to start them: it starts only
    those this grants. An attempt whose stop was ordered first (a preemption or a cancel that
    reached the portal before the agent could start it) is never started: its agent reports it
    never started and its GPUs are released. A granted attempt is started now: its job goes
    STARTING (the order was delivered: the agent has it) and RUNNING; asking again, after an
    answer that was lost, grants it again. Returns the ids granted."""
    if not attempt_ids:
        return set()
    # Attempts already started (on another node of their gang, or before an answer that was
    # lost) change no job: the UPDATE's own condition grants them, without their job's lock,
    # which the nodes of a large gang would otherwise queue on, one database thread each.
    sql, fields = queries.start_query(len(attempt_ids), started=True)
    ids = sorted(attempt_ids)
    again = {row[0] for row in select_rows(sql, [timezone.now(), node.pk, False, *ids], fields)}
    ids = [attempt_id for attempt_id in ids if attempt_id not in again]
    if not ids:
        return again
    with transaction.atomic():
        # The jobs first, in id order, as the cycle locks them before it orders a stop.
        jobs = {job.pk: job for job in queries.jobs_locked(queries.jobs_lock_query(len(ids)), ids)}
        now = timezone.now()
        sql, fields = queries.start_query(len(ids))
        started = select_rows(sql, [now, node.pk, False, *ids], fields)
        changes = Transitions()
        for _attempt_id, job_id, allocations in started:
            _job_running(jobs[job_id], allocations, changes, node=node, now=now)
        changes.save()
    return again | {attempt_id for attempt_id, _job_id, _allocations in started}


def stops_ordered_first(*, node: Node, attempt_ids: set[int]) -> list[dict]:
    """The stop orders of those of `attempt_ids` that hold GPUs here and whose stop was ordered
    before they could start (`attempts_start` refused them): the answer to the agent's start
    carries them, so it reports them never started at once instead of after its next poll."""
    if not attempt_ids:
        return []
    held = (
        GpuAssignment.objects.filter(
            node=node, released=False, attempt_id__in=attempt_ids,
            attempt__ended_at__isnull=True, attempt__stop_requested_at__isnull=False,
        )
        .values_list("attempt_id", "attempt__started_at", "attempt__job__share__grace_seconds")
        .order_by("attempt_id")
        .distinct()
    )  # fmt: skip
    return [
        stop_order(attempt_id, grace_seconds=grace, started=started_at is not None)
        for attempt_id, started_at, grace in held
    ]


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
    """Apply what a node's agent reports, in order: events {type: started|log|exited|checkpoint,
    attempt, log (its log tail), for an exit: end, exit_code, signalled, detail, and for a
    checkpoint: age (seconds since it was saved)} (see `attempt_started`, `attempt_log`,
    `attempt_exited`). Returns "ok" or "ignored" (a replay, a stale report) for each.

    Events about distinct attempts do not depend on each other: a run of them is applied in one
    transaction, with a statement per kind of read and write (on PostgreSQL) however many
    there are; their jobs are locked in one statement, in id order, as the cycle locks jobs
    (a run of log tails alone, which change no state, takes no lock). An event about an
    attempt already in the run starts the next run, so it sees what the earlier one did."""
    (results,) = nodes_report([(node, events)])
    return results


def nodes_report(reports: list[tuple[Node, list[dict]]]) -> list[list[str]]:
    """Apply several nodes' reports (`node_report`), in order, with what each gives, as if one
    came after the other. Where no node's report names an attempt twice, they are applied
    together, in one transaction: the ends of a gang's attempt that its nodes report at the same
    moment lock its job and read its GPUs once, not once per node."""
    if len(reports) > 1 and all(_distinct(events) for _, events in reports):
        if all(e["type"] in QUIET_EVENTS for _, events in reports for e in events):
            return _apply_quiet(reports)
        with transaction.atomic():
            return _apply_changes(reports)
    return [_node_report(node, events) for node, events in reports]


def _distinct(events: list[dict]) -> bool:
    return len({event["attempt"] for event in events}) == len(events)


def _node_report(node: Node, events: list[dict]) -> list[str]:
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
    if all(event["type"] in QUIET_EVENTS for event in events):
        (results,) = _apply_quiet([(node, events)])
        return results
    with transaction.atomic():
        (results,) = _apply_changes([(node, events)])
        return results


# Events that change no job's state: applied without a lock.
QUIET_EVENTS = (EVENT_LOG, EVENT_CHECKPOINT)


def _apply_quiet(reports: list[tuple[Node, list[dict]]]) -> list[list[str]]:
    """Log tails and checkpoints change no job's state: no lock, each taken only from a node
    where its attempt holds GPUs, and written only while the attempt runs. Of the log tails
    of one attempt (a gang's nodes send theirs at the same moment) the last is written."""
    ids = {event["attempt"] for _, events in reports for event in events}
    held = set(
        GpuAssignment.objects.filter(
            node_id__in={node.pk for node, _ in reports}, attempt_id__in=ids, released=False
        ).values_list("node_id", "attempt_id")
    )
    now = timezone.now()
    logs: dict[int, dict] = {}  # attempt id → its last log tail
    answers = []
    for node, events in reports:
        results = []
        for event in events:
            if (node.pk, event["attempt"]) not in held:
                results.append("ignored")
                continue
            if event["type"] == EVENT_LOG:
                logs[event["attempt"]] = event
            else:
                _apply_quiet_event(event, now)
            results.append("ok")
        answers.append(results)
    for event in logs.values():
        _apply_quiet_event(event, now)
    return answers


def _apply_quiet_event(event: dict, now) -> None:
    open_attempt = JobAttempt.objects.filter(pk=event["attempt"], ended_at__isnull=True)
    if event["type"] == EVENT_LOG:
        open_attempt.update(log_tail=event["log"][-LOG_TAIL_CHARS:])
        return
    # A checkpoint: only a later one than the portal knows moves it (reports may come twice,
    # or out of order).
    saved = now - timedelta(seconds=event["age"])
    open_attempt.filter(
        Q(last_checkpoint_at__isnull=True) | Q(last_checkpoint_at__lt=saved)
    ).update(last_checkpoint_at=saved)


def _apply_changes(reports: list[tuple[Node, list[dict]]]) -> list[list[str]]:
    """Apply nodes' reports, each of events about distinct attempts, some of them starts or
    exits, in order, in the caller's transaction."""
    ids = sorted({event["attempt"] for _, events in reports for event in events})
    # Their jobs first, in id order, as the cycle locks jobs before it writes their attempts
    # and GPUs. The attempts need no lock of their own: every other write to them or their
    # GPUs holds the job's lock too, except a cancel's stop order, which only fills in an
    # unset stop_requested_at.
    jobs = {job.pk: job for job in queries.jobs_locked(queries.jobs_lock_query(len(ids)), ids)}
    # Then, read under those locks, the GPUs the attempts hold, with the attempts: an attempt
    # that holds none on a node has nothing to report there.
    holders: dict[int, set[int]] = defaultdict(set)
    attempts: dict[int, JobAttempt] = {}
    sql, columns = queries.holders_query(len(ids))
    for row in select_rows(sql, [False, *ids, *ids], columns, convert=False):
        node_id, attempt_id = row[0], row[1]
        holders[attempt_id].add(node_id)
        if attempt_id not in attempts:  # its values are decoded once, not once per node
            values = converted_row(row, columns)[2:]
            fields = dict(zip(queries.ATTEMPT_FIELDS, values, strict=True))
            attempts[attempt_id] = JobAttempt(
                pk=attempt_id, job=jobs[fields.pop("job_id")], **fields
            )
    _release(reports, holders)
    now = timezone.now()
    changes = Transitions()
    written: dict[int, set[str]] = defaultdict(set)  # attempt id → the fields events changed
    gang_stops: set[int] = set()  # attempts whose other nodes get their stop orders now
    ended = False
    answers = []
    for node, events in reports:
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
            if event["type"] == EVENT_CHECKPOINT:
                _apply_quiet_event(event, now)
                results.append("ok")
                continue
            if attempt.ended_at is not None:
                results.append("ignored")
                continue
            if event["type"] == EVENT_STARTED:
                written[attempt.pk] |= _mark_started(attempt, changes, node=node, now=now)
            else:
                holders[attempt.pk].discard(node.pk)  # released (`_release`)
                others = holders[attempt.pk]
                fields = _mark_exited(attempt, event, changes, node=node, others=others, now=now)
                if "stop_requested_at" in fields:
                    gang_stops.add(attempt.pk)
                written[attempt.pk] |= fields
                ended = ended or attempt.ended_at is not None
            results.append("ok")
        answers.append(results)
    by_fields: dict[tuple[str, ...], list[JobAttempt]] = defaultdict(list)
    for attempt_id, names in written.items():
        if names:
            by_fields[tuple(sorted(names))].append(attempts[attempt_id])
    for names, group in by_fields.items():
        rows_update(JobAttempt, names, [(a.pk, *(getattr(a, n) for n in names)) for a in group])
    changes.save()
    if gang_stops:
        # To the nodes that still hold them: those whose ends are reported released theirs.
        orders = new_stop_orders(gang_stops)
        transaction.on_commit(lambda: notify_nodes((), orders=orders))
    if ended:
        request_cycle()
    return answers


def _release(reports: list[tuple[Node, list[dict]]], holders: dict[int, set[int]]) -> None:
    """Release the GPUs of the attempts whose ends the nodes report, where they hold them: one
    statement per set of attempts (the nodes of a gang report the end of the same one)."""
    nodes_by_exits: dict[tuple[int, ...], set[int]] = defaultdict(set)
    for node, events in reports:
        exits = tuple(
            sorted(
                event["attempt"]
                for event in events
                if event["type"] == EVENT_EXITED and node.pk in holders[event["attempt"]]
            )
        )
        if exits:
            nodes_by_exits[exits].add(node.pk)
    with prepared_cursor() as cursor:
        for exits, node_ids in nodes_by_exits.items():
            cursor.execute(
                queries.release_sql(len(exits), nodes=len(node_ids)),
                [True, *sorted(node_ids), False, *exits],
            )


def _mark_started(attempt: JobAttempt, changes: Transitions, *, node: Node, now) -> set[str]:
    """The attempt's process runs (or ran) on `node`: started_at, and the job RUNNING. Returns
    the attempt fields written."""
    _job_running(attempt.job, attempt.allocations, changes, node=node, now=now)
    if attempt.started_at is not None:
        return set()
    attempt.started_at = now
    return {"started_at"}


def _job_running(
    job: Job, allocations: list[dict], changes: Transitions, *, node: Node, now
) -> None:
    """The job's attempt (on `allocations`) runs, as `node`'s agent says: the job is RUNNING,
    unless it already is or has moved on. A SCHEDULED job goes through STARTING: its order
    reached the agent (every state change is recorded, DESIGN §2)."""
    if job.state == Job.State.SCHEDULED:
        changes.move(job, to_state=Job.State.STARTING, reason=STARTING_REASON.format(node=node))
    if job.state == Job.State.STARTING:
        where = ", ".join(
            f"{a['node']} (GPU {','.join(map(str, a['gpu_indices']))})" for a in allocations
        )
        changes.move(
            job,
            to_state=Job.State.RUNNING,
            reason=RUNNING_REASON.format(where=where),
            started_at=job.started_at or now,
        )


def _mark_exited(
    attempt: JobAttempt, event: dict, changes: Transitions, *, node: Node, others: set[int], now
) -> set[str]:
    """The attempt's process on `node` ended and its GPUs there are released; `others`: the
    nodes where the attempt still holds GPUs (a gang). Returns the attempt fields written."""
    end, exit_code = event["end"], event["exit_code"]
    written = set()
    if attempt.started_at is None and end in (END_EXIT, END_TIMEOUT):
        # Its process ran: an exit whose "started" report has not arrived yet (it may come
        # on another request, later; it is then ignored) implies the start.
        written |= _mark_started(attempt, changes, node=node, now=now)
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
    attempt.end_reason = _move_job_on(
        attempt.job, attempt, outcome, changes, node=node, detail=event["detail"]
    )
    return written | {"outcome", "ended_at", "end_reason"}


def _outcome(attempt: JobAttempt, *, end: str, exit_code: int | None, signalled: bool) -> str:
    if end == END_LOST:
        return JobAttempt.Outcome.NODE_LOST
    if end == END_TIMEOUT:
        return JobAttempt.Outcome.TIMEOUT
    if end == END_WITHDRAWN:
        return (
            JobAttempt.Outcome.PREEMPTED
            if attempt.stop_requested_at is not None
            else JobAttempt.Outcome.WITHDRAWN
        )
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


def _move_job_on(
    job: Job, attempt: JobAttempt, outcome: str, changes: Transitions, *, node: Node, detail: str
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
    if step.preemption:
        counts["preemption_count"] = job.preemption_count + 1
    if step.failure:
        counts["failure_count"] = job.failure_count + 1
    changes.move(job, to_state=step.state, reason=step.reason, **counts)
    return step.reason
