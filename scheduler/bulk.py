"""Bulk writes of the scheduling cycle and of a submit: one statement each on PostgreSQL,
batched ORM elsewhere.

A placing cycle inserts thousands of rows (attempts, GPU assignments, job events) and rewrites
the reasons of tens of thousands of waiting jobs. Through model instances and `IN (...)` lists
that is mostly Python and round trips; on PostgreSQL each write here is one statement over
arrays (`unnest`), with no model instances. Other databases (SQLite in development and tests)
get the same rows through the ORM in batches below their bound-parameter limit.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from datetime import datetime
from functools import cache

from django.db import DEFAULT_DB_ALIAS, connection, connections, models, transaction
from django.utils import timezone

from portal.sql import prepared_cursor
from scheduler.models import Job, JobEvent

# Rows per statement on the ORM path: below SQLite's limit of bound parameters.
BATCH = 900


def _postgresql() -> bool:
    return connection.vendor == "postgresql"


def _binary_cursor():
    """A Django cursor (query log, execute wrappers, error translation) over a psycopg cursor
    that binds parameters on the server, so `%b` sends an array in binary: PostgreSQL then does
    not parse a text literal of thousands of elements (Django's own cursors bind on the client,
    as text)."""
    import psycopg

    connection.ensure_connection()
    return connection._prepare_cursor(psycopg.Cursor(connection.connection))


def id_batches(ids: Sequence[int]) -> Iterable[Sequence[int]]:
    """`ids` in batches for `pk__in` filters: one on PostgreSQL, BATCH at a time elsewhere."""
    size = 30_000 if _postgresql() else BATCH  # PostgreSQL allows 65,535 parameters
    for start in range(0, len(ids), size):
        yield ids[start : start + size]


def rows_insert(
    model: type[models.Model],
    fields: Sequence[str],
    rows: Iterable[Sequence],
    *,
    returning: Sequence[str] = (),
) -> list[tuple]:
    """Insert `rows` (values in the order of `fields`, attribute names such as "job_id") into
    `model`'s table; the model's other fields get their defaults, and auto_now(_add) fields the
    current time, as the ORM does. Returns, per inserted row, the values of `returning`
    (attribute names, e.g. ("id", "job_id")); in no particular order on PostgreSQL, so a caller
    that needs to match ids to rows returns a key with them."""
    rows = list(rows)
    if not rows:
        return []
    meta = model._meta
    given = [meta.get_field(name) for name in fields]
    if any(getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False) for f in given):
        raise ValueError("auto_now and auto_now_add fields are set by rows_insert")
    if not _postgresql():
        objects = model.objects.bulk_create(
            [model(**dict(zip(fields, row, strict=True))) for row in rows], batch_size=BATCH
        )
        return [tuple(getattr(obj, name) for name in returning) for obj in objects]
    sql, json_fields, defaults = _insert_plan(model, tuple(fields), tuple(returning))
    params = []
    for index, is_json in enumerate(json_fields):
        values = [row[index] for row in rows]
        if is_json:
            values = [None if value is None else json.dumps(value) for value in values]
        params.append(values)
    # Fields the caller leaves out get their model default, the same for every row.
    now = timezone.now()
    default_values = [
        field.get_db_prep_save(now if stamped else field.get_default(), connection)
        for field, stamped in defaults
    ]
    with prepared_cursor() as cursor:
        cursor.execute(sql, [*default_values, *params])
        return [tuple(row) for row in cursor.fetchall()] if returning else []


@cache
def _insert_plan(
    model: type[models.Model], fields: tuple[str, ...], returning: tuple[str, ...]
) -> tuple[str, tuple[bool, ...], tuple[tuple[models.Field, bool], ...]]:
    """rows_insert's statement on PostgreSQL, whether each of `fields` is a JSON field, and the
    fields that get their default (with whether they are auto_now(_add) stamps)."""
    meta = model._meta
    given = [meta.get_field(name) for name in fields]
    columns = [field.column for field in given]
    selects = [f"%b::{field.db_type(connection)}[]" for field in given]
    defaults, default_selects = [], []
    for field in meta.concrete_fields:
        if field in given or field.primary_key:
            continue
        stamped = getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False)
        columns.append(field.column)
        defaults.append((field, stamped))
        default_selects.append(f", %s::{field.db_type(connection)}")
    quote = connection.ops.quote_name
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(c) for c in columns)}) "
        f"SELECT *{''.join(default_selects)} FROM unnest({', '.join(selects)})"
    )
    if returning:
        sql += " RETURNING " + ", ".join(quote(meta.get_field(n).column) for n in returning)
    json_fields = tuple(isinstance(field, models.JSONField) for field in given)
    return sql, json_fields, tuple(defaults)


def rows_update(model: type[models.Model], fields: Sequence[str], rows: Iterable[Sequence]) -> int:
    """Write `fields` (attribute names) of the rows of `model`'s table whose ids lead `rows`:
    each row is (id, value of each field). Fields not named keep their values, auto_now ones
    included. One statement on PostgreSQL (a join with `unnest`), whatever the number of
    rows and of distinct values; elsewhere one UPDATE per distinct set of values. Returns the
    number of rows written."""
    rows = list(rows)
    if not rows:
        return 0
    if not _postgresql():
        # Rows with equal values share an UPDATE; JSON values are compared by their text.
        by_values: dict[tuple, tuple[list, list]] = {}
        for pk, *values in rows:
            key = tuple(
                json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else value
                for value in values
            )
            by_values.setdefault(key, (values, []))[1].append(pk)
        written = 0
        for values, ids in by_values.values():
            for start in range(0, len(ids), BATCH):
                written += model.objects.filter(pk__in=ids[start : start + BATCH]).update(
                    **dict(zip(fields, values, strict=True))
                )
        return written
    sql, json_fields = _update_plan(model, tuple(fields))
    params: list[list] = [[row[0] for row in rows]]
    for index, is_json in enumerate(json_fields, start=1):
        values = [row[index] for row in rows]
        if is_json:
            values = [None if value is None else json.dumps(value) for value in values]
        params.append(values)
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


@cache
def _update_plan(
    model: type[models.Model], fields: tuple[str, ...]
) -> tuple[str, tuple[bool, ...]]:
    """rows_update's statement on PostgreSQL, and whether each of `fields` is a JSON field."""
    meta = model._meta
    given = [meta.get_field(name) for name in fields]
    quote = connection.ops.quote_name
    table = quote(meta.db_table)
    columns = [quote(field.column) for field in given]
    arrays = [f"%b::{meta.pk.db_type(connection)}[]"]
    arrays += [f"%b::{field.db_type(connection)}[]" for field in given]
    sql = (
        f"UPDATE {table} SET {', '.join(f'{c} = v.{c}' for c in columns)} "
        f"FROM unnest({', '.join(arrays)}) AS v(pk, {', '.join(columns)}) "
        f"WHERE {table}.{quote(meta.pk.column)} = v.pk"
    )
    return sql, tuple(isinstance(field, models.JSONField) for field in given)


def jobs_set_reasons(reasons: dict[int, str], *, state: str | None = None) -> int:
    """Set each job's `reason` to its own text (only the jobs still in `state`, when given).
    Not a state change: no event, no updated_at. Returns the number of rows written."""
    if not reasons:
        return 0
    if _postgresql():
        table = connection.ops.quote_name(Job._meta.db_table)
        condition = f" AND {table}.state = %s" if state is not None else ""
        with _binary_cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET reason = v.reason "
                "FROM unnest(%b::bigint[], %b::text[]) AS v(id, reason) "
                f"WHERE {table}.id = v.id{condition}",
                [list(reasons), list(reasons.values()), *([state] if state is not None else [])],
            )
            return cursor.rowcount
    # Many jobs share one reason: one UPDATE per reason (and batch), not per job.
    by_reason: dict[str, list[int]] = defaultdict(list)
    for job_id, reason in reasons.items():
        by_reason[reason].append(job_id)
    written = 0
    jobs = Job.objects.all() if state is None else Job.objects.filter(state=state)
    for reason, ids in by_reason.items():
        for start in range(0, len(ids), BATCH):
            written += jobs.filter(pk__in=ids[start : start + BATCH]).update(reason=reason)
    return written


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
    if not _postgresql():
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
