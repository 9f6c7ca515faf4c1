"""Several traces, three ways to share the cluster: what does lending buy, and what does it cost
the lenders?

Replays generated traces (bench/gen_trace.py, one per seed) with every share RESERVE (no lending:
each team has only its quota), every share LEND_AND_BORROW (idle quota lent and reclaimed), and
one single share holding the whole cluster (work-conserving: the bound lending can approach).
The default traces (`--traces skewed`) are bursty and skewed: five teams on 256 h100 with uneven
quotas, one mostly idle, one always over its quota, the others near it or below, jobs of every
size (gangs of 2 and 4 nodes included). `--traces proportional` replays the earlier family
instead (four teams on two GPU types, quotas in proportion to demand).

Figures, per seed and as the median over seeds:

- utilization over the makespan (DESIGN §4: GPU-hours held ÷ all GPUs × makespan), and while
  work waits (on each GPU type, the GPUs held while a job of that type waits, ÷ that type's
  GPUs over those periods: what lending is for, and a tail job running alone after the queue
  has emptied does not weigh on it); LEND_AND_BORROW's as ratios of the bound's;
- the GPU-hours a preemption throws away (grace periods, work done again from the last
  checkpoint, failed jobs), as a part of the GPU-hours held; LEND_AND_BORROW's split into
  grace periods, checkpointed jobs' work done again and jobs without checkpoints started over,
  with the preemptions that threw away the most;
- lenders worse off: for every (trace, share), the share's p95 and mean wait under
  LEND_AND_BORROW against RESERVE; and, to tell what lending itself costs a team from what its
  own borrowing changes, the same with that share alone LEND (it lends, never borrows) and the
  others LEND_AND_BORROW. Each pair that waits longer is counted, with by how much.

    python bench/strategies.py [--jobs 1500] [--cluster-gpus 256] [--seeds 15] [--traces skewed]
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

from gen_trace import (  # noqa: E402
    generate,
    generate_skewed,
    skewed_scenario,
    synthetic_scenario,
    team_gpu_type,
    write_csv,
)

from scheduler.simulator import parse_scenario, simulate  # noqa: E402
from scheduler.simulator.clock import percentile  # noqa: E402

TEAMS = 4  # of the proportional traces
SKEWED_TEAMS = 5
SEEDS = 15  # traces replayed: seeds 1 .. SEEDS
LOAD = 1.0  # demand about equal to the cluster, so how it is shared matters
REPLAYS = ("RESERVE", "LEND_AND_BORROW", "bound")
GRACE_SECONDS = 120  # every share's, in both trace families
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
    losses: list[Loss]  # what each preemption threw away
    held: float  # GPU-hours held


@dataclass
class Loss:
    """What one preemption threw away, in GPU-seconds: the victim's grace period, and the work
    it does again (since its last checkpoint, or all of its run without checkpoints)."""

    grace: float
    again: float
    checkpoints: bool  # whether the job saves checkpoints
    gpus: int
    ran: float  # seconds of the run it ended


def graces(data: dict, result: dict) -> dict[str, float]:
    """Each job's grace period: its share's in this replay (the bound's trace puts every job
    in one share)."""
    grace = {share["name"]: share.get("grace_seconds", 120) for share in data["shares"]}
    return {job["id"]: grace[job["share"]] for job in result["jobs"]}


def losses(data: dict, result: dict, trace_rows: Sequence[dict]) -> list[Loss]:
    """Each preemption's loss, from the events, as the simulator counts it: a job resumes from
    its last checkpoint (every `checkpoint_interval` seconds of its work: its runs start on one)
    or from scratch; its grace period holds its GPUs without progress."""
    spec = {row["id"]: row for row in trace_rows}
    grace = graces(data, result)
    started: dict[str, float] = {}
    found = []
    for event in result["events"]:
        job, kind = event["job"], event["type"]
        if kind == "start":
            started[job] = event["t"]
        elif kind == "preempt":
            gpus = int(spec[job]["gpus"])
            ran = event["t"] - started[job]
            interval = float(spec[job].get("checkpoint_interval") or 0)
            again = ran % interval if interval else ran
            found.append(Loss(gpus * grace[job], gpus * again, bool(interval), gpus, ran))
    return found


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
    grace = graces(data, result)
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
            changes.append((t + grace[job], job, -gpus, 1))
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
        losses(data, result, trace_rows),
        cluster["gpu_hours_used"],
    )


def replay_seed(
    seed: int, jobs: int, cluster_gpus: int, tmp: Path, traces: str
) -> dict[str, Replay]:
    """The seed's replays: RESERVE, LEND_AND_BORROW, the bound, and ("lend:<share>") each share
    alone LEND with the others LEND_AND_BORROW."""
    if traces == "skewed":
        rows = generate_skewed(jobs, SKEWED_TEAMS, seed, cluster_gpus=cluster_gpus)

        def scenario(trace: Path, strategy: str) -> dict:
            return skewed_scenario(
                trace, SKEWED_TEAMS, seed=seed, cluster_gpus=cluster_gpus, strategy=strategy
            )
    else:
        rows = generate(jobs, TEAMS, seed, cluster_gpus=cluster_gpus, load=LOAD)

        def scenario(trace: Path, strategy: str) -> dict:
            return synthetic_scenario(
                trace, TEAMS, cluster_gpus=cluster_gpus, seed=seed, strategy=strategy
            )

    trace = tmp / f"trace-{seed}.csv"
    write_csv(rows, trace)
    single = tmp / f"single-{seed}.csv"
    write_csv([row | {"share": "everyone"} for row in rows], single)
    lend_and_borrow = scenario(trace, "LEND_AND_BORROW")
    runs = {
        "RESERVE": replay(scenario(trace, "RESERVE"), rows),
        "LEND_AND_BORROW": replay(lend_and_borrow, rows),
        "bound": replay(one_share(lend_and_borrow, single), rows),
    }
    for index, share in enumerate(lend_and_borrow["shares"]):
        shares = [dict(other) for other in lend_and_borrow["shares"]]
        shares[index]["strategy"] = "LEND"
        runs[f"lend:{share['name']}"] = replay(lend_and_borrow | {"shares": shares}, rows)
    return runs


def print_losses(runs: list[dict[str, Replay]], seeds: range) -> None:
    """What LEND_AND_BORROW's loss is made of, as parts of the GPU-hours held (medians over
    seeds), and the preemptions that threw away the most."""
    parts: dict[str, list[float]] = {"grace": [], "checkpointed": [], "from scratch": []}
    counts = {"checkpointed": 0, "from scratch": 0}
    largest: list[tuple[float, int, Loss]] = []
    for seed, run in zip(seeds, runs, strict=True):
        replay = run["LEND_AND_BORROW"]
        held = 3600 * replay.held
        parts["grace"].append(sum(loss.grace for loss in replay.losses) / held)
        for name, checkpoints in (("checkpointed", True), ("from scratch", False)):
            chosen = [loss for loss in replay.losses if loss.checkpoints == checkpoints]
            parts[name].append(sum(loss.again for loss in chosen) / held)
            counts[name] += len(chosen)
        largest += [(loss.again, seed, loss) for loss in replay.losses]
    print(
        f"  of which, medians over seeds: grace periods {median(parts['grace']):.3%}; work done"
        f" again since the last checkpoint {median(parts['checkpointed']):.3%} (from"
        f" {min(parts['checkpointed']):.3%} to {max(parts['checkpointed']):.3%}; "
        f"{counts['checkpointed']} preemptions); jobs without checkpoints started over"
        f" {median(parts['from scratch']):.3%} (from {min(parts['from scratch']):.3%} to"
        f" {max(parts['from scratch']):.3%}; {counts['from scratch']} preemptions)"
    )
    largest.sort(key=lambda entry: -entry[0])
    print(
        "  the preemptions that threw away the most work: "
        + ", ".join(
            f"seed {seed} {loss.gpus} GPUs after {loss.ran / 3600:.1f} h"
            f"{'' if loss.checkpoints else ' without checkpoints'} ({again / 3600:.0f} GPU-h)"
            for again, seed, loss in largest[:5]
        )
    )


@dataclass
class WorseOff:
    seed: int
    share: str
    p95: float  # seconds longer than under RESERVE (negative: shorter)
    mean: float


def worse_off(runs: list[dict[str, Replay]], seeds: range, lender_view: bool) -> list[WorseOff]:
    """Every (trace, share) with its p95 and mean wait against RESERVE's: under LEND_AND_BORROW,
    or (`lender_view`) with that share alone LEND."""
    pairs = []
    for seed, run in zip(seeds, runs, strict=True):
        for share, reserve in sorted(run["RESERVE"].waits.items()):
            other = run[f"lend:{share}" if lender_view else "LEND_AND_BORROW"].waits[share]
            reserve, other = sorted(reserve), sorted(other)
            pairs.append(
                WorseOff(
                    seed,
                    share,
                    percentile(other, 95) - percentile(reserve, 95),
                    sum(other) / len(other) - sum(reserve) / len(reserve),
                )
            )
    return pairs


def print_worse_off(pairs: list[WorseOff], title: str, grace: float) -> None:
    worse = [pair for pair in pairs if pair.p95 > 0 or pair.mean > 0]
    by_p95 = sorted((pair for pair in worse if pair.p95 > 0), key=lambda pair: -pair.p95)
    by_mean = sorted((pair for pair in worse if pair.mean > 0), key=lambda pair: -pair.mean)
    print(f"\n{title}: {len(worse)} of {len(pairs)} (trace, share) pairs made worse off")
    for label, chosen, value in (("p95", by_p95, "p95"), ("mean", by_mean, "mean")):
        if not chosen:
            print(f"  {label} wait: none longer")
            continue
        excess = sorted(getattr(pair, value) for pair in chosen)
        within = sum(1 for seconds in excess if seconds <= grace)
        print(
            f"  {label} wait longer in {len(chosen)}: by {median(excess):.0f} s median, "
            f"{excess[-1] / 3600:.2f} h at most; {within} of them by at most one grace period "
            f"({grace:.0f} s)"
        )
        worst = ", ".join(
            f"seed {pair.seed} {pair.share} +{getattr(pair, value) / 3600:.2f} h"
            for pair in chosen[:5]
        )
        print(f"    the worst: {worst}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1500)
    parser.add_argument("--cluster-gpus", type=int, default=256)
    parser.add_argument("--seeds", type=int, default=SEEDS, help="traces: seeds 1 .. SEEDS")
    parser.add_argument("--traces", choices=("skewed", "proportional"), default="skewed")
    args = parser.parse_args()
    seeds = range(1, args.seeds + 1)
    if args.traces == "skewed":
        print(
            f"{args.jobs} jobs of {SKEWED_TEAMS} bursty, skewed teams on {args.cluster_gpus} "
            f"h100, one trace per seed {seeds.start}..{seeds.stop - 1}"
        )
    else:
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
            run = replay_seed(seed, args.jobs, args.cluster_gpus, Path(tmp), args.traces)
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
            f" waits; {median([r[name].lost for r in runs]):.2%} of the GPU-hours held lost to"
            " preemption (grace periods, work done again, failed jobs); medians over seeds"
        )
        print(
            f"  {'team':<10} {'jobs':>6} {'p50 wait h':>11} {'p95 wait h':>11} {'mean wait h':>12}"
        )
        for team in sorted(runs[0][name].waits):
            per_seed = [sorted(run[name].waits.get(team, [0.0])) for run in runs]
            print(
                f"  {team:<10} {sum(len(w) for w in per_seed):>6}"
                f" {median([percentile(w, 50) for w in per_seed]) / 3600:>11.2f}"
                f" {median([percentile(w, 95) for w in per_seed]) / 3600:>11.2f}"
                f" {median([sum(w) / len(w) for w in per_seed]) / 3600:>12.2f}"
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
            f"\nLEND_AND_BORROW utilization / bound, {label}: median {median(values):.3f}"
            f" over {len(values)} seeds (from {values[0]:.3f} to {values[-1]:.3f})"
        )
    lost = sorted(r["LEND_AND_BORROW"].lost for r in runs)
    print(
        f"LEND_AND_BORROW GPU-hours lost to preemption: median {median(lost):.3%} of those held"
        f" (from {lost[0]:.3%} to {lost[-1]:.3%})"
    )
    print_losses(runs, seeds)
    grace = float(GRACE_SECONDS)
    print_worse_off(
        worse_off(runs, seeds, lender_view=False),
        "every share LEND_AND_BORROW against every share RESERVE",
        grace,
    )
    print_worse_off(
        worse_off(runs, seeds, lender_view=True),
        "the share alone LEND (it lends, never borrows), the others LEND_AND_BORROW, against "
        "every share RESERVE",
        grace,
    )


if __name__ == "__main__":
    main()
