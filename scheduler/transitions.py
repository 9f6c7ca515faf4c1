"""The one writer of a job's state: every change of state is recorded with its event and its
reason (DESIGN §2: "Every state change of a job is recorded with a reason").

`Transitions` collects the changes of one step (a cycle's placements, a node's reports, a
cancel) and writes them together with `save()`: the jobs' new fields (one UPDATE per set of
fields on PostgreSQL) and their events (one INSERT), however many jobs there are. A job's
first state comes with its submission (`job_insert`). A job's waiting reason, which is not a
state change, is `jobs_set_reasons`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from functools import cache

from django.db import connection
from django.utils import timezone

from portal.db.bulk import id_batches, insert_with_children, json_insert, rows_update
from portal.db.sql import json_rows_param, prepared_cursor
from scheduler.models import Job, JobEvent

_EVENT_COLUMNS = ("job_id", "from_state", "to_state", "reason")


class Transitions:
    """State changes of jobs the caller has locked, written together by `save()`.

    - `move(job, ...)`: a job loaded as a model instance (with `FIELDS`); a job may move more
      than once (its events keep their order);
    - `move_rows(...)`: many jobs by id, with the state the caller read when it locked them,
      all to one state and with the same `fields` (which may be expressions such as
      F("attempt_count") + 1): the cycle's way, which loads no instances.
    """

    # What a move reads of a job: load these with it.
    FIELDS = ("state", "started_at", "finished_at", "preemption_count", "failure_count")

    def __init__(self) -> None:
        self.jobs: dict[int, Job] = {}
        self.changed: dict[int, set[str]] = defaultdict(set)
        self.events: list[tuple[int, str, str, str]] = []
        self.row_moves: list[tuple[list[int], dict, dict[int, str] | None]] = []

    def move(self, job: Job, *, to_state: str, reason: str, **fields) -> Transitions:
        """`job` goes to `to_state` because of `reason`, with `fields` set."""
        if job.state == Job.State.RUNNABLE and to_state != Job.State.RUNNABLE:
            fields = {**Job.no_estimate(), **fields}  # it leaves the queue
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
        return self

    def move_rows(
        self,
        *,
        to_state: str,
        changes: Sequence[tuple[int, str, str]],
        job_reason: str | None = None,
        **fields,
    ) -> Transitions:
        """Jobs go to `to_state`: `changes` is [(job id, its state now, reason)], `fields` are
        set on every job. Each job's event gets its own reason; the jobs' `reason` is
        `job_reason` when given (one UPDATE for all), else their own."""
        if not changes:
            return self
        values = {"state": to_state, **fields}
        if to_state != Job.State.RUNNABLE and any(
            state == Job.State.RUNNABLE for _id, state, _reason in changes
        ):
            values = {**Job.no_estimate(), **values}  # they leave the queue
        if job_reason is not None:
            values["reason"] = job_reason
        ids = [job_id for job_id, _state, _reason in changes]
        own = None if job_reason is not None else {job_id: r for job_id, _s, r in changes}
        self.row_moves.append((ids, values, own))
        self.events += [(job_id, state, to_state, reason) for job_id, state, reason in changes]
        return self

    def save(self) -> None:
        now = timezone.now()
        by_fields: dict[tuple[str, ...], list[Job]] = defaultdict(list)
        for job_id, names in self.changed.items():
            self.jobs[job_id].updated_at = now
            by_fields[tuple(sorted({*names, "updated_at"}))].append(self.jobs[job_id])
        for names, jobs in by_fields.items():
            rows_update(Job, names, [(job.pk, *(getattr(job, n) for n in names)) for job in jobs])
        for ids, values, own_reasons in self.row_moves:
            values = {**values, "updated_at": now}
            if values["state"] in Job.FINAL_STATES:
                values["finished_at"] = now
            for batch in id_batches(ids):
                Job.objects.filter(pk__in=batch).update(**values)
            if own_reasons is not None:
                jobs_set_reasons(own_reasons)
        json_insert(JobEvent, _EVENT_COLUMNS, self.events)
        self.jobs, self.changed, self.events, self.row_moves = {}, defaultdict(set), [], []


def job_transition(*, job: Job, to_state: str, reason: str, **fields) -> Job:
    """`Transitions` of one job, written at once."""
    Transitions().move(job, to_state=to_state, reason=reason, **fields).save()
    return job


def jobs_set_reasons(reasons: dict[int, str], *, state: str | None = None) -> int:
    """Set each job's `reason` to its own text (only the jobs still in `state`, when given).
    Not a state change: no event, no updated_at. Returns the number of rows written.

    One statement on every database, whatever the number of jobs: the ids travel grouped by
    reason, as one JSON parameter (a cycle's tens of thousands of waiting jobs share a few
    dozen reasons)."""
    if not reasons:
        return 0
    by_reason: dict[str, list[int]] = defaultdict(list)
    for job_id, reason in reasons.items():
        by_reason[reason].append(job_id)
    params: list = [json_rows_param(list(by_reason.items()))]
    if state is not None:
        params.append(state)
    with prepared_cursor() as cursor:
        cursor.execute(_reasons_sql(state is not None), params)
        return cursor.rowcount


@cache
def _reasons_sql(in_state: bool) -> str:
    """Write the reasons of the jobs given as [[reason, [id, ...]], ...] (the first parameter),
    only to those in a state (the second) if `in_state`."""
    table = connection.ops.quote_name(Job._meta.db_table)
    if connection.vendor == "postgresql":
        source = (
            "SELECT r.value ->> 0 AS reason, (i.value)::bigint AS id "
            "FROM jsonb_array_elements(%s::jsonb) AS r, "
            "jsonb_array_elements_text(r.value -> 1) AS i"
        )
    else:
        source = (
            "SELECT json_extract(r.value, '$[0]') AS reason, i.value AS id "
            "FROM json_each(%s) AS r, json_each(r.value, '$[1]') AS i"
        )
    sql = f"UPDATE {table} SET reason = v.reason FROM ({source}) AS v WHERE {table}.id = v.id"
    if in_state:
        sql += f" AND {table}.state = %s"
    return sql


def job_insert(job: Job, events: Sequence[JobEvent]) -> None:
    """Insert the new `job` and its first `events` (JobEvents of `job`), all or nothing
    (`portal.db.bulk.insert_with_children`). As save() does, sets job.pk and stamps the
    auto_now(_add) fields."""
    insert_with_children(job, events, link="job")
