"""What a job event or a share change tells people (docs/notifications.md, "What is sent"):

- a job that goes RUNNING **started**; one that goes SUCCEEDED **finished**; FAILED **failed**;
- a job that leaves PREEMPTING after an attempt that ended PREEMPTED **was preempted**: by
  which job of which share, why (the stop order's reason), and the work lost since its last
  checkpoint (its GPUs × the time from the later of its start and its last checkpoint to its
  end), known only once it has stopped;
- a stop order for a job of another share (a reclaim) tells both shares: the owner
  **reclaimed** its GPUs, the borrower's share had borrowed GPUs **reclaimed** from it;
- a job that starts on borrowed GPUs tells the shares that lend that GPU type now that they
  **lent** (the live report's split: the free pool first, then lenders in proportion);
- the fields of one share edit (by one person, through one door) are one **settings change**.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from functools import cache

from django.conf import settings
from django.db.models import Q

from notifications.models import Delivery, Kind
from scheduler.models import Job, JobAttempt, JobEvent, seconds_lost
from shares.models import QuotaShare, ShareChange
from shares.selectors import share_usage

# The fields of one share edit are written one after the other, a few microseconds apart.
ONE_EDIT = timedelta(seconds=1)
# Events the outbox reads in full: the rest only advance its position.
INTERESTING = (
    Q(to_state__in=(Job.State.RUNNING, Job.State.SUCCEEDED, Job.State.FAILED))
    | Q(to_state=Job.State.PREEMPTING)
    | Q(from_state=Job.State.PREEMPTING)
)

STARTED = "job {job} of share {share} started (attempt {attempt}): {reason}"
FINISHED = "job {job} of share {share} finished: {reason}"
FAILED = "job {job} of share {share} failed: {reason}"
PREEMPTED = (
    "job {job} of share {share} was preempted for job {by_job} of share {by_share} ({why}); "
    "it lost {lost} since its last checkpoint"
)
RECLAIMED_BY = (
    "share {owner} reclaimed {gpus} {gpu_type} from share {borrower}: job {job} stops for job "
    "{by_job}"
)
LENT = (
    "share {lender} lends {lent} {gpu_type} now: job {job} of share {borrower} started on "
    "{borrowed} borrowed {gpu_type}"
)
CHANGED = "share {share} changed by {who} ({source}): {changes}"


@dataclass
class Notice:
    """One thing that happened, before it is matched with subscriptions: `shares` are the
    shares it is about, `owner_id` the user whose job it is about (None: no job's)."""

    kind: str
    source: str
    source_id: int
    payload: dict
    shares: tuple[int, ...] = ()
    owner_id: int | None = None


def _link(path: str) -> str | None:
    base = settings.NOTIFICATIONS_PORTAL_URL
    return f"{base}{path}" if base else None


def _job_name(job: Job) -> str:
    return f"{job.pk} ({job.name})" if job.name else str(job.pk)


def _job_payload(job: Job) -> dict:
    return {
        "id": job.pk,
        "name": job.name,
        "share": job.share.name,
        "submitted_by": job.submitted_by.get_username(),
        "gpu_type": job.gpu_type,
        "gpus": job.gpus,
        "nodes": job.nodes,
        "priority": job.priority,
        "url": _link(f"/api/v1/jobs/{job.pk}/"),
        "page": _link(f"/dash/jobs/{job.pk}/"),
    }


def _lost(seconds: float, gpus: int) -> str:
    if seconds < 1:
        return "no GPU time"
    if seconds < 120:
        span = f"{seconds:.0f} s"
    elif seconds < 7200:
        span = f"{seconds / 60:.0f} min"
    else:
        span = f"{seconds / 3600:.1f} h"
    return f"{span} on {gpus} GPUs ({gpus * seconds / 3600:.2f} GPU-hours)"


class _Event:
    """One job event being told: the payload every notice of it starts from."""

    def __init__(self, event: JobEvent) -> None:
        self.event, self.job = event, event.job
        self.name = _job_name(self.job)
        self.base = {
            "at": event.at.isoformat(),
            "share": self.job.share.name,
            "job": _job_payload(self.job),
            "state": event.to_state,
            "reason": event.reason,
        }

    def notice(
        self, kind: str, text: str, extra: dict | None = None, shares: tuple[int, ...] = ()
    ) -> Notice:
        """A notice of the event; by default about the job's share and for its submitter."""
        payload = {**self.base, "event": kind, **(extra or {}), "text": text}
        if shares:
            return Notice(kind, Delivery.Source.JOB_EVENT, self.event.pk, payload, shares)
        return Notice(
            kind, Delivery.Source.JOB_EVENT, self.event.pk, payload, (self.job.share_id,),
            self.job.submitted_by_id,
        )  # fmt: skip


def job_event_notices(events: Sequence[JobEvent]) -> list[Notice]:
    """The notices of job events (loaded with their job, its share and submitter)."""
    attempts: dict[int, list[JobAttempt]] = {}
    for attempt in (
        JobAttempt.objects.filter(
            job_id__in={e.job_id for e in events if e.to_state != Job.State.SUCCEEDED}
        )
        .select_related("preempted_for__share", "preempted_for__submitted_by")
        .order_by("job_id", "-number")
    ):
        attempts.setdefault(attempt.job_id, []).append(attempt)
    usage = cache(share_usage)  # the live report: read once, and only if a borrower started
    notices: list[Notice] = []
    for event in events:
        notices += _notices(_Event(event), attempts.get(event.job_id, []), usage)
    return notices


def _notices(told: _Event, attempts: list[JobAttempt], usage: Callable) -> list[Notice]:
    """What one job event tells; `attempts` are the job's, latest first."""
    event, job, share = told.event, told.job, told.job.share.name
    notices = []
    if event.to_state == Job.State.RUNNING:
        attempt = next((a for a in attempts if a.started_at is not None), None)
        number = attempt.number if attempt else job.attempt_count
        text = STARTED.format(job=told.name, share=share, attempt=number, reason=event.reason)
        notices.append(told.notice(Kind.JOB_STARTED, text, {"attempt": number}))
        if attempt is not None and attempt.borrowed_gpus > 0:
            notices += _lent(told, attempt, usage())
    if event.to_state == Job.State.SUCCEEDED:
        text = FINISHED.format(job=told.name, share=share, reason=event.reason)
        notices.append(told.notice(Kind.JOB_FINISHED, text))
    if event.from_state == Job.State.PREEMPTING:
        preempted = next(
            (
                a
                for a in attempts
                if a.outcome == JobAttempt.Outcome.PREEMPTED
                and a.ended_at is not None
                and a.ended_at <= event.at
            ),
            None,
        )
        if preempted is not None:
            notices.append(_preempted(told, preempted))
    if event.to_state == Job.State.FAILED:
        text = FAILED.format(job=told.name, share=share, reason=event.reason)
        notices.append(told.notice(Kind.JOB_FAILED, text))
    if event.to_state == Job.State.PREEMPTING:
        stopped = next(
            (a for a in attempts if a.stop_requested_at and a.stop_requested_at <= event.at),
            None,
        )
        by = stopped.preempted_for if stopped is not None else None
        if by is not None and by.share_id != job.share_id:
            notices.append(_reclaimed(told, by))
    return notices


def _reclaimed(told: _Event, by: Job) -> Notice:
    """A stop order for another share's job: told to the owner and to the borrower."""
    job = told.job
    text = RECLAIMED_BY.format(
        owner=by.share.name, borrower=job.share.name, gpus=job.gpus, gpu_type=job.gpu_type,
        job=told.name, by_job=_job_name(by),
    )  # fmt: skip
    extra = {
        "owner_share": by.share.name,
        "borrower_share": job.share.name,
        "gpus": job.gpus,
        "gpu_type": job.gpu_type,
        "for_job": _job_payload(by),
    }
    return told.notice(Kind.SHARE_RECLAIMED, text, extra, shares=(by.share_id, job.share_id))


def _preempted(told: _Event, attempt: JobAttempt) -> Notice:
    """The job's attempt ended PREEMPTED: by whom, why, and the work lost since the later of
    its start and its last checkpoint."""
    job, by = told.job, attempt.preempted_for
    start, saved = attempt.started_at, attempt.last_checkpoint_at
    seconds = seconds_lost(start, saved, attempt.ended_at)
    order = (
        JobEvent.objects.filter(job=job, to_state=Job.State.PREEMPTING, id__lt=told.event.pk)
        .order_by("-id")
        .values_list("reason", flat=True)
        .first()
    )
    why = order or attempt.end_reason or "preempted"
    text = PREEMPTED.format(
        job=told.name, share=job.share.name, by_job=_job_name(by) if by else "?",
        by_share=by.share.name if by else "?", why=why, lost=_lost(seconds, job.gpus),
    )  # fmt: skip
    stop = attempt.stop_requested_at
    extra = {
        "preemption": {
            "attempt": attempt.number,
            "by_job": _job_payload(by) if by else None,
            "by_share": by.share.name if by else None,
            "kind": "reclaim" if by and by.share_id != job.share_id else "in_share",
            "why": why,
            "started_at": start.isoformat() if start else None,
            "stop_requested_at": stop.isoformat() if stop else None,
            "ended_at": attempt.ended_at.isoformat(),
            "last_checkpoint_at": saved.isoformat() if saved else None,
            "seconds_lost": round(seconds, 3),
            "gpu_hours_lost": round(job.gpus * seconds / 3600, 4),
        }
    }
    return told.notice(Kind.JOB_PREEMPTED, text, extra)


def _lent(told: _Event, attempt: JobAttempt, usage) -> list[Notice]:
    """The shares that lend the job's GPU type now, told that one more borrower runs."""
    job = told.job
    lenders = {
        name: types[job.gpu_type].lent
        for name, types in usage.shares.items()
        if name != job.share.name and job.gpu_type in types and types[job.gpu_type].lent > 0
    }
    ids = dict(QuotaShare.objects.filter(name__in=lenders).values_list("name", "pk"))
    notices = []
    for lender, lent in sorted(lenders.items()):
        text = LENT.format(
            lender=lender, lent=lent, gpu_type=job.gpu_type, job=told.name,
            borrower=job.share.name, borrowed=attempt.borrowed_gpus,
        )  # fmt: skip
        extra = {
            "share": lender,
            "lender_share": lender,
            "lent_now": lent,
            "borrower_share": job.share.name,
            "borrowed_gpus": attempt.borrowed_gpus,
            "gpu_type": job.gpu_type,
        }
        notices.append(told.notice(Kind.SHARE_LENT, text, extra, shares=(ids[lender],)))
    return notices


def share_change_notices(changes: Iterable[ShareChange]) -> list[Notice]:
    """One notice per share edit: consecutive changes of one share by one person through one
    door, written within a second (loaded with share and changed_by, in id order)."""
    edits: list[list[ShareChange]] = []
    for change in changes:
        last = edits[-1][-1] if edits else None
        same_edit = (
            last is not None
            and (last.share_id, last.changed_by_id, last.source)
            == (change.share_id, change.changed_by_id, change.source)
            and change.changed_at - edits[-1][0].changed_at <= ONE_EDIT
        )
        if same_edit:
            edits[-1].append(change)
        else:
            edits.append([change])
    notices = []
    for edit in edits:
        first = edit[0]
        who = first.changed_by.get_username() if first.changed_by else "the portal"
        fields = [{"field": c.field, "old": c.old_value, "new": c.new_value} for c in edit]
        described = "; ".join(f"{c['field']} {c['old'] or '∅'} → {c['new'] or '∅'}" for c in fields)
        text = CHANGED.format(
            share=first.share.name, who=who, source=first.get_source_display(), changes=described
        )
        payload = {
            "event": Kind.SHARE_CHANGED.value,
            "at": first.changed_at.isoformat(),
            "share": first.share.name,
            "changed_by": who,
            "source": first.source,
            "changes": fields,
            "url": _link(f"/api/v1/shares/{first.share.name}/history/"),
            "text": text,
        }
        notices.append(
            Notice(
                Kind.SHARE_CHANGED,
                Delivery.Source.SHARE_CHANGE,
                first.pk,
                payload,
                (first.share_id,),
            )
        )
    return notices
