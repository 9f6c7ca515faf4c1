"""Writes to nodes and jobs. Every state change of a job is recorded with its reason."""

from __future__ import annotations

import time
from collections import defaultdict

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from scheduler.bulk import id_batches, job_insert, jobs_set_reasons, rows_insert, rows_update
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
    # The cycle turns this into a stop order for the job's node(s).
    request_cycle()
    return job_transition(
        job=job,
        to_state=Job.State.PREEMPTING,
        reason=CANCEL_STOPPING.format(user=user),
    )


def jobs_transition(
    *, to_state: str, changes: list[tuple[int, str, str]], job_reason: str | None = None, **fields
) -> int:
    """Move many jobs to `to_state` at once, as `job_transition` does one: `changes` is
    [(job id, from state, reason)], `fields` are set on every job. Each job's event gets its own
    reason; the jobs' `reason` is `job_reason` when given (one UPDATE for all), else their own.
    The caller has locked the rows and checked their state (conditional update). Returns the
    number of jobs moved."""
    if not changes:
        return 0
    now = timezone.now()
    values = {"state": to_state, "updated_at": now, **fields}
    if to_state in Job.FINAL_STATES:
        values["finished_at"] = now
    if job_reason is not None:
        values["reason"] = job_reason
    ids = [job_id for job_id, _from_state, _reason in changes]
    for batch in id_batches(ids):
        Job.objects.filter(pk__in=batch).update(**values)
    if job_reason is None:
        jobs_set_reasons({job_id: reason for job_id, _from_state, reason in changes})
    rows_insert(
        JobEvent,
        ("job_id", "from_state", "to_state", "reason"),
        [(job_id, from_state, to_state, reason) for job_id, from_state, reason in changes],
    )
    return len(changes)


class JobChanges:
    """State changes of jobs the caller has locked and loaded, written together by `save()`:
    the fields that changed (one UPDATE on PostgreSQL) and the jobs' events (one INSERT),
    however many jobs there are. Each `transition` is what `job_transition` does to one job;
    a job may change more than once (its events keep their order)."""

    # What a transition reads of a job: load these with it.
    FIELDS = ("state", "started_at", "finished_at", "preemption_count", "failure_count")

    def __init__(self) -> None:
        self.jobs: dict[int, Job] = {}
        self.changed: dict[int, set[str]] = defaultdict(set)
        self.events: list[tuple[int, str, str, str]] = []

    def transition(self, job: Job, *, to_state: str, reason: str, **fields) -> None:
        self.events.append((job.pk, job.state, to_state, reason))
        job.state = to_state
        job.reason = reason
        for name, value in fields.items():
            setattr(job, name, value)
        self.changed[job.pk].update(("state", "reason", *fields))
        if to_state in Job.FINAL_STATES and job.finished_at is None:
            job.finished_at = timezone.now()
            self.changed[job.pk].add("finished_at")
        self.jobs[job.pk] = job

    def save(self) -> None:
        now = timezone.now()
        by_fields: dict[tuple[str, ...], list[Job]] = defaultdict(list)
        for job_id, names in self.changed.items():
            self.jobs[job_id].updated_at = now
            by_fields[tuple(sorted({*names, "updated_at"}))].append(self.jobs[job_id])
        for names, jobs in by_fields.items():
            rows_update(Job, names, [(job.pk, *(getattr(job, n) for n in names)) for job in jobs])
        rows_insert(JobEvent, ("job_id", "from_state", "to_state", "reason"), self.events)
        self.jobs, self.changed, self.events = {}, defaultdict(set), []


PRIORITY_OF_ENDED_JOB = (
    "priority: job {job} already ended ({state}); its priority no longer matters."
)


@transaction.atomic
def job_set_priority(*, job: Job, priority: int) -> Job:
    """Change a job's priority (AWS UpdateServiceJob). A queued job moves in its share's queue at
    the next cycle; a placed job keeps its GPUs but ranks by the new priority as a victim.
    Raises ValidationError for a job that already ended."""
    from django.core.exceptions import ValidationError

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


def node_set_state(*, node: Node, state: str) -> Node:
    """Drain (finish running jobs, take no new ones), undrain, or mark a node down."""
    Node.objects.filter(pk=node.pk).update(state=state)
    node.state = state
    request_cycle()
    return node


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
    "timeout_seconds",
    "max_preemptions",
    "retry_attempts",
)


# Two keys per database: a request that finds neither publishes a cycle now and sets the first;
# one that finds the first publishes a cycle for the end of the window and sets the second; one
# that finds both publishes nothing (see _cycle_publish_delay).
CYCLE_REQUESTED_KEY = "portal:cycle:requested:{db}"
CYCLE_TRAILING_KEY = "portal:cycle:trailing:{db}"
# KEYS: requested, trailing; ARGV: the window in ms. Returns [0, 0]: publish now; [1, window]:
# publish for the end of the window; [2, ms left]: the cycle published for the end of the window
# covers this request. The second value: how long the trailing key still stands, in ms.
_CYCLE_COALESCE_SCRIPT = """
if redis.call('SET', KEYS[1], '1', 'NX', 'PX', ARGV[1]) then return {0, 0} end
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[1]) then return {1, tonumber(ARGV[1])} end
return {2, redis.call('PTTL', KEYS[2])}
"""
# Per process and database: until when (time.monotonic()) a cycle published for the end of the
# window is known to start later. Until then a request is covered without asking Redis: at a
# burst of submits, a process asks once or twice per window, not once per submit.
_trailing_cycle_until: dict[str, float] = {}


def _cycle_publish_delay() -> float | None:
    """Seconds to delay the cycle this request asks for, or None when no cycle need be
    published: one published earlier starts after this request's commit anyway.

    At most two cycles are published per CYCLE_REQUEST_WINDOW_SECONDS: the first request of a
    window gets one now; the next gets one at the end of the window, and it covers every
    request until then, since each of those committed before that cycle starts (and a cycle
    runs every runnable job). So no request is left waiting for beat, whichever comes last.
    The trailing key expires no later than that cycle's start, so while it stands (as this
    process last saw it) a request need not ask."""
    from django.db import connection

    from scheduler.notify import redis_client

    window = settings.CYCLE_REQUEST_WINDOW_SECONDS
    if window <= 0:
        return 0.0
    db = connection.settings_dict["NAME"]
    asked_at = time.monotonic()  # before Redis sets or reads the key: its TTL runs from later
    if asked_at < _trailing_cycle_until.get(db, 0.0):
        return None
    keys = [CYCLE_REQUESTED_KEY.format(db=db), CYCLE_TRAILING_KEY.format(db=db)]
    try:
        outcome, trailing_ms = redis_client().eval(
            _CYCLE_COALESCE_SCRIPT, 2, *keys, int(window * 1000)
        )
    except Exception:  # noqa: BLE001 — without the keys, publish as if the window were empty
        return 0.0
    if outcome:
        _trailing_cycle_until[db] = asked_at + int(trailing_ms) / 1000
    return {0: 0.0, 1: window}.get(int(outcome))


def request_cycle() -> None:
    """Ask for a scheduling cycle that starts after the current transaction commits.
    Requests close together share one (see _cycle_publish_delay); beat runs the cycle anyway
    every CYCLE_INTERVAL_SECONDS."""

    def enqueue() -> None:
        from scheduler.cycle import note_change
        from scheduler.tasks import cycle

        note_change()
        try:
            delay = _cycle_publish_delay()
            if delay is None:
                return
            if delay:
                cycle.apply_async(countdown=delay)
            else:
                cycle.delay()
        except Exception:  # noqa: BLE001 — the broker being down must not fail a submit
            import logging

            logging.getLogger(__name__).warning(
                "could not enqueue a cycle; beat will run it", exc_info=True
            )

    transaction.on_commit(enqueue)


def validate_fits_nodes(
    *, gpu_type: str, gpus: int, nodes: int, largest_node: int | None, nodes_that_fit: int
) -> None:
    """Refuse a job that no set of registered nodes could ever hold (all-or-nothing gang).
    `largest_node` and `nodes_that_fit` describe the nodes of `gpu_type` that are not DOWN
    (see `submit_target`)."""
    from django.core.exceptions import ValidationError

    if gpus % nodes:
        from scheduler.models import GPUS_DIVISIBLE_BY_NODES

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
    client_token: str = "",
    timeout_seconds: int | None = None,
    max_preemptions: int | None = None,
    retry_attempts: int = 0,
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
    from django.core.exceptions import ValidationError
    from django.db import IntegrityError

    from scheduler.selectors import submit_target
    from shares.models import QuotaShare

    request = {
        "name": name,
        "gpu_type": gpu_type,
        "gpus": gpus,
        "nodes": nodes,
        "priority": priority,
        "command": command,
        "env": env or {},
        "timeout_seconds": timeout_seconds,
        "max_preemptions": max_preemptions,
        "retry_attempts": retry_attempts,
    }
    target = submit_target(
        user=user, share_name=share_name, gpu_type=gpu_type, per_node=gpus // max(nodes, 1)
    )
    if members_only and not target.visible:
        raise ShareNotVisible(share_name)
    if client_token:
        existing = _job_for_token(user, client_token)
        if existing is not None:
            return _same_request_or_conflict(existing, share_name, request, client_token), False
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
