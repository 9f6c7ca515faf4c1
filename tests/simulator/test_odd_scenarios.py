"""Odd scenario files, traces and command lines: each is refused with a clear error naming the
field (or the CSV line and column) and the rule, or simulated exactly as written; never a
Python traceback from the command line."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from scheduler.simulator import ScenarioError, load_scenario, parse_scenario, simulate
from scheduler.simulator.cli import main

NODES = "nodes: [{name: gpu, gpu_type: h100, gpus: 8, count: 2}]\n"
SHARES = "shares: [{name: research, capacity_limits: {h100: 8}, strategy: LEND_AND_BORROW}]\n"
HEADER = "id,share,gpu_type,gpus,submit,duration,priority"


def scenario_with_trace(tmp_path: Path, trace: bytes) -> Path:
    (tmp_path / "t.csv").write_bytes(trace)
    path = tmp_path / "s.yaml"
    path.write_text(NODES + SHARES + "trace: t.csv\n")
    return path


def run_cli(args: list[str]) -> tuple[int, str]:
    """The exit status and stderr of the command line; a Python exception escaping it fails
    the test (the user would see a traceback)."""
    stderr = io.StringIO()
    try:
        code = main(args, stdout=io.StringIO(), stderr=stderr)
    except Exception as exc:  # noqa: BLE001 - what a user would see as a traceback
        pytest.fail(f"the command line raised {type(exc).__name__}: {exc}")
    return code, stderr.getvalue()


def one_job_scenario(tmp_path: Path, job: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(NODES + SHARES + f"jobs: [{job}]\n")
    return path


# ---- the simulator's answer for jobs the portal would refuse -------------------------------


@pytest.mark.parametrize(
    "capacity_limits", [{"h100": 8}, {"h100": 8, "a100": 8}], ids=["no-limit", "limit"]
)
def test_a_job_for_a_gpu_type_no_node_has_is_rejected_not_a_crash(capacity_limits):
    """DESIGN §2: a job that could never fit the nodes, or asks for a GPU type its share has no
    limit for, is rejected (a `reject` event with the reason). A job for a GPU type the
    cluster has no node of (a typo, or `H100` for `h100`) crashes the simulator with a
    KeyError instead."""
    data = {
        "nodes": [{"name": "gpu", "gpu_type": "h100", "gpus": 8}],
        "shares": [
            {"name": "research", "capacity_limits": capacity_limits, "strategy": "LEND"}
        ],
        "jobs": [
            {"id": "j1", "share": "research", "gpu_type": "a100", "gpus": 1, "submit": 0,
             "duration": 60},
            {"id": "j2", "share": "research", "gpu_type": "h100", "gpus": 1, "submit": 0,
             "duration": 60},
        ],
    }  # fmt: skip
    result = simulate(parse_scenario(data)).data
    j1 = next(j for j in result["jobs"] if j["id"] == "j1")
    assert j1["state"] == "FAILED" and "a100" in j1["reason"]
    assert ("j1", "reject") in [(e["job"], e["type"]) for e in result["events"]]
    j2 = next(j for j in result["jobs"] if j["id"] == "j2")
    assert j2["state"] == "SUCCEEDED"


def test_the_command_line_reports_a_job_for_a_gpu_type_no_node_has(tmp_path):
    """The same through the command line: no traceback, a result with the job rejected."""
    path = one_job_scenario(
        tmp_path, "{id: j1, share: research, gpu_type: H100, gpus: 1, submit: 0, duration: 60}"
    )
    code, _ = run_cli([str(path), "--out", str(tmp_path / "r.json")])
    assert code == 0
    (job,) = json.loads((tmp_path / "r.json").read_text())["jobs"]
    assert job["state"] == "FAILED" and "H100" in job["reason"]


# ---- scenario files --------------------------------------------------------------------------


def test_a_scenario_file_that_is_not_utf8_is_a_clear_error(tmp_path):
    """A scenario saved in Latin-1 (a comment with an accent) gets `error: ...` and status 2,
    as an unreadable trace does ("not a UTF-8 CSV file"), not a UnicodeDecodeError
    traceback."""
    path = one_job_scenario(
        tmp_path, "{id: j1, share: research, gpu_type: h100, gpus: 1, submit: 0, duration: 60}"
    )
    path.write_bytes("# équipe vision\n".encode("latin-1") + path.read_bytes())
    code, stderr = run_cli([str(path), "--out", str(tmp_path / "r.json")])
    assert code == 2
    assert "UTF-8" in stderr and str(path) in stderr


def test_a_key_given_twice_in_a_scenario_is_an_error(tmp_path):
    """Scenarios are checked strictly (unknown keys are errors, DESIGN §4) and an accepted one is
    simulated as written: a share that says grace_seconds twice must not silently keep only
    the last value."""
    path = tmp_path / "s.yaml"
    path.write_text(
        NODES + "shares: [{name: research, capacity_limits: {h100: 8}, strategy: LEND_AND_BORROW,\n"
        "           grace_seconds: 600, grace_seconds: 0}]\n"
        "jobs: [{id: j1, share: research, gpu_type: h100, gpus: 1, submit: 0, duration: 60}]\n"
    )
    with pytest.raises(ScenarioError, match="grace_seconds"):
        load_scenario(path)


@pytest.mark.parametrize("job_id", [None, "", [1]], ids=["null", "empty", "list"])
def test_a_job_id_must_be_a_name(job_id):
    """A job's `id` of the wrong type (null, empty, a list) is a clear error naming the job,
    like every other field, not a job silently called "None", "" or "[1]" (a trace's empty id
    is already an error)."""
    data = {
        "nodes": [{"name": "gpu", "gpu_type": "h100", "gpus": 8}],
        "shares": [{"name": "research", "capacity_limits": {"h100": 8}, "strategy": "LEND"}],
        "jobs": [
            {"id": job_id, "share": "research", "gpu_type": "h100", "gpus": 1, "submit": 0,
             "duration": 60},
        ],
    }  # fmt: skip
    with pytest.raises(ScenarioError, match=r"jobs\[0\].*id"):
        parse_scenario(data)


def test_a_node_with_an_absurd_number_of_gpus_is_refused_before_the_clock_starts():
    """scenario.py checks everything before the clock starts; a node of 10^10 GPUs (the portal
    allows at most 64 per node) is accepted, then the simulator dies of a MemoryError (or the
    machine runs out of memory) building its node sizes. It should be a ScenarioError naming
    the node's gpus."""
    data = {
        "nodes": [{"name": "gpu", "gpu_type": "h100", "gpus": 10**10}],
        "shares": [{"name": "research", "capacity_limits": {"h100": 8}, "strategy": "LEND"}],
        "jobs": [
            {"id": "j1", "share": "research", "gpu_type": "h100", "gpus": 1, "submit": 0,
             "duration": 60},
        ],
    }  # fmt: skip
    with pytest.raises(ScenarioError, match=r"nodes\[0\].*gpus"):
        parse_scenario(data)


def test_a_huge_duration_is_refused_or_gives_a_valid_json_result(tmp_path):
    """A finite but huge duration (1e308 s) is accepted and the result file then holds
    `Infinity` and `NaN`, which is not JSON (other tools cannot read it, DESIGN §4). Either
    the scenario is refused naming `duration`, or the result is valid JSON."""
    path = one_job_scenario(
        tmp_path,
        "{id: j1, share: research, gpu_type: h100, gpus: 8, submit: 0, duration: 1.0e+308}",
    )
    out = tmp_path / "r.json"
    code, stderr = run_cli([str(path), "--out", str(out)])
    if code == 2:
        assert "duration" in stderr
        return
    assert code == 0

    def refuse(constant: str) -> None:
        raise AssertionError(f"the result holds {constant}, which is not JSON")

    json.loads(out.read_text(), parse_constant=refuse)


# ---- CSV traces ------------------------------------------------------------------------------


def test_a_trace_column_given_twice_is_an_error(tmp_path):
    """A header naming `gpus` twice: the simulator silently uses the last cell and drops the
    first (the job runs on 4 GPUs, not 8). An accepted trace is simulated as written, so a
    repeated column must be an error naming it."""
    path = scenario_with_trace(tmp_path, f"{HEADER},gpus\nj1,research,h100,8,0,60,0,4\n".encode())
    with pytest.raises(ScenarioError, match="gpus"):
        load_scenario(path)


def test_a_trace_saved_with_a_byte_order_mark_reads_as_without_it(tmp_path):
    """A UTF-8 CSV with a byte order mark (Excel's "CSV UTF-8") is refused with "missing
    columns id", though its header starts with id: the BOM is glued to the first column's
    name. It is a UTF-8 file: it reads as the same jobs as without the mark."""
    body = f"{HEADER}\nj1,research,h100,8,0,60,0\n".encode()
    plain = load_scenario(scenario_with_trace(tmp_path, body))
    with_bom = load_scenario(scenario_with_trace(tmp_path, b"\xef\xbb\xbf" + body))
    assert with_bom.jobs == plain.jobs


def test_a_trace_row_with_more_cells_than_the_header_names_the_rule(tmp_path):
    """A row with one cell too many is refused as "unknown key None": it names the line, but
    not the rule (the row has more cells than the header has columns)."""
    path = scenario_with_trace(tmp_path, f"{HEADER}\nj1,research,h100,8,0,60,0,5\n".encode())
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    message = str(caught.value)
    assert "line 2" in message
    assert "None" not in message
    assert "cell" in message or "column" in message


# ---- the command line's options --------------------------------------------------------------


@pytest.mark.parametrize("where", ["missing-dir/r.json", "."], ids=["no-folder", "a-folder"])
def test_an_out_path_that_cannot_be_written_is_a_clear_error(tmp_path, where):
    """`--out` in a folder that does not exist, or naming a folder, gets `error: ...` naming
    the path and a non-zero status, not a FileNotFoundError / IsADirectoryError traceback."""
    path = one_job_scenario(
        tmp_path, "{id: j1, share: research, gpu_type: h100, gpus: 1, submit: 0, duration: 60}"
    )
    out = tmp_path / where
    code, stderr = run_cli([str(path), "--out", str(out)])
    assert code != 0
    assert "error" in stderr and str(out).rstrip("/.") in stderr


def test_a_plot_path_that_cannot_be_written_is_a_clear_error(tmp_path):
    """`--plot` in a folder that does not exist: a clear error naming the path and a non-zero
    status, not a traceback."""
    path = one_job_scenario(
        tmp_path, "{id: j1, share: research, gpu_type: h100, gpus: 1, submit: 0, duration: 60}"
    )
    plot = tmp_path / "missing-dir" / "chart.html"
    code, stderr = run_cli([str(path), "--out", str(tmp_path / "r.json"), "--plot", str(plot)])
    assert code != 0
    assert "error" in stderr and str(plot) in stderr
