"""Generate a synthetic job trace (CSV) for the simulator.

Teams submit in bursts (a pipeline or a sweep drops many jobs within minutes, then nothing for a
while); job sizes follow what GPU clusters see (mostly 1-8 GPUs, a few 16- and 32-GPU multi-node
jobs with 8 GPUs per node); durations are log-normal, from a minute to days. Some teams are busier
than others; the cluster is split between GPU types in proportion to what their teams ask for, as
it would be bought, and `synthetic_scenario` sizes each team's quota to 90 % of its part of the
cluster, as an admin would. Arrivals are spread so that the busiest team asks for `--load` of its
part of a cluster of `--cluster-gpus` GPUs, and the others for less: a trace that asks for more
than the cluster (or a team that may not borrow, more than its quota) only grows its queue.

    python bench/gen_trace.py --jobs 10000 --teams 6 --seed 1 --out trace.csv
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler.simulator.scenario import OPTIONAL_TRACE_COLUMNS, TRACE_COLUMNS  # noqa: E402

COLUMNS = TRACE_COLUMNS + OPTIONAL_TRACE_COLUMNS
TEAM_NAMES = ("research", "vision", "speech", "nlp", "robotics", "recsys", "infra", "search")
SIZES = (1, 2, 4, 8, 16, 32)
SIZE_WEIGHTS = (34, 15, 20, 21, 7, 3)
PRIORITIES = (0, 100, 500, 1000)
PRIORITY_WEIGHTS = (60, 25, 10, 5)
GPUS_PER_NODE = 8
MIN_DURATION = 60
MAX_DURATION = 5 * 24 * 3600
MEDIAN_DURATION = 30 * 60
DURATION_SIGMA = 1.5
MEAN_BURST = 12  # jobs per burst, geometric


def team_names(teams: int) -> list[str]:
    """Share names for `teams` teams: the usual ones, then team-N."""
    return [TEAM_NAMES[i] if i < len(TEAM_NAMES) else f"team-{i}" for i in range(teams)]


def team_gpu_type(index: int) -> str:
    # Most teams train on h100; every third one lives on a100.
    return "a100" if index % 3 == 2 else "h100"


def type_gpus(cluster_gpus: int, teams: int) -> dict[str, int]:
    """GPUs of each type in the cluster: a third of the nodes are a100 when a team uses them."""
    nodes = cluster_gpus // GPUS_PER_NODE
    a100_nodes = max(1, nodes // 3) if any(team_gpu_type(i) == "a100" for i in range(teams)) else 0
    return {"h100": (nodes - a100_nodes) * GPUS_PER_NODE, "a100": a100_nodes * GPUS_PER_NODE}


def team_activity(teams: int, seed: int, cluster_gpus: int) -> list[float]:
    """Each team's part of all the work (summing to 1): some teams are busier than others, and
    the teams of one GPU type together ask for that type's part of the cluster."""
    rng = random.Random(f"activity {seed}")
    busy = [rng.uniform(0.5, 2.0) for _ in range(teams)]
    gpus = type_gpus(cluster_gpus, teams)
    total = sum(gpus.values())
    activity = []
    for i in range(teams):
        gpu_type = team_gpu_type(i)
        same_type = sum(busy[j] for j in range(teams) if team_gpu_type(j) == gpu_type)
        activity.append(busy[i] / same_type * gpus[gpu_type] / total)
    return activity


def generate(
    jobs: int, teams: int, seed: int, *, cluster_gpus: int = 1024, load: float = 0.85
) -> list[dict[str, object]]:
    """`jobs` trace rows (dicts of COLUMNS), sorted by submission time."""
    rng = random.Random(seed)
    names = team_names(teams)
    activity = team_activity(teams, seed, cluster_gpus)
    shapes = []
    for _ in range(jobs):
        team = rng.choices(range(teams), weights=activity)[0]
        gpus = rng.choices(SIZES, weights=SIZE_WEIGHTS)[0]
        # Bigger jobs tend to run longer.
        median = MEDIAN_DURATION * (1 + math.log2(gpus) / 4)
        duration = rng.lognormvariate(math.log(median), DURATION_SIGMA)
        duration = int(min(MAX_DURATION, max(MIN_DURATION, duration)))
        shapes.append((team, gpus, duration))

    # Spread the bursts over the horizon that makes the busiest team ask for `load` of its part
    # of the cluster (what its quota is sized on), and the others for less.
    demand = [0] * teams
    for team, gpus, duration in shapes:
        demand[team] += gpus * duration
    cluster = sum(type_gpus(cluster_gpus, teams).values())
    horizon = max(
        asked / (part * cluster * load) for asked, part in zip(demand, activity, strict=True)
    )
    team_jobs: list[list[tuple[int, int, int]]] = [[] for _ in names]
    for shape in shapes:
        team_jobs[shape[0]].append(shape)
    rows: list[dict[str, object]] = []
    for team, own in enumerate(team_jobs):
        i = 0
        while i < len(own):
            # A burst: a sweep or a pipeline run, jobs seconds to minutes apart.
            size = 1 + int(rng.expovariate(1 / (MEAN_BURST - 1)))
            t = rng.uniform(0, horizon)
            for _, gpus, duration in own[i : i + size]:
                rows.append(_row(rng, names[team], team_gpu_type(team), gpus, int(t), duration))
                t += rng.expovariate(1 / 30)
            i += size
    rows.sort(key=lambda r: (r["submit"], r["share"]))
    for number, row in enumerate(rows):
        row["id"] = f"j{number}"
    return rows


def _row(
    rng: random.Random, share: str, gpu_type: str, gpus: int, submit: int, duration: int
) -> dict[str, object]:
    nodes = gpus // GPUS_PER_NODE if gpus > GPUS_PER_NODE else 1
    checkpointed = rng.random() < 0.7
    return {
        "id": "",
        "share": share,
        "gpu_type": gpu_type,
        "gpus": gpus,
        "submit": submit,
        "duration": duration,
        "priority": rng.choices(PRIORITIES, weights=PRIORITY_WEIGHTS)[0],
        "nodes": nodes,
        "max_preemptions": 3 if rng.random() < 0.1 else "",
        "checkpoint_interval": 1800 if checkpointed else "",
    }


def write_csv(rows: list[dict[str, object]], path: str | Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def synthetic_scenario(
    trace: str | Path,
    teams: int,
    *,
    seed: int,
    cluster_gpus: int = 1024,
    strategy: str | None = None,
    grace_seconds: int = 120,
) -> dict[str, object]:
    """A scenario (as read from YAML) for a trace of `generate(..., teams, seed, cluster_gpus)`:
    h100 and a100 nodes of 8 GPUs, one share per team. Each type's limits cover 90 % of it (the
    rest is a free pool), split among its teams in proportion to how busy they are; with
    `strategy` unset the shares mix LEND_AND_BORROW, LEND and RESERVE as a real cluster would.
    Every third team preempts in its share: two of the lending and borrowing ones in the mix
    (in a share that may not borrow, its high-priority jobs would keep restarting the others
    from their last checkpoint, or from scratch, and the work lost would outgrow its quota)."""
    names = team_names(teams)
    capacity = type_gpus(cluster_gpus, teams)
    total = sum(capacity.values())
    activity = team_activity(teams, seed, cluster_gpus)
    nodes = [
        {
            "name": gpu_type,
            "gpu_type": gpu_type,
            "gpus": GPUS_PER_NODE,
            "count": gpus // GPUS_PER_NODE,
        }
        for gpu_type, gpus in capacity.items()
        if gpus
    ]
    mix = ("LEND_AND_BORROW", "LEND_AND_BORROW", "LEND", "LEND_AND_BORROW", "RESERVE")
    shares = []
    for i in range(teams):
        gpu_type = team_gpu_type(i)
        # activity[i] is the team's part of the whole cluster's work.
        limit = max(GPUS_PER_NODE, int(total * activity[i] * 0.9))
        shares.append(
            {
                "name": names[i],
                "capacity_limits": {gpu_type: min(limit, capacity[gpu_type])},
                "strategy": strategy or mix[i % len(mix)],
                "grace_seconds": grace_seconds,
                "in_share_preemption": i % 3 == 0,
            }
        )
    return {"nodes": nodes, "shares": shares, "trace": str(trace)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--teams", type=int, default=6)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cluster-gpus", type=int, default=1024, help="sizes the arrival rate")
    parser.add_argument("--load", type=float, default=0.85, help="demand as a share of the cluster")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    rows = generate(
        args.jobs, args.teams, args.seed, cluster_gpus=args.cluster_gpus, load=args.load
    )
    write_csv(rows, args.out)
    print(f"{len(rows)} jobs of {args.teams} teams written to {args.out}")


if __name__ == "__main__":
    main()
