"""Attempts told to stop before any agent was granted their start end at once (docs/semantics.md,
"A victim that has not started yet"): nothing runs them, and nothing will, since a start is
granted only to an attempt whose stop was not ordered. The cycle ends them when it orders the
stop (a preemption, `scheduler.cycle.apply`; a cancel, `scheduler.cycle.housekeeping`) instead
of waiting for their agents to ask to start and report that they never did."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.db.models import F

from scheduler.cycle.result import CycleResult
from scheduler.engine import outcomes
from scheduler.models import GpuAssignment, Job, JobAttempt
from scheduler.transitions import Transitions


def attempts_end_unstarted(
    attempts: list[JobAttempt], *, outcome: str, now: datetime, result: CycleResult
) -> set[int]:
    """Of `attempts` (with pk, job_id and started_at), whose stop was just ordered at `now`
    under their jobs' locks (which a start grant takes too), end those no agent was granted
    yet and whose nodes' agents all ask before they start (`Node.asks_to_start`; one that does
    not may be starting it): with `outcome` (PREEMPTED or CANCELLED), their GPUs released and
    their jobs moved on from PREEMPTING (`outcomes.after_stop_before_start`). Their nodes'
    waiting polls read their orders again (a run order the agent may hold is gone). Returns
    their ids: they get no stop order."""
    unstarted = {a.pk: a for a in attempts if a.started_at is None}
    if not unstarted:
        return set()
    held = list(
        GpuAssignment.objects.filter(attempt_id__in=unstarted, released=False)
        .values_list("attempt_id", "node_id", "node__asks_to_start")
        .distinct()
    )
    unsure = {attempt_id for attempt_id, _node_id, asks in held if not asks}
    ending = [a for pk, a in unstarted.items() if pk not in unsure]
    if not ending:
        return set()
    ended = {a.pk for a in ending}
    GpuAssignment.objects.filter(attempt_id__in=ended, released=False).update(released=True)
    result.nodes_to_notify |= {node_id for attempt_id, node_id, _ in held if attempt_id in ended}
    counts = {
        pk: (preemptions, limit)
        for pk, preemptions, limit in Job.objects.filter(
            pk__in={a.job_id for a in ending}
        ).values_list("pk", "preemption_count", "max_preemptions")
    }
    moves: dict[tuple[str, bool], list[tuple[int, str, str]]] = defaultdict(list)
    for attempt in ending:
        preemptions, limit = counts[attempt.job_id]
        step = outcomes.after_stop_before_start(
            outcome, preemptions=preemptions, max_preemptions=limit
        )
        attempt.outcome = outcome
        attempt.ended_at = now
        attempt.end_reason = step.reason
        moves[step.state, step.preemption].append(
            (attempt.job_id, Job.State.PREEMPTING, step.reason)
        )
    JobAttempt.objects.bulk_update(ending, ["outcome", "ended_at", "end_reason"], batch_size=500)
    transitions = Transitions()
    for (to_state, preemption), changes in moves.items():
        counted = {"preemption_count": F("preemption_count") + 1} if preemption else {}
        transitions.move_rows(to_state=to_state, changes=changes, **counted)
    transitions.save()
    return ended
