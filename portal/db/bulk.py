"""Bulk writes: one statement each on PostgreSQL, batched ORM elsewhere.

A placing cycle inserts thousands of rows (attempts, GPU assignments, job events) and rewrites
the reasons of tens of thousands of waiting jobs. Through model instances and `IN (...)` lists
that is mostly Python and round trips. `json_insert` is one statement on every database, its
rows one JSON parameter; on PostgreSQL `rows_update` is one statement over arrays (`unnest`,
bound in binary), elsewhere (SQLite in development and tests) the ORM in batches below the
bound-parameter limit. `insert_with_children` writes a submit's job and its events in one
statement (bench/api.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from datetime import datetime
from functools import cache

from django.db import DEFAULT_DB_ALIAS, connection, connections, models, transaction
from django.utils import timezone

from portal.db.sql import json_rows_param, json_rows_sql, prepared_cursor

# Rows per statement on the ORM path: below SQLite's limit of bound parameters.
BATCH = 900


def _postgresql() -> bool:
    return connection.vendor == "postgresql"


def id_batches(ids: Sequence[int]) -> Iterable[Sequence[int]]:
    """`ids` in batches for `pk__in` filters: one on PostgreSQL, BATCH at a time elsewhere."""
    size = 30_000 if _postgresql() else BATCH  # PostgreSQL allows 65,535 parameters
    for start in range(0, len(ids), size):
        yield ids[start : start + size]


def json_insert(
    model: type[models.Model],
    fields: Sequence[str],
    rows: Iterable[Sequence],
    *,
    returning: Sequence[str] = (),
) -> list[tuple]:
    """Insert `rows` (values in the order of `fields`, attribute names such as "job_id") into
    `model`'s table in one statement on every database; the model's other fields get their
    defaults, and auto_now(_add) fields the current time, as the ORM does. The rows (JSON
    values) travel as one JSON parameter (`portal.db.sql.json_rows_sql`): for the cycle's
    thousands of rows, binding arrays value by value was most of the cost. Returns, per
    inserted row, the values of `returning`, in no particular order."""
    rows = list(rows)
    if not rows:
        return []
    sql, defaults = _json_insert_plan(model, tuple(fields), tuple(returning), connection.vendor)
    now = timezone.now()
    params = [
        field.get_db_prep_save(now if stamped else field.get_default(), connection)
        for field, stamped in defaults
    ]
    params.append(json_rows_param(rows))
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        return [tuple(row) for row in cursor.fetchall()] if returning else []


@cache
def _json_insert_plan(
    model: type[models.Model], fields: tuple[str, ...], returning: tuple[str, ...], vendor: str
) -> tuple[str, tuple[tuple[models.Field, bool], ...]]:
    """json_insert's statement, and the fields that get their default (with whether they are
    auto_now(_add) stamps), whose values are its first parameters."""
    meta = model._meta
    given = [meta.get_field(name) for name in fields]
    if any(getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False) for f in given):
        raise ValueError("auto_now and auto_now_add fields are set by json_insert")
    columns = [field.column for field in given]
    selects = [f"v.c{index}" for index in range(len(given))]
    defaults = []
    for field in meta.concrete_fields:
        if field in given or field.primary_key:
            continue
        stamped = getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False)
        columns.append(field.column)
        defaults.append((field, stamped))
        # Typed on PostgreSQL: a bare parameter in a SELECT list would be text.
        selects.append(f"%s::{field.db_type(connection)}" if vendor == "postgresql" else "%s")
    quote = connection.ops.quote_name
    source = json_rows_sql(
        ["jsonb" if isinstance(field, models.JSONField) else field.db_type(connection)
         for field in given]
    )  # fmt: skip
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({', '.join(quote(c) for c in columns)}) "
        f"SELECT {', '.join(selects)} FROM {source} AS v"
    )
    if returning:
        sql += " RETURNING " + ", ".join(quote(meta.get_field(n).column) for n in returning)
    return sql, tuple(defaults)


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


def insert_with_children(parent: models.Model, children: Sequence[models.Model], *, link: str):
    """Insert the new `parent` and its new `children` (instances of one model whose foreign key
    `link` is the parent), all or nothing: on PostgreSQL in one statement, which outside a
    transaction commits on its own (no BEGIN and COMMIT round trips for a submit; a submit
    does markedly more requests a second than with save() and bulk_create(), bench/api.py);
    elsewhere parent.save() and bulk_create in a transaction. Inside the caller's transaction,
    a savepoint: a failed insert (IntegrityError) leaves that transaction usable. As save()
    does, sets parent.pk and stamps the auto_now(_add) fields; the children's rows get their
    ids, and so their order, as listed."""
    if not _postgresql():
        with transaction.atomic():
            parent.save()
            if children:
                type(children[0]).objects.bulk_create(children)
        return
    # The connection itself, not the `connection` proxy, which looks it up at every use.
    db = connections[DEFAULT_DB_ALIAS]
    child_model = type(children[0]) if children else None
    params = _db_values(parent, _save_plan(type(parent), None), db)
    if child_model is not None:
        plan = _save_plan(child_model, link)
        for child in children:
            params += _db_values(child, plan, db)
    savepoint = transaction.atomic() if connection.in_atomic_block else nullcontext()
    with savepoint, prepared_cursor() as cursor:
        cursor.execute(_insert_sql(type(parent), child_model, link, len(children)), params)
        parent.pk = cursor.fetchone()[0]
    parent._state.adding = False
    parent._state.db = connection.alias
    for child in children:
        setattr(child, link, parent)


@cache
def _new_row_fields(model: type[models.Model], link: str | None) -> tuple[models.Field, ...]:
    """The fields a new row of `model` writes: all but its primary key (and the foreign key
    `link`, which the statement fills in)."""
    return tuple(
        field
        for field in model._meta.concrete_fields
        if not field.primary_key and (link is None or field.name != link)
    )


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
def _save_plan(model: type[models.Model], link: str | None) -> tuple:
    """Per field of a new row (`_new_row_fields`): the field, the attribute save() reads when
    the field's pre_save is a plain read (else None), and the type written as is (see
    _written_as_is)."""
    return tuple(
        (
            field,
            field.attname if type(field).pre_save is models.Field.pre_save else None,
            _written_as_is(field),
        )
        for field in _new_row_fields(model, link)
    )


def _db_values(instance: models.Model, plan: tuple, db) -> list:
    """What save() would write for the new `instance`, by its `_save_plan` (defaults, auto_now
    stamps): a value already of a type PostgreSQL takes as is goes as it is, which spares most
    of the calls to get_db_prep_save."""
    values = []
    for field, attname, plain in plan:
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
def _insert_sql(
    parent: type[models.Model], child: type[models.Model] | None, link: str, children: int
) -> str:
    """The parent's INSERT, and its `children` rows' in the same statement."""
    quote = connection.ops.quote_name
    parent_fields = _new_row_fields(parent, None)
    columns = ", ".join(quote(field.column) for field in parent_fields)
    values = ", ".join(["%s"] * len(parent_fields))
    insert = (
        f"INSERT INTO {quote(parent._meta.db_table)} ({columns}) VALUES ({values}) "
        f"RETURNING {quote(parent._meta.pk.column)}"
    )
    if child is None or not children:
        return insert
    child_fields = _new_row_fields(child, link)
    link_column = quote(child._meta.get_field(link).column)
    child_columns = ", ".join(quote(field.column) for field in child_fields)
    row = ", ".join(f"%s::{field.db_type(connection)}" for field in child_fields)
    rows = ", ".join(f"({row}, {n})" for n in range(children))
    names = ", ".join(f"c{i}" for i in range(len(child_fields)))
    # ORDER BY n: the children get their ids, and so their order, as listed.
    return (
        f"WITH new_parent AS ({insert}) "
        f"INSERT INTO {quote(child._meta.db_table)} ({link_column}, {child_columns}) "
        f"SELECT new_parent.{quote(parent._meta.pk.column)}, {names} FROM new_parent, "
        f"(VALUES {rows}) AS c({names}, n) ORDER BY c.n "
        f"RETURNING {link_column}"
    )
