"""Writes of a job's submitter: submit, cancel, change priority. States change through
`scheduler.transitions`; every write that the cycle should act on asks for one."""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from scheduler.cycle.estimates import what_if
from scheduler.cycle.trigger import request_cycle
from scheduler.jobs.selectors import submit_target
from scheduler.models import GPUS_DIVISIBLE_BY_NODES, Job, JobEvent
from scheduler.transitions import job_insert, job_transition
from shares.models import QuotaShare

CANCELLED_BY_USER = "cancelled by {user}"
CANCEL_STOPPING = "cancel requested by {user}: stopping with the share's grace period"
ALREADY_FINAL = "job {job} already ended ({state}); nothing to cancel"


@transaction.atomic
def job_cancel(*, job: Job, user, why: str = "") -> Job:
    """Cancel a job. A queued job ends at once; a job holding GPUs is stopped like a preemption
    (SIGTERM, the share's grace period, SIGKILL) and ends CANCELLED when its node confirms.
    `why`: the canceller's reason, added to the recorded one."""
    job = Job.objects.select_for_update().get(pk=job.pk)
    if job.is_final:
        return job
    because = f" ({why.strip()})" if why.strip() else ""
    if job.state in (Job.State.SUBMITTED, Job.State.RUNNABLE):
        # A strict-FIFO share's next job may now go ahead.
        request_cycle()
        return job_transition(
            job=job,
            to_state=Job.State.CANCELLED,
            reason=CANCELLED_BY_USER.format(user=user) + because,
        )
    if job.cancel_requested:
        return job
    # The cycle turns this into a stop order for the job's node(s).
    request_cycle()
    return job_transition(
        job=job,
        to_state=Job.State.PREEMPTING,
        reason=CANCEL_STOPPING.format(user=user) + because,
        cancel_requested=True,
    )


PRIORITY_OF_ENDED_JOB = (
    "priority: job {job} already ended ({state}); its priority no longer matters."
)


@transaction.atomic
def job_set_priority(*, job: Job, priority: int) -> Job:
    """Change a job's priority (AWS UpdateServiceJob). A queued job moves in its share's queue at
    the next cycle; a placed job keeps its GPUs but ranks by the new priority as a victim.
    Raises ValidationError for a job that already ended."""
    job = Job.objects.select_for_update().get(pk=job.pk)
    if job.is_final:
        raise ValidationError(
            {"priority": PRIORITY_OF_ENDED_JOB.format(job=job.pk, state=job.state)}
        )
    if job.priority != priority:
        job.priority = priority
        job.full_clean(exclude=["share", "submitted_by"])
        job.save(update_fields=["priority", "updated_at"])
        request_cycle()
    return job


# --- Submission -------------------------------------------------------------------------------

SHARE_UNKNOWN = "share: no share named {name!r}."
SHARE_DISABLED = (
    "share: share {name!r} is DISABLED and accepts no new jobs; its running jobs finish."
)
GPU_TYPE_NOT_IN_SHARE = (
    "gpu_type: share {share!r} has no limit for {gpu_type!r}; allowed: {allowed}."
)
NEVER_FITS_PER_NODE = (
    "gpus: {per_node} GPUs per node ({gpus} over {nodes} node(s)) is more than any {gpu_type} "
    "node has (largest: {largest})."
)
NEVER_FITS_NODE_COUNT = (
    "nodes: the job needs {nodes} distinct {gpu_type} nodes with {per_node} GPUs each; "
    "only {available} exist."
)
NO_NODES_OF_TYPE = "gpu_type: no {gpu_type} node is registered, so the job could never run."
COMMAND_EMPTY = "command: must not be empty."
CLIENT_TOKEN_CONFLICT = (
    "client_token: {token!r} was already used for job {job_id} with a different request; "
    "use a new token for a new job."
)
SUBMITTED_REASON = "submitted by {user}"
QUEUED_REASON = "queued: waiting for the next scheduling cycle"


class ClientTokenConflict(Exception):
    """The same client_token came back with a different request."""

    def __init__(self, job: Job, token: str) -> None:
        self.job = job
        super().__init__(CLIENT_TOKEN_CONFLICT.format(token=token, job_id=job.pk))


class ShareNotVisible(Exception):
    """The user may not submit to this share: not on its team (or it does not exist)."""

    def __init__(self, share_name: str) -> None:
        self.share_name = share_name
        super().__init__(share_name)


IDEMPOTENT_FIELDS = (
    "name",
    "gpu_type",
    "gpus",
    "nodes",
    "priority",
    "command",
    "env",
    "image",
    "working_dir",
    "timeout_seconds",
    "expected_seconds",
    "max_preemptions",
    "retry_attempts",
    "preemptible",
)


def validate_fits_nodes(
    *, gpu_type: str, gpus: int, nodes: int, largest_node: int | None, nodes_that_fit: int
) -> None:
    """Refuse a job that no set of registered nodes could ever hold (all-or-nothing gang).
    `largest_node` and `nodes_that_fit` describe the nodes of `gpu_type` that are not DOWN
    (see `submit_target`)."""
    if gpus % nodes:
        raise ValidationError({"gpus": GPUS_DIVISIBLE_BY_NODES.format(nodes=nodes)})
    if largest_node is None:
        raise ValidationError({"gpu_type": NO_NODES_OF_TYPE.format(gpu_type=gpu_type)})
    per_node = gpus // nodes
    if per_node > largest_node:
        raise ValidationError(
            {
                "gpus": NEVER_FITS_PER_NODE.format(
                    per_node=per_node, gpus=gpus, nodes=nodes, gpu_type=gpu_type,
                    largest=largest_node,
                )
            }
        )  # fmt: skip
    if nodes > nodes_that_fit:
        raise ValidationError(
            {
                "nodes": NEVER_FITS_NODE_COUNT.format(
                    nodes=nodes, gpu_type=gpu_type, per_node=per_node, available=nodes_that_fit
                )
            }
        )


def job_submit(
    *,
    user,
    share_name: str,
    gpu_type: str,
    gpus: int,
    command: str,
    nodes: int = 1,
    priority: int = 0,
    name: str = "",
    env: dict | None = None,
    image: str = "",
    working_dir: str = "",
    client_token: str = "",
    timeout_seconds: int | None = None,
    expected_seconds: int | None = None,
    max_preemptions: int | None = None,
    retry_attempts: int = 0,
    preemptible: bool = True,
    members_only: bool = False,
    fields_validated: bool = False,
) -> tuple[Job, bool]:
    """Accept a job into its share's queue; returns (job, created).

    Raises ValidationError naming the field and the rule. The same `client_token` with the
    same request returns the first job (created False); with a different request it raises
    ClientTokenConflict. A DISABLED share refuses new jobs. With `members_only` (the API), a
    share the user may not see (not on its team, not an admin) raises ShareNotVisible, like
    one that does not exist, before anything else is looked at. `fields_validated`: the caller
    has already checked every field of the request against the rules of the model's fields (the
    API's JobSubmitSerializer does, with its own messages), so they are not checked twice."""
    request = {
        "name": name,
        "gpu_type": gpu_type,
        "gpus": gpus,
        "nodes": nodes,
        "priority": priority,
        "command": command,
        "env": env or {},
        "image": image,
        "working_dir": working_dir,
        "timeout_seconds": timeout_seconds,
        "expected_seconds": expected_seconds,
        "max_preemptions": max_preemptions,
        "retry_attempts": retry_attempts,
        "preemptible": preemptible,
    }
    target = submit_target(
        user=user,
        share_name=share_name,
        gpu_type=gpu_type,
        per_node=gpus // max(nodes, 1),
        client_token=client_token,
    )
    if members_only and not target.visible:
        raise ShareNotVisible(share_name)
    # Without a share of that name, the target cannot say whether the token was used.
    if client_token and (target.token_used or target.share is None):
        existing = _job_for_token(user, client_token)
        if existing is not None:
            return _same_request_or_conflict(existing, share_name, request, client_token), False
    job = _checked_job(user, share_name, target, request, client_token, fields_validated)
    share = job.share
    job.state = Job.State.RUNNABLE
    job.reason = QUEUED_REASON
    events = [
        JobEvent(
            job=job,
            from_state="",
            to_state=Job.State.SUBMITTED,
            reason=SUBMITTED_REASON.format(user=user),
        ),
        JobEvent(
            job=job,
            from_state=Job.State.SUBMITTED,
            to_state=Job.State.RUNNABLE,
            reason=f"accepted into share {share.name}'s queue",
        ),
    ]
    try:
        job_insert(job, events)  # the job and its events commit together, or not at all
    except IntegrityError:
        # Two submits with one client_token raced; the database let exactly one in.
        existing = _job_for_token(user, client_token) if client_token else None
        if existing is None:
            raise
        return _same_request_or_conflict(existing, share_name, request, client_token), False
    request_cycle()
    return job, True


def _job_for_token(user, client_token: str) -> Job | None:
    return (
        Job.objects.select_related("share")
        .filter(submitted_by=user, client_token=client_token)
        .first()
    )


def _same_request_or_conflict(
    existing: Job, share_name: str, request: dict, client_token: str
) -> Job:
    same = existing.share.name == share_name and all(
        getattr(existing, field) == value for field, value in request.items()
    )
    if not same:
        raise ClientTokenConflict(existing, client_token)
    return existing


def _checked_job(user, share_name: str, target, request: dict, client_token: str,
                 fields_validated: bool) -> Job:  # fmt: skip
    """The job `request` asks for, not saved, once every rule of a submission holds (else
    ValidationError naming the field and the rule)."""
    gpu_type, gpus, nodes = request["gpu_type"], request["gpus"], request["nodes"]
    command = request["command"]
    share = target.share
    if share is None:
        raise ValidationError({"share": SHARE_UNKNOWN.format(name=share_name)})
    if share.state == QuotaShare.State.DISABLED:
        raise ValidationError({"share": SHARE_DISABLED.format(name=share_name)})
    limits = target.limits
    if gpu_type not in limits:
        raise ValidationError(
            {
                "gpu_type": GPU_TYPE_NOT_IN_SHARE.format(
                    share=share_name, gpu_type=gpu_type, allowed=", ".join(sorted(limits))
                )
            }
        )
    if not (command or "").strip():
        raise ValidationError({"command": COMMAND_EMPTY})
    job = Job(share=share, submitted_by=user, client_token=client_token, **request)
    if not fields_validated:
        # Field validators and Job.clean() check every rule the check constraints hold, with
        # the messages users read; validating the constraints again would cost one query each
        # (five per submit), and the database enforces them anyway (the client_token race
        # included).
        job.full_clean(exclude=["share", "submitted_by"], validate_constraints=False)
    validate_fits_nodes(
        gpu_type=gpu_type,
        gpus=gpus,
        nodes=nodes,
        largest_node=target.largest_node,
        nodes_that_fit=target.nodes_that_fit,
    )
    return job


# What a what-if runs when it is given no command: it runs nothing, and a command changes no
# estimate, but the request is checked as a submit.
WHAT_IF_COMMAND = "true"


def job_estimate(
    *, user, share_name: str, gpu_type: str, gpus: int, command: str = WHAT_IF_COMMAND, **fields
):
    """What-if: when a job of this request would start if it were submitted now (nothing is
    stored), and why it would wait; the same checks as `job_submit` (ValidationError,
    ShareNotVisible), the command optional. Returns `scheduler.cycle.estimates.WhatIf`."""
    fields.pop("client_token", None)
    request = {
        "name": fields.get("name", ""),
        "gpu_type": gpu_type,
        "gpus": gpus,
        "nodes": fields.get("nodes", 1),
        "priority": fields.get("priority", 0),
        "command": command,
        "env": fields.get("env") or {},
        "image": fields.get("image", ""),
        "working_dir": fields.get("working_dir", ""),
        "timeout_seconds": fields.get("timeout_seconds"),
        "expected_seconds": fields.get("expected_seconds"),
        "max_preemptions": fields.get("max_preemptions"),
        "retry_attempts": fields.get("retry_attempts", 0),
        "preemptible": fields.get("preemptible", True),
    }
    target = submit_target(
        user=user, share_name=share_name, gpu_type=gpu_type,
        per_node=gpus // max(request["nodes"], 1), client_token="",
    )  # fmt: skip
    if fields.get("members_only") and not target.visible:
        raise ShareNotVisible(share_name)
    job = _checked_job(user, share_name, target, request, "", fields.get("fields_validated", False))
    return what_if(job)
