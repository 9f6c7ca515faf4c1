"""How fast the simulator replays a large trace (goal: 100,000 jobs in at most 60 s).

Generates the traces in-process (bench/gen_trace.py), writes them to a temporary CSV, and times
`simulate` (reading and checking the scenario is timed apart). Prints the wall time and jobs/s,
the median of `--runs` runs, and the per-job time against a 10,000-job trace of the same shape
(a ratio near 1 means the simulator scales linearly with the trace).

    python bench/simulate.py [--jobs 100000] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from gen_trace import generate, synthetic_scenario, write_csv  # noqa: E402

from scheduler.engine import plan  # noqa: E402
from scheduler.simulator import parse_scenario, simulate  # noqa: E402

TEAMS = 6
CLUSTER_GPUS = 1024
SEED = 7


def time_trace(jobs: int, runs: int, workdir: Path) -> tuple[float, float, dict]:
    """(median seconds to simulate, seconds to load, cluster figures) for a `jobs`-job trace."""
    trace = workdir / f"trace-{jobs}.csv"
    write_csv(generate(jobs, TEAMS, SEED, cluster_gpus=CLUSTER_GPUS), trace)
    started = time.perf_counter()
    scenario = parse_scenario(
        synthetic_scenario(trace, TEAMS, seed=SEED, cluster_gpus=CLUSTER_GPUS)
    )
    load_seconds = time.perf_counter() - started
    times: list[float] = []
    engine_seconds: list[float] = []
    cycles = 0
    result = None
    for _ in range(runs):
        spent = [0.0, 0]

        def timed_plan(snapshot, spent=spent):
            # How much of the run is the engine's own planning, to know where the time goes.
            started = time.perf_counter()
            decided = plan(snapshot)
            spent[0] += time.perf_counter() - started
            spent[1] += 1
            return decided

        started = time.perf_counter()
        result = simulate(scenario, engine=timed_plan)
        times.append(time.perf_counter() - started)
        engine_seconds.append(spent[0])
        cycles = spent[1]
    assert result is not None
    figures = result.data["cluster"] | {
        "events": len(result.data["events"]),
        "engine_seconds": statistics.median(engine_seconds),
        "cycles": cycles,
    }
    return statistics.median(times), load_seconds, figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--baseline-jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        print(f"cluster: {CLUSTER_GPUS} GPUs (h100 + a100), {TEAMS} shares, seed {SEED}")
        base, base_load, base_cluster = time_trace(args.baseline_jobs, args.runs, workdir)
        print(
            f"{args.baseline_jobs:>7} jobs: {base:7.2f} s "
            f" ({args.baseline_jobs / base:8.0f} jobs/s)"
            f"  load {base_load:.2f} s  median of {args.runs}"
        )
        big, big_load, cluster = time_trace(args.jobs, args.runs, workdir)
        print(
            f"{args.jobs:>7} jobs: {big:7.2f} s  ({args.jobs / big:8.0f} jobs/s)"
            f"  load {big_load:.2f} s  median of {args.runs}"
        )
        for jobs, wall, figures in (
            (args.baseline_jobs, base, base_cluster),
            (args.jobs, big, cluster),
        ):
            print(
                f"{jobs:>7} jobs: {figures['cycles']} engine cycles, "
                f"{figures['engine_seconds']:.2f} s in the engine "
                f"({figures['engine_seconds'] / wall:.0%} of the run)"
            )
        ratio = (big / args.jobs) / (base / args.baseline_jobs)
        print(f"per-job time, {args.jobs} vs {args.baseline_jobs} jobs: {ratio:.2f}x")
        print(
            f"{args.jobs} jobs: {cluster['events']} events, utilization "
            f"{cluster['utilization']:.1%}, makespan {cluster['makespan'] / 86400:.1f} days"
        )
        verdict = "meets" if big + big_load <= 60 else "MISSES"
        print(f"goal: {args.jobs} jobs in <= 60 s (load + simulate): {verdict}")


if __name__ == "__main__":
    main()
