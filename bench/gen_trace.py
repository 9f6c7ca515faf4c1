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
    return _numbered(rows)


def _numbered(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """The rows sorted by submission time (then share), their ids j0, j1, ... in that order."""
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


# Skewed teams (`generate_skewed`): what each asks for, as a multiple of its quota over the
# trace, drawn per trace from these ranges. One team is mostly idle, one always over its quota,
# the others in between; every team works in bursts with quiet spells between them.
SKEWED_PROFILES = (
    ("mostly idle", 0.1, 0.35),
    ("over its quota", 1.6, 2.6),
    ("near its quota", 0.9, 1.2),
    ("near its quota", 0.8, 1.1),
    ("moderate", 0.5, 0.9),
)


def skewed_quotas(teams: int, seed: int, cluster_gpus: int) -> list[int]:
    """Each team's h100 quota, whole nodes, together 90 % of the cluster, unevenly split."""
    rng = random.Random(f"quotas {seed}")
    weights = [rng.uniform(0.6, 1.6) for _ in range(teams)]
    nodes = int(cluster_gpus * 0.9) // GPUS_PER_NODE
    quotas = [max(1, int(nodes * w / sum(weights))) * GPUS_PER_NODE for w in weights]
    return quotas


def generate_skewed(
    jobs: int, teams: int, seed: int, *, cluster_gpus: int = 256, horizon: float = 7 * 86400
) -> list[dict[str, object]]:
    """`jobs` trace rows of `teams` teams on one GPU type (h100) over `horizon` seconds: each
    team asks for a multiple of its quota (`skewed_quotas`) drawn from its profile
    (SKEWED_PROFILES, in turn), in bursts of jobs of every size (gangs of 2 and 4 nodes
    included), sorted by submission time."""
    rng = random.Random(f"skewed {seed}")
    names = team_names(teams)
    quotas = skewed_quotas(teams, seed, cluster_gpus)
    factors = [
        rng.uniform(low, high)
        for _, low, high in (SKEWED_PROFILES[i % len(SKEWED_PROFILES)] for i in range(teams))
    ]
    asked = [quota * factor * horizon for quota, factor in zip(quotas, factors, strict=True)]
    rows: list[dict[str, object]] = []
    per_team = [max(1, round(jobs * a / sum(asked))) for a in asked]
    for team, count in enumerate(per_team):
        shapes = []
        for _ in range(count):
            # No larger than the team's quota: under RESERVE a larger job could never run.
            gpus = min(rng.choices(SIZES, weights=SIZE_WEIGHTS)[0], quotas[team])
            median = MEDIAN_DURATION * (1 + math.log2(gpus) / 4)
            duration = rng.lognormvariate(math.log(median), DURATION_SIGMA)
            shapes.append((gpus, int(min(MAX_DURATION / 5, max(MIN_DURATION, duration)))))
        # Scale the durations so the team asks for what its profile says.
        scale = asked[team] / sum(g * d for g, d in shapes)
        shapes = [(g, max(MIN_DURATION, int(d * scale))) for g, d in shapes]
        # Bursts: a few busy spells (a deadline, a sweep), quiet in between.
        spells = [rng.uniform(0, horizon * 0.9) for _ in range(rng.randint(3, 8))]
        i = 0
        while i < len(shapes):
            size = 1 + int(rng.expovariate(1 / (MEAN_BURST - 1)))
            t = rng.choice(spells) + rng.expovariate(1 / (horizon / 40))
            for gpus, duration in shapes[i : i + size]:
                rows.append(_row(rng, names[team], "h100", gpus, int(min(t, horizon)), duration))
                t += rng.expovariate(1 / 30)
            i += size
    return _numbered(rows)


def skewed_scenario(
    trace: str | Path,
    teams: int,
    *,
    seed: int,
    cluster_gpus: int = 256,
    strategy: str,
    grace_seconds: int = 120,
) -> dict[str, object]:
    """A scenario (as read from YAML) for a trace of `generate_skewed(..., teams, seed,
    cluster_gpus)`: h100 nodes of 8 GPUs, one share per team with its quota, every share of
    `strategy`."""
    names = team_names(teams)
    quotas = skewed_quotas(teams, seed, cluster_gpus)
    return {
        "nodes": [
            {"name": "h100", "gpu_type": "h100", "gpus": GPUS_PER_NODE,
             "count": cluster_gpus // GPUS_PER_NODE}
        ],
        "shares": [
            {"name": name, "capacity_limits": {"h100": quota}, "strategy": strategy,
             "grace_seconds": grace_seconds}
            for name, quota in zip(names, quotas, strict=True)
        ],
        "trace": str(trace),
    }  # fmt: skip


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
