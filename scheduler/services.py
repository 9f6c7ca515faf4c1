"""Writes to nodes and jobs. Every state change of a job is recorded with its reason."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from scheduler.models import Job, JobEvent, Node

CANCELLED_BY_USER = "cancelled by {user}"
CANCEL_STOPPING = "cancel requested by {user}: stopping with the share's grace period"
ALREADY_FINAL = "job {job} already ended ({state}); nothing to cancel"


def job_transition(*, job: Job, to_state: str, reason: str, **fields) -> Job:
    """Move a job to `to_state`, set `fields`, and record the change with its reason."""
    from_state = job.state
    job.state = to_state
    job.reason = reason
    for name, value in fields.items():
        setattr(job, name, value)
    if to_state in Job.FINAL_STATES and job.finished_at is None:
        job.finished_at = timezone.now()
    job.save()
    JobEvent.objects.create(job=job, from_state=from_state, to_state=to_state, reason=reason)
    return job


@transaction.atomic
def job_cancel(*, job: Job, user) -> Job:
    """Cancel a job. A queued job ends at once; a job holding GPUs is stopped like a preemption
    (SIGTERM, the share's grace period, SIGKILL) and ends CANCELLED when its node confirms."""
    job = Job.objects.select_for_update().get(pk=job.pk)
    if job.is_final:
        return job
    if job.state in (Job.State.SUBMITTED, Job.State.RUNNABLE):
        return job_transition(
            job=job, to_state=Job.State.CANCELLED, reason=CANCELLED_BY_USER.format(user=user)
        )
    if job.cancel_requested:
        return job
    job.cancel_requested = True
    return job_transition(
        job=job,
        to_state=Job.State.PREEMPTING,
        reason=CANCEL_STOPPING.format(user=user),
    )


def node_set_state(*, node: Node, state: str) -> Node:
    """Drain (finish running jobs, take no new ones), undrain, or mark a node down."""
    Node.objects.filter(pk=node.pk).update(state=state)
    node.state = state
    return node
