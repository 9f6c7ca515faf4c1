"""`manage.py chargeback`: the operator's chargeback of every share, as the API's, in CSV
(default) or JSON, to standard output or a file; a bad range is refused naming the option."""

from __future__ import annotations

import csv
import io
import json

import pytest
from django.core.management import CommandError, call_command

from dashboards.chargeback import COLUMNS, END_NOT_AFTER_START


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("chargeback", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


@pytest.mark.django_db
def test_the_command_writes_every_shares_chargeback_as_csv_with_a_header_row(november):
    reader = csv.DictReader(io.StringIO(run("--from", "2025-11-01", "--to", "2025-12-01")))
    assert tuple(reader.fieldnames) == COLUMNS
    rows = {(r["share"], r["gpu_type"]): r for r in reader}
    assert set(rows) == {("gone", "h100"), ("research", "h100"), ("research", "l4"),
                         ("vision", "h100")}  # fmt: skip
    assert rows[("research", "h100")]["borrowed_gpu_hours"] == "20.0"
    assert rows[("vision", "h100")]["lent_gpu_hours"] == "20.0"


@pytest.mark.django_db
def test_the_command_gives_the_apis_json(november):
    """The same document as GET /api/v1/chargeback/ as an admin."""
    document = json.loads(run("--month", "2025-11", "--format", "json", "--team", "vision"))
    api = november.client("root").get("/api/v1/chargeback/", {"month": "2025-11", "team": "vision"})
    assert document == api.json()
    assert [r["share"] for r in document["rows"]] == ["vision"]


@pytest.mark.django_db
def test_the_command_writes_a_file(november, tmp_path):
    target = tmp_path / "november.csv"
    assert run("--month", "2025-11", "--per", "month", "--output", str(target)) == ""
    assert target.read_text().splitlines()[0] == ",".join(COLUMNS)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "args, message",
    [
        (("--from", "2025-12-01", "--to", "2025-11-01"), "--to" + END_NOT_AFTER_START[3:]),
        (("--from", "1 Nov", "--to", "2025-12-01"), "--from: give a date YYYY-MM-DD"),
        (("--to", "2025-12-01"), "--from: required"),
        (("--month", "2025-11", "--share", "nope"), "share: no share named 'nope'"),
    ],
)
def test_the_command_refuses_a_bad_range_naming_the_option(world, args, message):
    with pytest.raises(CommandError) as refused:
        run(*args)
    assert str(refused.value).startswith(message)
