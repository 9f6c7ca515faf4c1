"""What follows the end of a job's attempt (DESIGN §2 "Job states"): the job's next state and
the reason a person reads.

One place for the rules that the live system (`scheduler.nodes.attempts`, when an agent
reports an exit) and the simulator (when a preempted job's grace period ends) both follow:

- SUCCEEDED ends the job; CANCELLED ends it;
- PREEMPTED requeues it and counts a preemption; past `max_preemptions` it fails instead
  (`max_preemptions = N`: requeued after its first N preemptions, failed at the next one),
  also when the attempt had not started yet and the portal ended it at once;
- NODE_LOST requeues it and counts nothing (a job being cancelled ends CANCELLED instead);
- WITHDRAWN (a cluster manager would not start it on the GPUs the portal gave it) requeues it
  and counts nothing;
- TIMEOUT fails it (timeouts are not retried);
- FAILED requeues it while retries are left (`retry_attempts`), and counts a failure.
"""

from __future__ import annotations

from dataclasses import dataclass

# An attempt's outcome.
SUCCEEDED = "SUCCEEDED"
FAILED = "FAILED"
PREEMPTED = "PREEMPTED"
NODE_LOST = "NODE_LOST"
TIMEOUT = "TIMEOUT"
CANCELLED = "CANCELLED"
WITHDRAWN = "WITHDRAWN"
OUTCOMES = (SUCCEEDED, FAILED, PREEMPTED, NODE_LOST, TIMEOUT, CANCELLED, WITHDRAWN)

# The job's next state (the values of scheduler.models.Job.State).
RUNNABLE = "RUNNABLE"

SUCCEEDED_REASON = "exited with code 0"
FAILED_FINAL_REASON = "exited with code {code}; no retries left ({retries} allowed)"
FAILED_RETRY_REASON = "exited with code {code}; retry {retry} of {retries}"
NEVER_STARTED_FAILED = "{node} could not start the command: {detail}"
TIMEOUT_REASON = "timed out after {seconds} s (timeout_seconds); stopped"
PREEMPTED_REQUEUE_REASON = "preempted ({count} so far); requeued, resumes from its checkpoint"
PREEMPTED_FINAL_REASON = "preempted {count} times; max_preemptions is {limit}"
CANCELLED_REASON = "cancelled; stopped on {node}"
LOST_REASON = "lost on {node}: {detail}; requeued"
LOST_DEFAULT_DETAIL = "its agent no longer has the job (agent restarted)"
WITHDRAWN_REASON = "{node} would not start it ({detail}); withdrawn and requeued"
NODE_SILENT_REASON = "node {node} lost (no heartbeat for {seconds:g} s); requeued"
NODE_SILENT_CANCELLED = "node {node} lost while the job was being cancelled"
NOT_STARTED_REASON = "{reason} (it had not started: its GPUs were released at once)"
CANCELLED_NOT_STARTED_REASON = "cancelled before it started; its GPUs were released at once"


@dataclass(frozen=True, slots=True)
class NextStep:
    """The job after its attempt: its state, why, and whether the attempt counts as one more
    preemption or one more failure of the job."""

    state: str
    reason: str
    preemption: bool = False
    failure: bool = False


def after_preemption(*, preemptions: int, max_preemptions: int | None) -> NextStep:
    """A preempted attempt (`preemptions`: the job's count before this one)."""
    count = preemptions + 1
    if max_preemptions is not None and count > max_preemptions:
        reason = PREEMPTED_FINAL_REASON.format(count=count, limit=max_preemptions)
        return NextStep(FAILED, reason, preemption=True)
    return NextStep(RUNNABLE, PREEMPTED_REQUEUE_REASON.format(count=count), preemption=True)


def after_stop_before_start(
    outcome: str, *, preemptions: int, max_preemptions: int | None
) -> NextStep:
    """An attempt whose stop was ordered before any agent started it, which the portal ends at
    once (PREEMPTED or CANCELLED): a preemption counts as one (`after_preemption`); a cancel
    ends the job."""
    if outcome == CANCELLED:
        return NextStep(CANCELLED, CANCELLED_NOT_STARTED_REASON)
    step = after_preemption(preemptions=preemptions, max_preemptions=max_preemptions)
    return NextStep(step.state, NOT_STARTED_REASON.format(reason=step.reason), preemption=True)


def after_node_lost(*, node: str, silent_seconds: float, cancel_requested: bool) -> NextStep:
    """The job's attempt ended NODE_LOST because `node` sent no heartbeat for `silent_seconds`."""
    if cancel_requested:
        return NextStep(CANCELLED, NODE_SILENT_CANCELLED.format(node=node))
    return NextStep(RUNNABLE, NODE_SILENT_REASON.format(node=node, seconds=silent_seconds))


def after_attempt(
    outcome: str,
    *,
    preemptions: int,
    failures: int,
    max_preemptions: int | None,
    retry_attempts: int,
    exit_code: int | None,
    timeout_seconds: int | None,
    node: str,
    detail: str = "",
) -> NextStep:
    """The job's next step after an attempt that ended with `outcome` on `node` (the last node
    of a gang to report), given its counts so far and its settings. `detail`: why the command
    could not start, when it never did, or why it was lost."""
    if outcome == PREEMPTED:
        return after_preemption(preemptions=preemptions, max_preemptions=max_preemptions)
    if outcome == CANCELLED:
        return NextStep(CANCELLED, CANCELLED_REASON.format(node=node))
    if outcome == SUCCEEDED:
        return NextStep(SUCCEEDED, SUCCEEDED_REASON)
    if outcome == NODE_LOST:
        detail = detail or LOST_DEFAULT_DETAIL
        return NextStep(RUNNABLE, LOST_REASON.format(node=node, detail=detail))
    if outcome == WITHDRAWN:
        return NextStep(RUNNABLE, WITHDRAWN_REASON.format(node=node, detail=detail))
    if outcome == TIMEOUT:
        return NextStep(FAILED, TIMEOUT_REASON.format(seconds=timeout_seconds))
    count = failures + 1
    retry = count <= retry_attempts
    if exit_code is None and detail:
        reason = NEVER_STARTED_FAILED.format(node=node, detail=detail)
    elif retry:
        reason = FAILED_RETRY_REASON.format(code=exit_code, retry=count, retries=retry_attempts)
    else:
        reason = FAILED_FINAL_REASON.format(code=exit_code, retries=retry_attempts)
    return NextStep(RUNNABLE if retry else FAILED, reason, failure=True)
