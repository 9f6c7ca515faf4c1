"""Model instances from rows of written-out SQL, for the queries every API request pays for.

`Model.objects.raw()` maps the query's column names to the model's fields each time it runs,
which costs a token lookup as much CPU as running the query. Here the SQL selects the model's
columns in the model's order (`model_columns`), and `instance_from_row` makes each row an
instance as the ORM does (`from_db`, with the backend's value converters); `select_rows` gives
the converted rows of a SELECT of chosen fields. On PostgreSQL they
run through `prepared_cursor`: parsed and planned once per connection, not once per request."""

from __future__ import annotations

import select
from collections.abc import Sequence
from functools import cache

from django.db import DEFAULT_DB_ALIAS, connection, connections, models


def prepared_cursor():
    """A Django cursor (query log, execute wrappers, error translation) whose statements are
    prepared on the server the first time a connection runs them, and then only executed:
    PostgreSQL skips parsing and planning, which was most of its work for a token lookup.
    Parameters are bound on the server (`%s` placeholders, as Django's). Elsewhere, or with
    DATABASE_PREPARED_STATEMENTS off, a plain cursor. On PostgreSQL the cursors of one
    connection may be one reused cursor (_StatementCursor): fetch a statement's rows before
    the next prepared_cursor() statement runs."""
    db = connections[DEFAULT_DB_ALIAS]  # once: each use of the `connection` proxy looks it up
    if db.vendor != "postgresql":
        return db.cursor()
    # As db.cursor() does, with our cursor class.
    if (
        db.health_check_enabled
        and not db.health_check_done
        and db.connection is not None
        and _nothing_received(db)
    ):
        db.health_check_done = True
    db.close_if_health_check_failed()
    db.ensure_connection()
    if not (db.queries_logged or db.execute_wrappers):
        return _StatementCursor(db)
    with db.wrap_database_errors:
        cursor_class = _prepared_cursor_classes()[db.queries_logged]
        return db._prepare_cursor(cursor_class(db.connection))


def _nothing_received(db) -> bool:
    """Whether the server has sent nothing to the idle connection since its last statement:
    then it is still there, and Django's per-request health check (CONN_HEALTH_CHECKS: a
    `SELECT 1` round trip, 3% of a submit's CPU) can be skipped. A server that restarted or
    dropped the connection has sent its goodbye, or closed the socket: the socket is readable,
    and Django's check runs, reconnects, or the request gets a 503 while the server is down."""
    try:
        poll = select.poll()
        poll.register(db.connection.fileno(), select.POLLIN)
        return not poll.poll(0)
    except Exception:  # noqa: BLE001 — no socket (closed): Django's check decides
        return False


class _StatementCursor:
    """`prepared_cursor` when nothing logs or wraps the queries: the connection's one psycopg
    cursor, reused statement after statement (making a cursor, and Django's wrapper around it,
    cost as much CPU as executing a prepared statement), with Django's error translation, so a
    broken connection is still an OperationalError of django.db (a 503, see portal.middleware).
    Closing it leaves the psycopg cursor open for the connection's next statement."""

    __slots__ = ("db", "cursor")

    def __init__(self, db) -> None:
        self.db = db
        connection = db.connection
        cursor = getattr(db, "_prepared_statement_cursor", None)
        if cursor is None or cursor.connection is not connection:
            cursor = _prepared_cursor_classes()[False](connection)
            db._prepared_statement_cursor = cursor
        self.cursor = cursor

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        pass

    def close(self) -> None:
        pass

    def execute(self, sql: str, params=None):
        self.db.validate_no_broken_transaction()
        with self.db.wrap_database_errors:
            return self.cursor.execute(sql, params)

    def fetchone(self):
        with self.db.wrap_database_errors:
            return self.cursor.fetchone()

    def fetchall(self):
        with self.db.wrap_database_errors:
            return self.cursor.fetchall()

    @property
    def rowcount(self) -> int:
        return self.cursor.rowcount


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


def select_rows(sql: str, params: Sequence, fields: tuple[models.Field, ...]) -> list:
    """The rows of a written-out SELECT of `fields` (in that order), through
    `prepared_cursor`, with the values the ORM would load."""
    db = connections[DEFAULT_DB_ALIAS]
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    converting = _converting(fields, db.vendor)
    if not converting:
        return rows
    return [_convert(list(row), converting, db) for row in rows]


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
