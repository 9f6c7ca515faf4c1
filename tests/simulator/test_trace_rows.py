"""A CSV trace reads the same whether its rows are well-formed (read in one go) or not (checked
cell by cell, the error naming the line and the job)."""

from __future__ import annotations

import csv
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.engine.snapshot import ShareView
from scheduler.simulator import ScenarioError
from scheduler.simulator.scenario import (
    OPTIONAL_TRACE_COLUMNS,
    TRACE_COLUMNS,
    _parse_job,
    read_trace,
)

SHARES = {"vision": ShareView("vision", {"h100": 8}, "LEND")}
COLUMNS = TRACE_COLUMNS + OPTIONAL_TRACE_COLUMNS
# Per column: cells a well-formed row may have, and all the cells tried (empty, signs,
# fractions, words, ...).
NUMBERS = ["", "0", "1", "2", "8", "-1", "1.5", "2.0", " 3", "1e3", "inf", "nan", "x", "1_0"]
GOOD = {
    "id": ["j", "7"],
    "share": ["vision"],
    "gpu_type": ["h100"],
    "gpus": ["1", "8", "2.0"],
    "submit": ["0", "1.5", "1e3"],
    "duration": ["1", "0.5"],
    "priority": ["", "0", "9999"],
    "nodes": ["", "1", "2"],
    "max_preemptions": ["", "0", "3"],
    "checkpoint_interval": ["", "60", "0.5"],
    "preemptible": ["", "true", "false", "True"],
}
ANY = {
    "id": ["j", "", "a b"],
    "share": ["vision", "", "nobody"],
    "gpu_type": ["h100", "", "a100"],
    "priority": ["10000", "-1", "1.5", "x"],
    "preemptible": ["yes", "0", "", "FALSE"],
}


@st.composite
def trace_rows(draw) -> list[str]:
    """A well-formed row, maybe with a cell or two changed to anything, or a row of the wrong
    length."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.lists(st.sampled_from(NUMBERS), max_size=12))
    row = [draw(st.sampled_from(GOOD[column])) for column in COLUMNS]
    for _ in range(draw(st.integers(0, 2))):
        index = draw(st.integers(0, len(COLUMNS) - 1))
        row[index] = draw(st.sampled_from(ANY.get(COLUMNS[index], NUMBERS)))
    return row


rows = st.lists(trace_rows(), max_size=6)


def cell_by_cell(path: Path) -> list | str:
    """The trace as read row by row with csv.DictReader and every check of `_parse_job`: the
    jobs, or the first error."""
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        jobs = []
        try:
            for row in reader:
                raw = {k: v for k, v in row.items() if v not in ("", None)}
                where = f"trace {path.name} line {reader.line_num}"
                jobs.append(_parse_job(raw, where, SHARES, from_text=True))
        except ScenarioError as error:
            return str(error)
    return jobs


@settings(max_examples=300, deadline=None)
@given(rows=rows, blank_line=st.booleans())
def test_trace_rows_read_as_checked_cell_by_cell(rows, blank_line):
    """Whatever the cells, read_trace gives the jobs (with their types: whole numbers as int)
    or the error message that checking each cell of each row gives."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "t.csv"
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(COLUMNS)
            for row in rows:
                writer.writerow(row)
                if blank_line:
                    handle.write("\r\n")
        expected = cell_by_cell(path)
        try:
            jobs = read_trace(path, SHARES)
        except ScenarioError as error:
            assert str(error) == expected
        else:
            assert jobs == expected
            assert [tuple(map(type, vars(job).values())) for job in jobs] == [
                tuple(map(type, vars(job).values())) for job in expected
            ]
