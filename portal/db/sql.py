"""Prepared statements, and model instances from rows of written-out SQL, for the queries every
API and agent request pays for.

Composing those queries with the ORM (or mapping a raw() query's columns to fields) costs more
CPU than PostgreSQL spends running them; written out, a submit does several times as many
requests a second (bench/api.py) and the web process spends much less CPU per job of a soak
(bench/soak.py). Here the SQL selects the model's columns in the model's order
(`model_columns`), and `instance_from_row` makes each row an instance as the ORM does
(`from_db`, with the backend's value converters); `select_rows` gives the converted rows of a
SELECT of chosen fields. On PostgreSQL they run through `prepared_cursor`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache

from django.db import DEFAULT_DB_ALIAS, connection, connections, models


def prepared_cursor():
    """A Django cursor (query log, execute wrappers, error translation) whose statements are
    prepared on the server the first time a connection runs them, and then only executed:
    PostgreSQL skips parsing and planning, which is most of its work for a token lookup
    (bench/api.py: submits/s with and without). Parameters are bound on the server (`%s`
    placeholders, as Django's; `%b` for binary). Elsewhere a plain cursor. With
    DATABASE_PREPARED_STATEMENTS off (behind a pooler that cannot keep prepared statements),
    statements are still bound on the server but never prepared."""
    db = connections[DEFAULT_DB_ALIAS]  # once: each use of the `connection` proxy looks it up
    if db.vendor != "postgresql":
        return db.cursor()
    # What db.cursor() does (health check, connection, Django's wrapper), with our cursor class.
    db.close_if_health_check_failed()
    db.ensure_connection()
    with db.wrap_database_errors:
        cursor_class = _prepared_cursor_classes()[db.queries_logged]
        return db._prepare_cursor(cursor_class(db.connection))


@cache
def _prepared_cursor_classes() -> dict[bool, type]:
    """The cursor class of `prepared_cursor`, by whether Django logs the queries."""
    import psycopg

    class PreparedCursor(psycopg.Cursor):
        # psycopg prepares a statement when asked to, unless the connection's prepare_threshold
        # is None (Django's default; settings.py sets one unless prepared statements are off).
        def execute(self, query, params=None, *, prepare=True, binary=None):
            return super().execute(query, params, prepare=prepare, binary=binary)

    class LoggedPreparedCursor(PreparedCursor):
        # Django's query log (DEBUG, CaptureQueriesContext) reads the statement psycopg sent
        # last, which an execution of a prepared statement leaves unset.
        def execute(self, query, params=None, *, prepare=True, binary=None):
            super().execute(query, params, prepare=prepare, binary=binary)
            if self._query is None:
                self._query = self._convert_query(query, params)
            return self

    return {False: PreparedCursor, True: LoggedPreparedCursor}


def model_columns(model: type[models.Model], alias: str) -> str:
    """`alias.column, ...` for every concrete field of `model`, in the model's order."""
    quote = connection.ops.quote_name
    return ", ".join(f"{alias}.{quote(field.column)}" for field in model._meta.concrete_fields)


@cache
def _converting(fields: tuple[models.Field, ...], vendor: str) -> tuple:
    """(position, column, converters) of the `fields` whose values the `vendor` backend or the
    field converts when the ORM loads them (JSON fields everywhere; on SQLite booleans and
    datetimes too)."""
    converting = []
    for index, field in enumerate(fields):
        column = field.get_col(field.model._meta.db_table)
        converters = connection.ops.get_db_converters(column) + column.get_db_converters(connection)
        if converters:
            converting.append((index, column, tuple(converters)))
    return tuple(converting)


def _convert(values: list, converting: tuple, db) -> list:
    """`values` (a row of the fields `converting` was made for) as the ORM loads them."""
    for index, column, converters in converting:
        for converter in converters:
            values[index] = converter(values[index], column, db)
    return values


def select_rows(
    sql: str, params: Sequence, fields: tuple[models.Field, ...], *, convert: bool = True
) -> list:
    """The rows of a written-out SELECT of `fields` (in that order), through
    `prepared_cursor`, with the values the ORM would load; as the database gives them without
    `convert` (then `converted_row` converts the rows the caller uses)."""
    db = connections[DEFAULT_DB_ALIAS]
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    converting = _converting(fields, db.vendor)
    if not converting or not convert:
        return rows
    return [_convert(list(row), converting, db) for row in rows]


def converted_row(row: Sequence, fields: tuple[models.Field, ...]) -> list:
    """A row of `select_rows(..., convert=False)` with the values the ORM would load."""
    db = connections[DEFAULT_DB_ALIAS]
    return _convert(list(row), _converting(fields, db.vendor), db)


def json_value(value):
    """A JSON column's value as a plain cursor gives it (the text on PostgreSQL, whose JSON the
    backend leaves for the field to decode, and on SQLite), decoded; for a hot loop that reads
    rows without `select_rows`' conversions."""
    return json.loads(value) if isinstance(value, str) else value


def instance_from_row(model: type[models.Model], row: Sequence):
    """An instance of `model` from the first values of `row`, selected by `model_columns`
    (values after them are the caller's)."""
    db = connections[DEFAULT_DB_ALIAS]  # once: each use of the `connection` proxy looks it up
    fields = tuple(model._meta.concrete_fields)
    values = _convert(list(row[: len(fields)]), _converting(fields, db.vendor), db)
    return model.from_db(db.alias, _attnames(model), values)


@cache
def _attnames(model: type[models.Model]) -> list[str]:
    return [field.attname for field in model._meta.concrete_fields]


# --- Sets of rows as one parameter -------------------------------------------------------------
# A statement about thousands of rows (the cycle's placements, its waiting reasons) takes them
# as one parameter of JSON text: json.dumps writes it in C, and both PostgreSQL and SQLite
# read it in C (jsonb_array_elements, json_each), where binding arrays costs psycopg a Python
# loop over every value and SQLite a bound parameter each, below its limit. The same SQL, with
# a vendor's function names, serves both databases.


def ids_sql(column: str) -> str:
    """`column` is one of the ids given as one parameter (`ids_param`). A semi-join on
    PostgreSQL: as a filter, `= ANY(array)` compares each row with every id (a prepared
    statement's generic plan cannot hash a parameter's array)."""
    if connection.vendor == "postgresql":
        return f"{column} IN (SELECT unnest(%s::bigint[]))"
    return f"{column} IN (SELECT value FROM json_each(%s))"


def ids_param(ids) -> str:
    """The parameter of `ids_sql`: an array literal on PostgreSQL, JSON elsewhere."""
    text = ",".join(map(str, ids))
    return f"{{{text}}}" if connection.vendor == "postgresql" else f"[{text}]"


def json_rows_sql(types: Sequence[str]) -> str:
    """A subquery of the rows given as one parameter, a JSON array of arrays (`json_rows_param`):
    columns c0, c1, ... of the SQL `types` (PostgreSQL's names, e.g. a field's db_type; "jsonb"
    values stay JSON)."""
    if connection.vendor == "postgresql":
        columns = ", ".join(
            f"(e.value -> {i}) AS c{i}" if kind == "jsonb" else f"(e.value ->> {i})::{kind} AS c{i}"
            for i, kind in enumerate(types)
        )
        return f"(SELECT {columns} FROM jsonb_array_elements(%s::jsonb) AS e)"
    columns = ", ".join(f"json_extract(e.value, '$[{i}]') AS c{i}" for i in range(len(types)))
    return f"(SELECT {columns} FROM json_each(%s) AS e)"


def json_rows_param(rows) -> str:
    """The parameter of `json_rows_sql`: `rows` (sequences of JSON values) as JSON text."""
    return json.dumps(rows if isinstance(rows, list) else list(rows), separators=(",", ":"))
