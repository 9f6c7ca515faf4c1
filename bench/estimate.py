"""What one refresh of the estimated starts costs, and how far ahead it sees, at the size issue 21
names: 1,000 nodes of 8 GPUs (two types), 5,000 placed and 20,000 runnable jobs (the clusters
of bench/engine.py), with expected run times drawn per job (log-normal, median 30 min, a minute
to two days; a placed job has a uniform part of its time left).

Two figures per seed, the median of `--runs` runs:

- with the worker's time budget (ESTIMATE_BUDGET_SECONDS, `--budget`, 2 s): how long the
  refresh took, how far ahead the replay got (simulated minutes) and how many of the waiting
  jobs it gave a start; with the replay's resolution (`RESOLUTION` of
  scheduler/simulator/estimate.py, what the worker uses: the instants within that part of the
  time ahead share one cycle) and, as the baseline, exactly (a cycle at every instant, as
  before the resolution), with the ratio of how far each got;
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
from scheduler.simulator.estimate import RESOLUTION, estimate_starts  # noqa: E402

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


def measure(snapshot, expected, remaining, args) -> tuple[float, tuple, tuple, float]:
    """One run: a plan(), a refresh within the budget (exact, then at the resolution), a replay
    of the fixed horizon (at the resolution)."""
    one_plan, _ = timed(lambda: plan(snapshot))

    def refresh(resolution: float, horizon: float = WEEK, budget: float | None = args.budget):
        return estimate_starts(snapshot, expected=expected, remaining=remaining,
                               horizon=horizon, budget=budget, resolution=resolution)  # fmt: skip

    exact = timed(lambda: refresh(0.0))
    budgeted = timed(lambda: refresh(args.resolution))
    fixed, _ = timed(lambda: refresh(args.resolution, args.horizon, None))
    return one_plan, exact, budgeted, fixed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--budget", type=float, default=2.0, help="seconds of the worker's time")
    parser.add_argument("--horizon", type=float, default=60.0, help="simulated seconds")
    parser.add_argument("--resolution", type=float, default=RESOLUTION,
                        help="the replay's (default: the worker's)")  # fmt: skip
    args = parser.parse_args()
    print("estimate refresh, 1,000 nodes × 8 GPUs, 5,000 placed, 20,000 runnable; "
          f"median of {args.runs} runs; resolution {args.resolution:g} (exact: 0)")  # fmt: skip
    print(f"{'seed':>4} | {'budget':>6} {'exact: took s':>13} {'ahead min':>9} "
          f"{'estimated':>11} | {'took s':>6} {'ahead min':>9} {'estimated':>11} "
          f"{'× exact':>7} | {'horizon s':>9} {'took s':>7} {'plan() s':>8} "
          f"{'× plan':>7}")  # fmt: skip
    aheads, exact_aheads, ratios = [], [], []
    for seed in range(1, args.seeds + 1):
        snapshot = synthetic_snapshot(1.0, seed)
        snapshot = replace(snapshot, now=latest_time(snapshot))
        expected, remaining = expected_times(snapshot, seed)
        runs = [measure(snapshot, expected, remaining, args) for _ in range(args.runs)]
        one_plan = statistics.median(run[0] for run in runs)
        horizon_took = statistics.median(run[3] for run in runs)
        cells = []
        for refreshes in ([run[1] for run in runs], [run[2] for run in runs]):
            cells.append((
                statistics.median(seconds for seconds, _ in refreshes),
                statistics.median(result.replayed for _, result in refreshes) / 60,
                statistics.median(len(result.starts) for _, result in refreshes),
            ))  # fmt: skip
        (exact_took, exact_ahead, exact_estimated), (took, ahead, estimated) = cells
        aheads.append(ahead)
        exact_aheads.append(exact_ahead)
        ratios.append(horizon_took / one_plan)
        waiting = len(snapshot.runnable)
        print(f"{seed:>4} | {args.budget:>6g} {exact_took:>13.2f} {exact_ahead:>9.1f} "
              f"{exact_estimated:>5.0f}/{waiting:<5} | {took:>6.2f} {ahead:>9.1f} "
              f"{estimated:>5.0f}/{waiting:<5} {ahead / exact_ahead:>7.1f} | "
              f"{args.horizon:>9g} {horizon_took:>7.2f} {one_plan:>8.3f} "
              f"{horizon_took / one_plan:>7.1f}")  # fmt: skip
    ahead, exact_ahead = statistics.median(aheads), statistics.median(exact_aheads)
    print(f"\nwithin {args.budget:g} s a refresh sees {ahead:.1f} simulated minutes ahead at "
          f"resolution {args.resolution:g}, {exact_ahead:.1f} exactly ({ahead / exact_ahead:.1f}×; "
          f"medians over seeds); {args.horizon:g} s of the queue's future cost "
          f"{statistics.median(ratios):.1f} × one plan()")  # fmt: skip


if __name__ == "__main__":
    main()
