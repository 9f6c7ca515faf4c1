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
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from datetime import datetime
from functools import cache

from django.db import DEFAULT_DB_ALIAS, connection, connections, models, transaction
from django.utils import timezone

from portal.db.bulk import id_batches, rows_insert, rows_update
from portal.db.sql import prepared_cursor
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

    def move(self, job: Job, *, to_state: str, reason: str, **fields) -> None:
        """`job` goes to `to_state` because of `reason`, with `fields` set."""
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
        rows_insert(JobEvent, _EVENT_COLUMNS, self.events)
        self.jobs, self.changed, self.events, self.row_moves = {}, defaultdict(set), [], []


def job_transition(*, job: Job, to_state: str, reason: str, **fields) -> Job:
    """`Transitions` of one job, written at once."""
    transitions = Transitions()
    transitions.move(job, to_state=to_state, reason=reason, **fields)
    transitions.save()
    return job


def jobs_set_reasons(reasons: dict[int, str], *, state: str | None = None) -> int:
    """Set each job's `reason` to its own text (only the jobs still in `state`, when given).
    Not a state change: no event, no updated_at. Returns the number of rows written."""
    return rows_update(
        Job,
        ("reason",),
        reasons.items(),
        where=("state", state) if state is not None else None,
    )


# The event columns a submit writes, in the order of their placeholders in _job_insert_sql.
_EVENT_FIELDS = ("at", "from_state", "to_state", "reason")


@cache
def _job_fields() -> tuple[models.Field, ...]:
    return tuple(field for field in Job._meta.concrete_fields if not field.primary_key)


@cache
def _event_fields() -> tuple[models.Field, ...]:
    return tuple(JobEvent._meta.get_field(name) for name in _EVENT_FIELDS)


# The Python types each kind of field writes to PostgreSQL as they are: for a value of exactly
# that type (or None), get_db_prep_save returns the value itself. Strings of a CharField, ints
# of an IntegerField or a foreign key to an integer primary key, aware datetimes (naive ones
# are made aware, with a warning, by get_db_prep_save). JSONField and the rest always convert.
_WRITTEN_AS_IS: dict[type[models.Field], type] = {
    models.CharField: str,
    models.TextField: str,
    models.IntegerField: int,
    models.PositiveIntegerField: int,
    models.BigIntegerField: int,
    models.BooleanField: bool,
    models.DateTimeField: datetime,
}


def _written_as_is(field: models.Field) -> type | None:
    """The type of value `field` writes unchanged on PostgreSQL, or None when it converts."""
    if isinstance(field, models.ForeignKey):
        target = field.target_field
        return int if isinstance(target, (models.AutoField, models.BigAutoField)) else None
    return _WRITTEN_AS_IS.get(type(field))


@cache
def _save_plan(fields: Callable[[], tuple[models.Field, ...]]) -> tuple:
    """Per field of `fields()`: the field, the attribute save() reads when the field's pre_save
    is a plain read (else None), and the type written as is (see _written_as_is)."""
    return tuple(
        (
            field,
            field.attname if type(field).pre_save is models.Field.pre_save else None,
            _written_as_is(field),
        )
        for field in fields()
    )


def _db_values(instance: models.Model, fields: Callable[[], tuple[models.Field, ...]], db) -> list:
    """What save() would write for `fields` of the new `instance` (defaults, auto_now stamps):
    a value already of a type PostgreSQL takes as is goes as it is, which spares most of a
    submit's calls to get_db_prep_save."""
    values = []
    for field, attname, plain in _save_plan(fields):
        value = (
            field.pre_save(instance, add=True) if attname is None else getattr(instance, attname)
        )
        if plain is not None and (
            value is None
            or (type(value) is plain and (plain is not datetime or value.tzinfo is not None))
        ):
            values.append(value)
        else:
            values.append(field.get_db_prep_save(value, db))
    return values


@cache
def _job_insert_sql(events: int) -> str:
    quote = connection.ops.quote_name
    job_columns = ", ".join(quote(field.column) for field in _job_fields())
    job_values = ", ".join(["%s"] * len(_job_fields()))
    event_fields = _event_fields()
    event_columns = ", ".join(quote(field.column) for field in event_fields)
    event_row = ", ".join(f"%s::{field.db_type(connection)}" for field in event_fields)
    event_rows = ", ".join(f"({event_row}, {n})" for n in range(events))
    event_names = ", ".join(_EVENT_FIELDS)
    # ORDER BY n: the events get their ids, and so their order (at, id), as listed.
    return (
        f"WITH new_job AS (INSERT INTO {quote(Job._meta.db_table)} ({job_columns}) "
        f"VALUES ({job_values}) RETURNING id) "
        f"INSERT INTO {quote(JobEvent._meta.db_table)} (job_id, {event_columns}) "
        f"SELECT new_job.id, {event_names} FROM new_job, "
        f"(VALUES {event_rows}) AS e({event_names}, n) ORDER BY e.n RETURNING job_id"
    )


def job_insert(job: Job, events: Sequence[JobEvent]) -> None:
    """Insert the new `job` and its first `events` (JobEvents of `job`), all or nothing: on
    PostgreSQL in one statement, which outside a transaction commits on its own (no BEGIN and
    COMMIT round trips for a submit); elsewhere job.save() and bulk_create in a transaction.
    Inside the caller's transaction, a savepoint: a failed insert (IntegrityError) leaves that
    transaction usable. As save() does, sets job.pk and stamps the auto_now(_add) fields."""
    if connection.vendor != "postgresql":
        with transaction.atomic():
            job.save()
            JobEvent.objects.bulk_create(events)
        return
    # The connection itself, not the `connection` proxy, which looks it up at every use.
    db = connections[DEFAULT_DB_ALIAS]
    params = _db_values(job, _job_fields, db)
    for event in events:
        params += _db_values(event, _event_fields, db)
    savepoint = transaction.atomic() if connection.in_atomic_block else nullcontext()
    with savepoint, prepared_cursor() as cursor:
        cursor.execute(_job_insert_sql(len(events)), params)
        job.pk = cursor.fetchone()[0]
    job._state.adding = False
    job._state.db = connection.alias
