"""Row ids as the database holds them. A URL's `<int:...>` takes any number of digits, but the
database's integers stop at MAX_ID (SQLite's and PostgreSQL's bigint): a larger id names no
row, and asking the database for it raises OverflowError (a 500) instead of finding nothing."""

from __future__ import annotations

MAX_ID = 2**63 - 1


def is_row_id(value: int) -> bool:
    """Whether the database can hold `value` as an id (so may have a row with it)."""
    return 0 <= value <= MAX_ID
