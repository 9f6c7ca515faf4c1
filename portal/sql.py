"""Model instances from rows of written-out SQL, for the queries every API request pays for.

`Model.objects.raw()` maps the query's column names to the model's fields each time it runs,
which costs a token lookup as much CPU as running the query. Here the SQL selects the model's
columns in the model's order (`model_columns`), and `instance_from_row` makes each row an
instance as the ORM does (`from_db`, with the backend's value converters)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from django.db import connection, models


def model_columns(model: type[models.Model], alias: str) -> str:
    """`alias.column, ...` for every concrete field of `model`, in the model's order."""
    quote = connection.ops.quote_name
    return ", ".join(f"{alias}.{quote(field.column)}" for field in model._meta.concrete_fields)


@cache
def _converted_fields(model: type[models.Model], vendor: str) -> tuple[int, ...]:
    """Positions of the fields whose values the `vendor` backend converts (on SQLite booleans
    and datetimes; on PostgreSQL, for most models, none)."""
    return tuple(
        index
        for index, field in enumerate(model._meta.concrete_fields)
        if _converters(field.get_col(model._meta.db_table))
    )


def _converters(column) -> list:
    return connection.ops.get_db_converters(column) + column.get_db_converters(connection)


def instance_from_row(model: type[models.Model], row: Sequence):
    """An instance of `model` from the first values of `row`, selected by `model_columns`
    (values after them are the caller's)."""
    fields = model._meta.concrete_fields
    values = list(row[: len(fields)])
    for index in _converted_fields(model, connection.vendor):
        column = fields[index].get_col(model._meta.db_table)
        for converter in _converters(column):
            values[index] = converter(values[index], column, connection)
    return model.from_db(connection.alias, [field.attname for field in fields], values)
