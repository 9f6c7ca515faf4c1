"""One trace, three ways to share the cluster: what does lending buy?

Replays one synthetic trace (bench/gen_trace.py) with every share RESERVE (no lending: each
team has only its quota), every share LEND_AND_BORROW (idle quota lent and reclaimed), and one
single share holding the whole cluster (work-conserving: the bound lending can approach).
Prints utilization and p50/p95 wait per share, and LEND_AND_BORROW's utilization as a ratio of
the bound's. Sized to run in a couple of minutes.

    python bench/strategies.py [--jobs 1500] [--cluster-gpus 256]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from gen_trace import generate, synthetic_scenario, team_gpu_type, write_csv  # noqa: E402

from scheduler.simulator import parse_scenario, simulate  # noqa: E402
from scheduler.simulator.clock import percentile  # noqa: E402

TEAMS = 4
SEED = 11
LOAD = 1.0  # demand about equal to the cluster, so how it is shared matters


def one_share(data: dict, trace: Path) -> dict:
    """The same cluster with every job (`trace`, rewritten) in one share that holds all of it."""
    capacity: dict[str, int] = {}
    for node in data["nodes"]:
        capacity[node["gpu_type"]] = (
            capacity.get(node["gpu_type"], 0) + node["gpus"] * node["count"]
        )
    return {
        "nodes": data["nodes"],
        "shares": [
            {
                "name": "everyone",
                "capacity_limits": capacity,
                "strategy": "RESERVE",
                "grace_seconds": 120,
            }
        ],
        "trace": str(trace),
    }


def report(label: str, data: dict, trace_rows: list[dict]) -> float:
    started = time.perf_counter()
    result = simulate(parse_scenario(data)).data
    wall = time.perf_counter() - started
    owner = {row["id"]: row["share"] for row in trace_rows}
    waits: dict[str, list[float]] = {}
    for job in result["jobs"]:
        if job["wait_seconds"] is not None:
            waits.setdefault(owner[job["id"]], []).append(job["wait_seconds"])
    cluster = result["cluster"]
    print(
        f"\n{label}: utilization {cluster['utilization']:.1%}, makespan "
        f"{cluster['makespan'] / 3600:.1f} h, {wall:.1f} s to simulate"
    )
    print(f"  {'team':<10} {'jobs':>5} {'p50 wait h':>11} {'p95 wait h':>11}")
    for team in sorted(waits):
        team_waits = sorted(waits[team])
        print(
            f"  {team:<10} {len(team_waits):>5} {percentile(team_waits, 50) / 3600:>11.2f}"
            f" {percentile(team_waits, 95) / 3600:>11.2f}"
        )
    return cluster["utilization"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1500)
    parser.add_argument("--cluster-gpus", type=int, default=256)
    args = parser.parse_args()
    rows = generate(args.jobs, TEAMS, SEED, cluster_gpus=args.cluster_gpus, load=LOAD)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.csv"
        write_csv(rows, trace)
        print(
            f"{args.jobs} jobs of {TEAMS} teams on {args.cluster_gpus} GPUs "
            f"(teams on a100: {[i for i in range(TEAMS) if team_gpu_type(i) == 'a100']})"
        )
        base = dict(cluster_gpus=args.cluster_gpus, seed=SEED)
        report(
            "every share RESERVE",
            synthetic_scenario(trace, TEAMS, strategy="RESERVE", **base),
            rows,
        )
        lending = report(
            "every share LEND_AND_BORROW",
            synthetic_scenario(trace, TEAMS, strategy="LEND_AND_BORROW", **base),
            rows,
        )
        single = Path(tmp) / "single.csv"
        write_csv([row | {"share": "everyone"} for row in rows], single)
        bound = report(
            "one share holding the whole cluster (work-conserving bound)",
            one_share(synthetic_scenario(trace, TEAMS, **base), single),
            rows,
        )
        print(f"\nLEND_AND_BORROW utilization / bound: {lending / bound:.2f}")


if __name__ == "__main__":
    main()
