"""Several traces, three ways to share the cluster: what does lending buy?

Replays synthetic traces (bench/gen_trace.py, one per seed) with every share RESERVE (no lending:
each team has only its quota), every share LEND_AND_BORROW (idle quota lent and reclaimed), and
one single share holding the whole cluster (work-conserving: the bound lending can approach).

Two utilizations, per seed and as the median over seeds:

- over the makespan (DESIGN §4: GPU-hours held ÷ all GPUs × makespan). One trace's makespan is
  set by its last few long jobs (a 32-GPU gang job starved behind smaller ones, a 100-hour job
  restarted by a preemption), so one seed alone says little about a sharing strategy: the median
  over several traces does;
- while work waits: on each GPU type, the GPUs held during the periods when a job of that type
  is waiting, ÷ that type's GPUs over those periods. This is what lending is for (no GPU idle
  while someone waits for one) and a single tail job, running alone after the queue has emptied,
  does not weigh on it.

Both count the GPU-hours held, so the work a preemption throws away (a grace period, work done
again from the last checkpoint) counts as used: the bound preempts nothing, so LEND_AND_BORROW
may exceed it. Each replay also prints that part, and p50/p95 wait per share (medians over
seeds, jobs counted over all of them). Last, LEND_AND_BORROW's utilizations as ratios of the
bound's: the median of the per-seed ratios. Sized to run in a couple of minutes.

    python bench/strategies.py [--jobs 1500] [--cluster-gpus 256] [--seeds 15]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from gen_trace import generate, synthetic_scenario, team_gpu_type, write_csv  # noqa: E402

from scheduler.simulator import parse_scenario, simulate  # noqa: E402
from scheduler.simulator.clock import percentile  # noqa: E402

TEAMS = 4
SEEDS = 15  # traces replayed: seeds 1 .. SEEDS
LOAD = 1.0  # demand about equal to the cluster, so how it is shared matters
REPLAYS = ("RESERVE", "LEND_AND_BORROW", "bound")
TITLES = {
    "RESERVE": "every share RESERVE",
    "LEND_AND_BORROW": "every share LEND_AND_BORROW",
    "bound": "one share holding the whole cluster (work-conserving bound)",
}


@dataclass
class Replay:
    utilization: float
    while_waiting: float
    makespan: float
    lost: float  # part of the GPU-hours held that no finished job's work accounts for
    waits: dict[str, list[float]]  # by team


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


def utilization_while_waiting(data: dict, result: dict, trace_rows: Sequence[dict]) -> float:
    """GPUs held on each GPU type while a job of that type waits (RUNNABLE), ÷ that type's GPUs
    over those periods, all types together; from the scenario `data` (no share changes) and its
    result JSON. A preempted job holds its GPUs for its share's grace period, then waits again
    (or fails)."""
    spec = {row["id"]: row for row in trace_rows}
    grace = {share["name"]: share.get("grace_seconds", 120) for share in data["shares"]}
    # The job's share in this replay (the bound's trace puts every job in one share).
    share_of = {job["id"]: job["share"] for job in result["jobs"]}
    gpus_of_type: dict[str, int] = {}
    for node in data["nodes"]:
        gpus = node["gpus"] * node.get("count", 1)
        gpus_of_type[node["gpu_type"]] = gpus_of_type.get(node["gpu_type"], 0) + gpus
    # (t, job, change of GPUs held, change of jobs waiting)
    changes: list[tuple[float, str, int, int]] = [
        (row["submit"], row["id"], 0, 1) for row in spec.values()
    ]
    for event in result["events"]:
        t, job, kind = event["t"], event["job"], event["type"]
        gpus = int(spec[job]["gpus"])
        if kind == "start":
            changes.append((t, job, gpus, -1))
        elif kind == "finish":
            changes.append((t, job, -gpus, 0))
        elif kind == "preempt":
            changes.append((t + grace[share_of[job]], job, -gpus, 1))
        else:  # fail (at the end of a grace period) or reject: it waits no more
            changes.append((t, job, 0, -1))
    changes.sort(key=lambda change: change[0])
    held = dict.fromkeys(gpus_of_type, 0)
    waiting = dict.fromkeys(gpus_of_type, 0)
    held_seconds = 0.0
    capacity_seconds = 0.0
    held_ever = 0.0  # GPU-seconds held over the whole run: checked against the simulator's
    last = changes[0][0]
    for t, job, gpus, waits in changes:
        if t > last:
            for gpu_type, count in waiting.items():
                held_ever += held[gpu_type] * (t - last)
                if count:
                    held_seconds += held[gpu_type] * (t - last)
                    capacity_seconds += gpus_of_type[gpu_type] * (t - last)
            last = t
        gpu_type = spec[job]["gpu_type"]
        held[gpu_type] += gpus
        waiting[gpu_type] += waits
    used = result["cluster"]["gpu_hours_used"]
    if abs(held_ever / 3600 - used) > 1e-3 * max(1.0, used):
        raise RuntimeError(f"GPU-hours held read from the events: {held_ever / 3600}, not {used}")
    return held_seconds / capacity_seconds if capacity_seconds else 1.0


def replay(data: dict, trace_rows: list[dict]) -> Replay:
    result = simulate(parse_scenario(data)).data
    spec = {row["id"]: row for row in trace_rows}
    waits: dict[str, list[float]] = {}
    work = 0.0
    for job in result["jobs"]:
        if job["wait_seconds"] is not None:
            waits.setdefault(spec[job["id"]]["share"], []).append(job["wait_seconds"])
        if job["state"] == "SUCCEEDED":
            work += spec[job["id"]]["gpus"] * spec[job["id"]]["duration"] / 3600
    cluster = result["cluster"]
    return Replay(
        cluster["utilization"],
        utilization_while_waiting(data, result, trace_rows),
        cluster["makespan"],
        1 - work / cluster["gpu_hours_used"],
        waits,
    )


def replay_seed(seed: int, jobs: int, cluster_gpus: int, tmp: Path) -> dict[str, Replay]:
    rows = generate(jobs, TEAMS, seed, cluster_gpus=cluster_gpus, load=LOAD)
    trace = tmp / f"trace-{seed}.csv"
    write_csv(rows, trace)
    single = tmp / f"single-{seed}.csv"
    write_csv([row | {"share": "everyone"} for row in rows], single)
    base = dict(cluster_gpus=cluster_gpus, seed=seed)
    return {
        "RESERVE": replay(synthetic_scenario(trace, TEAMS, strategy="RESERVE", **base), rows),
        "LEND_AND_BORROW": replay(
            synthetic_scenario(trace, TEAMS, strategy="LEND_AND_BORROW", **base), rows
        ),
        "bound": replay(one_share(synthetic_scenario(trace, TEAMS, **base), single), rows),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1500)
    parser.add_argument("--cluster-gpus", type=int, default=256)
    parser.add_argument("--seeds", type=int, default=SEEDS, help="traces: seeds 1 .. SEEDS")
    args = parser.parse_args()
    seeds = range(1, args.seeds + 1)
    print(
        f"{args.jobs} jobs of {TEAMS} teams on {args.cluster_gpus} GPUs "
        f"(teams on a100: {[i for i in range(TEAMS) if team_gpu_type(i) == 'a100']}), "
        f"one trace per seed {seeds.start}..{seeds.stop - 1}"
    )
    print("\nutilization over the makespan | while work waits | makespan h  (L&B: LEND_AND_BORROW)")
    print(
        f"{'seed':>4} {'RESERVE':>8} {'L&B':>6} {'bound':>6} {'L&B/bd':>7} |"
        f" {'RESERVE':>8} {'L&B':>6} {'bound':>6} {'L&B/bd':>7} |"
        f" {'RESERVE':>8} {'L&B':>6} {'bound':>6}"
    )
    runs: list[dict[str, Replay]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            run = replay_seed(seed, args.jobs, args.cluster_gpus, Path(tmp))
            runs.append(run)
            over = [run[name].utilization for name in REPLAYS]
            waiting = [run[name].while_waiting for name in REPLAYS]
            hours = [run[name].makespan / 3600 for name in REPLAYS]
            print(
                f"{seed:>4} {over[0]:>8.1%} {over[1]:>6.1%} {over[2]:>6.1%} "
                f"{over[1] / over[2]:>7.2f} | {waiting[0]:>8.1%} {waiting[1]:>6.1%} "
                f"{waiting[2]:>6.1%} {waiting[1] / waiting[2]:>7.2f} |"
                f" {hours[0]:>8.0f} {hours[1]:>6.0f} {hours[2]:>6.0f}"
            )

    for name in REPLAYS:
        print(
            f"\n{TITLES[name]}: utilization {median([r[name].utilization for r in runs]):.1%}"
            f" over the makespan, {median([r[name].while_waiting for r in runs]):.1%} while work"
            f" waits; {median([r[name].lost for r in runs]):.1%} of the GPU-hours held lost to"
            " preemption (grace periods, work done again, failed jobs); medians over seeds"
        )
        print(f"  {'team':<10} {'jobs':>6} {'p50 wait h':>11} {'p95 wait h':>11}")
        for team in sorted(runs[0][name].waits):
            per_seed = [sorted(run[name].waits.get(team, [0.0])) for run in runs]
            print(
                f"  {team:<10} {sum(len(w) for w in per_seed):>6}"
                f" {median([percentile(w, 50) for w in per_seed]) / 3600:>11.2f}"
                f" {median([percentile(w, 95) for w in per_seed]) / 3600:>11.2f}"
            )

    def ratios(field: str) -> list[float]:
        return sorted(
            getattr(r["LEND_AND_BORROW"], field) / getattr(r["bound"], field) for r in runs
        )

    for label, field in (
        ("over the makespan", "utilization"),
        ("while work waits", "while_waiting"),
    ):
        values = ratios(field)
        print(
            f"\nLEND_AND_BORROW utilization / bound, {label}: median {median(values):.2f}"
            f" over {len(values)} seeds (from {values[0]:.2f} to {values[-1]:.2f})"
        )


if __name__ == "__main__":
    main()
