"""The command line writes the result and the chart and prints a per-share table."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from scheduler.simulator.cli import main

SCENARIOS = Path(__file__).resolve().parents[2] / "scheduler" / "scenarios"


def test_cli_writes_result_and_prints_table(tmp_path):
    """`main` writes the result JSON and prints one row per share and the cluster line."""
    out = tmp_path / "result.json"
    stdout = io.StringIO()
    assert main([str(SCENARIOS / "reclaim.yaml"), "--out", str(out)], stdout=stdout) == 0
    result = json.loads(out.read_text())
    assert set(result) == {"events", "jobs", "shares", "cluster"}
    table = stdout.getvalue()
    assert re.search(r"^research\s", table, re.M) and re.search(r"^vision\s", table, re.M)
    assert "cluster:" in table


def test_cli_plot_is_self_contained_html(tmp_path):
    """--plot writes an HTML page with the share names and plotly.js inlined (no CDN)."""
    plot = tmp_path / "chart.html"
    code = main(
        [str(SCENARIOS / "reclaim.yaml"), "--out", str(tmp_path / "r.json"), "--plot", str(plot)],
        stdout=io.StringIO(),
    )
    assert code == 0
    html = plot.read_text()
    assert "research" in html and "vision" in html
    assert not re.search(r"<script[^>]*\bsrc=", html)


def test_cli_reports_a_bad_scenario_and_exits_2(tmp_path):
    """A scenario error is printed (naming the entry) with exit status 2, and no result."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "nodes: [{name: n, gpu_type: h100, gpus: 8}]\n"
        "shares: [{name: a, capacity_limits: {h100: 8}, strategy: LEND, borrow_limit: 10}]\n"
        "jobs: [{id: j, share: a, gpu_type: h100, gpus: 1, submit: 0, duration: 1}]\n"
    )
    stderr = io.StringIO()
    out = tmp_path / "r.json"
    assert main([str(bad), "--out", str(out)], stdout=io.StringIO(), stderr=stderr) == 2
    assert "shares[0] (a)" in stderr.getvalue()
    assert not out.exists()


@pytest.mark.parametrize("name", sorted(p.name for p in SCENARIOS.glob("*.yaml")))
def test_example_scenarios_run(name, tmp_path):
    """Every example scenario runs to the end."""
    out = tmp_path / "r.json"
    assert main([str(SCENARIOS / name), "--out", str(out)], stdout=io.StringIO()) == 0


def test_example_reclaim_times_are_those_its_header_states():
    """reclaim.yaml: r2 preempted at 100, v1 starts at 130, r2 resumes at 1130 and finishes
    at 4670 (60 s of its 90 s kept by its checkpoint)."""
    from scheduler.simulator import load_scenario, simulate

    events = simulate(load_scenario(SCENARIOS / "reclaim.yaml")).data["events"]
    assert [(e["t"], e["job"], e["type"]) for e in events if e["job"] != "r1"] == [
        (10, "r2", "start"),
        (100, "r2", "preempt"),
        (130, "v1", "start"),
        (1130, "v1", "finish"),
        (1130, "r2", "start"),
        (4670, "r2", "finish"),
    ]


def test_manage_py_simulate_writes_the_result(tmp_path):
    """The documented command, `manage.py simulate SCENARIO --out RESULT`, runs the simulator."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "result.json"
    simulate = [sys.executable, "manage.py", "simulate"]
    done = subprocess.run(
        [*simulate, "scheduler/scenarios/reclaim.yaml", "--out", str(out)],
        cwd=root, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert set(json.loads(out.read_text())) == {"events", "jobs", "shares", "cluster"}
    bad = subprocess.run(
        [*simulate, str(tmp_path / "missing.yaml"), "--out", str(out)],
        cwd=root, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode != 0 and "missing.yaml" in bad.stderr
