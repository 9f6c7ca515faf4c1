"""`python -m scheduler.simulator SCENARIO.yaml --out RESULT.json [--plot FILE.html]`.

`manage.py simulate` calls `main(argv, stdout=self.stdout, stderr=self.stderr)` with the same
arguments, so the command and the module behave the same.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from scheduler.simulator.clock import EngineContractError, simulate
from scheduler.simulator.report import summary_table, write_plot
from scheduler.simulator.scenario import ScenarioError, load_scenario


def build_parser(prog: str = "python -m scheduler.simulator") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Replay a GPU sharing scenario through the scheduling engine on a simulated "
        "clock and write the result as JSON.",
    )
    parser.add_argument("scenario", help="scenario YAML file")
    parser.add_argument("--out", required=True, help="where to write the result JSON")
    parser.add_argument("--plot", help="also write an HTML chart of use, borrowing and lending")
    return parser


def main(
    argv: Sequence[str] | None = None,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run the simulator command line; return the exit status (0 ok, 2 bad scenario or output
    path, 1 engine)."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    # Checked before the run, so that a long run is not lost for a mistyped path.
    for option, path in (("--out", args.out), ("--plot", args.plot)):
        problem = _unwritable(path) if path is not None else None
        if problem:
            stderr.write(f"error: {option} {path}: {problem}\n")
            return 2
    try:
        scenario = load_scenario(args.scenario)
        result = simulate(scenario, record_series=bool(args.plot))
    except ScenarioError as exc:
        stderr.write(f"error: {exc}\n")
        return 2
    except EngineContractError as exc:
        stderr.write(f"engine error: {exc}\n")
        return 1
    try:
        with open(args.out, "w") as handle:
            json.dump(result.data, handle, indent=1)
            handle.write("\n")
        if args.plot:
            write_plot(result, args.plot, title=f"GPU sharing: {args.scenario}")
    except OSError as exc:  # e.g. the folder was removed, or the disk is full, during the run
        stderr.write(f"error: cannot write the result: {exc}\n")
        return 2
    stdout.write(summary_table(result.data))
    stdout.write(f"result written to {args.out}\n")
    if args.plot:
        stdout.write(f"chart written to {args.plot}\n")
    return 0


def _unwritable(path: str) -> str | None:
    """Why a file cannot be written at `path` (a folder there, no such folder, no permission),
    or None."""
    if os.path.isdir(path):
        return "is a folder, not a file"
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        return f"no folder {folder}"
    if not os.access(path if os.path.exists(path) else folder, os.W_OK):
        return "no permission to write it"
    return None
