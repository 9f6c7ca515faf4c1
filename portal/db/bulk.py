"""Bulk writes of the scheduling cycle: one statement each on PostgreSQL, batched ORM elsewhere.

A placing cycle inserts thousands of rows (attempts, GPU assignments, job events) and rewrites
the reasons of tens of thousands of waiting jobs. Through model instances and `IN (...)` lists
that is mostly Python and round trips; on PostgreSQL each write here is one statement over
arrays (`unnest`), with no model instances. Other databases (SQLite in development and tests)
get the same rows through the ORM in batches below their bound-parameter limit.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from functools import cache

from django.db import connection, models
from django.utils import timezone

from portal.db.sql import prepared_cursor

# Rows per statement on the ORM path: below SQLite's limit of bound parameters.
BATCH = 900


def _postgresql() -> bool:
    return connection.vendor == "postgresql"


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


def rows_update(
    model: type[models.Model],
    fields: Sequence[str],
    rows: Iterable[Sequence],
    *,
    where: tuple[str, object] | None = None,
) -> int:
    """Write `fields` (attribute names) of the rows of `model`'s table whose ids lead `rows`:
    each row is (id, value of each field); with `where` (field, value), only the rows whose
    field still has that value. Fields not named keep their values, auto_now ones included.
    One statement on PostgreSQL (a join with `unnest`), whatever the number of rows and of
    distinct values; elsewhere one UPDATE per distinct set of values. Returns the number of
    rows written."""
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
        table = model.objects.filter(**dict([where])) if where else model.objects.all()
        for values, ids in by_values.values():
            for start in range(0, len(ids), BATCH):
                written += table.filter(pk__in=ids[start : start + BATCH]).update(
                    **dict(zip(fields, values, strict=True))
                )
        return written
    sql, json_fields = _update_plan(model, tuple(fields), where[0] if where else None)
    params: list[list] = [[row[0] for row in rows]]
    for index, is_json in enumerate(json_fields, start=1):
        values = [row[index] for row in rows]
        if is_json:
            values = [None if value is None else json.dumps(value) for value in values]
        params.append(values)
    if where:
        params.append(where[1])
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


@cache
def _update_plan(
    model: type[models.Model], fields: tuple[str, ...], where: str | None
) -> tuple[str, tuple[bool, ...]]:
    """rows_update's statement on PostgreSQL (with a condition on the field `where`), and
    whether each of `fields` is a JSON field."""
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
    if where is not None:
        sql += f" AND {table}.{quote(meta.get_field(where).column)} = %s"
    return sql, tuple(isinstance(field, models.JSONField) for field in given)
