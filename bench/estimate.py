"""What one refresh of the estimated starts costs, and how far ahead it sees, at the size issue 21
names: 1,000 nodes of 8 GPUs (two types), 5,000 placed and 20,000 runnable jobs (the clusters
of bench/engine.py), with expected run times drawn per job (log-normal, median 30 min, a minute
to two days; a placed job has a uniform part of its time left).

Two figures per seed, the median of `--runs` runs:

- with the worker's time budget (ESTIMATE_BUDGET_SECONDS, `--budget`, 2 s): how long the
  refresh took, how far ahead the replay got (simulated minutes) and how many of the waiting
  jobs it gave a start;
- with no budget, replaying a fixed `--horizon` (simulated seconds): how long that takes, as a
  ratio to one plan() of the same cluster (the cycle's own engine time, measured in the same
  run): how many cycles' worth of engine time a minute of the queue's future costs.

    python bench/estimate.py [--seeds 3] [--runs 3] [--budget 2] [--horizon 60]
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.engine import synthetic_snapshot  # noqa: E402
from scheduler.engine import plan  # noqa: E402
from scheduler.engine.planner import latest_time  # noqa: E402
from scheduler.simulator.estimate import estimate_starts  # noqa: E402

MEDIAN_SECONDS = 1800
SIGMA = 1.2
WEEK = 7 * 86400.0


def expected_times(snapshot, seed: int) -> tuple[dict[str, float], dict[str, float]]:
    """Each job's expected run time, and each placed job's time left (a uniform part of it)."""
    rng = random.Random(seed)

    def draw() -> float:
        return min(2 * 86400, max(60.0, rng.lognormvariate(math.log(MEDIAN_SECONDS), SIGMA)))

    expected = {job.id: draw() for job in snapshot.runnable}
    remaining = {}
    for job in snapshot.placed:
        expected[job.id] = draw()
        remaining[job.id] = expected[job.id] * rng.random()
    return expected, remaining


def timed(call) -> tuple[float, object]:
    started = time.perf_counter()
    result = call()
    return time.perf_counter() - started, result


def measure(snapshot, expected, remaining, args) -> tuple[float, tuple, float]:
    """One run: a plan(), a refresh within the budget, a replay of the fixed horizon."""
    one_plan, _ = timed(lambda: plan(snapshot))
    budgeted = timed(
        lambda: estimate_starts(
            snapshot, expected=expected, remaining=remaining, horizon=WEEK, budget=args.budget
        )
    )
    fixed, _ = timed(
        lambda: estimate_starts(
            snapshot, expected=expected, remaining=remaining, horizon=args.horizon
        )
    )
    return one_plan, budgeted, fixed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--budget", type=float, default=2.0, help="seconds of the worker's time")
    parser.add_argument("--horizon", type=float, default=60.0, help="simulated seconds")
    args = parser.parse_args()
    print("estimate refresh, 1,000 nodes × 8 GPUs, 5,000 placed, 20,000 runnable; "
          f"median of {args.runs} runs")  # fmt: skip
    print(f"{'seed':>4} | {'budget':>6} {'took s':>7} {'ahead min':>9} {'estimated':>11} | "
          f"{'horizon s':>9} {'took s':>7} {'plan() s':>8} {'× plan':>7}")  # fmt: skip
    aheads, ratios = [], []
    for seed in range(1, args.seeds + 1):
        snapshot = synthetic_snapshot(1.0, seed)
        snapshot = replace(snapshot, now=latest_time(snapshot))
        expected, remaining = expected_times(snapshot, seed)
        budgeted, fixed, plans = [], [], []
        for _ in range(args.runs):
            one_plan, budgeted_run, fixed_run = measure(snapshot, expected, remaining, args)
            plans.append(one_plan)
            budgeted.append(budgeted_run)
            fixed.append(fixed_run)
        took = statistics.median(seconds for seconds, _ in budgeted)
        ahead = statistics.median(result.replayed for _, result in budgeted) / 60
        estimated = statistics.median(len(result.starts) for _, result in budgeted)
        one_plan, horizon_took = statistics.median(plans), statistics.median(fixed)
        aheads.append(ahead)
        ratios.append(horizon_took / one_plan)
        print(f"{seed:>4} | {args.budget:>6g} {took:>7.2f} {ahead:>9.1f} "
              f"{estimated:>5.0f}/{len(snapshot.runnable):<5} | {args.horizon:>9g} "
              f"{horizon_took:>7.2f} {one_plan:>8.3f} {horizon_took / one_plan:>7.1f}")  # fmt: skip
    print(f"\nwithin {args.budget:g} s a refresh sees {statistics.median(aheads):.1f} simulated "
          f"minutes ahead (median over seeds); {args.horizon:g} s of the queue's future cost "
          f"{statistics.median(ratios):.1f} × one plan()")  # fmt: skip


if __name__ == "__main__":
    main()
