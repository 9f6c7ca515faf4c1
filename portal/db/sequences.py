"""Where a table's numbering goes on: the id its next row gets."""

from __future__ import annotations

from django.db import connection, models


def number_after(model: type[models.Model], skip: int) -> int:
    """Make `model`'s next new row get an id `skip` past its highest id today (an id above
    every one given out since a backup was taken, once that backup is restored). Returns it.
    Run twice, it gives the same answer: it counts from the rows, not from the numbering."""
    table = model._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COALESCE(MAX(id), 0) FROM {connection.ops.quote_name(table)}")
        (highest,) = cursor.fetchone()
        last = highest + skip - 1  # the next id is one past the last given
        if connection.vendor == "postgresql":
            cursor.execute("SELECT setval(pg_get_serial_sequence(%s, 'id'), %s)", [table, last])
        elif connection.vendor == "sqlite":
            # Django's SQLite ids are AUTOINCREMENT: numbered from sqlite_sequence.
            cursor.execute("DELETE FROM sqlite_sequence WHERE name = %s", [table])
            cursor.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (%s, %s)", [table, last])
        else:
            raise NotImplementedError(f"renumbering on {connection.vendor}")
    return last + 1
