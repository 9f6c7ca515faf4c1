"""How long one `plan()` takes, and how that grows with the cluster.

Run: python bench/engine.py [--runs 3] [--seeds 20]

Builds synthetic clusters (base size: 1,000 nodes of 8 GPUs in two GPU types, 50 shares of mixed
strategies, 5,000 placed and 20,000 runnable jobs), then the same at 0.5x, 2x and 4x, each from
--seeds random seeds, and prints for each size the mean over the seeds of the median time of one
plan(), its ratio to the base size, and that ratio divided by the n·log n growth between the two
sizes (<= 1: no worse than n·log n).

Many clusters per size, not one: what a plan has to do is not only a matter of size. From one
seed to the next, the 4x cluster needs from about twice to six times the preemptions of its base
cluster (each seed's line shows it), and a plan's time follows its preemptions. A mean over a
handful of seeds is moved by which few were drawn, up or down, by more than the margin the growth
figure is judged on; twenty seeds by default make it a measure of the size, not of the draw. The
preemptions of all seeds together, and each seed's own growth, are printed after the table.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from operator import itemgetter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scheduler.engine import (  # noqa: E402
    Allocation,
    NodeView,
    PlacedJob,
    RunnableJob,
    ShareView,
    Snapshot,
    plan,
)
from scheduler.engine.snapshot import (  # noqa: E402
    DRAINING,
    FAIR,
    FIFO,
    LEND,
    LEND_AND_BORROW,
    RESERVE,
)

BASE_NODES = 1_000
BASE_SHARES = 50
BASE_PLACED = 5_000
BASE_RUNNABLE = 20_000
GPUS_PER_NODE = 8
GPU_TYPES = ("h100", "a100-80g")
SCALES = (0.5, 1.0, 2.0, 4.0)


def synthetic_snapshot(scale: float, seed: int, borrow_order: str = FIFO) -> Snapshot:
    """A busy cluster: most GPUs held, some shares over their limit, a long queue."""
    rng = random.Random(seed)
    node_count = int(BASE_NODES * scale)
    share_count = max(2, int(BASE_SHARES * scale))
    nodes = tuple(
        NodeView(
            f"node-{i}",
            GPU_TYPES[i % len(GPU_TYPES)],
            GPUS_PER_NODE,
            DRAINING if rng.random() < 0.01 else "READY",
        )
        for i in range(node_count)
    )
    capacity = {t: sum(n.gpus for n in nodes if n.gpu_type == t) for t in GPU_TYPES}

    # Limits cover about 90% of each type; the rest is the free pool.
    shares = []
    for i in range(share_count):
        strategy = rng.choice((RESERVE, LEND, LEND, LEND_AND_BORROW, LEND_AND_BORROW))
        limits = {t: max(1, int(capacity[t] * 0.9 / share_count)) for t in GPU_TYPES}
        shares.append(
            ShareView(
                name=f"share-{i}",
                capacity_limits=limits,
                strategy=strategy,
                borrow_limit=(
                    rng.choice((-1, 50, 100, 200)) if strategy == LEND_AND_BORROW else -1
                ),
                lend_limit=(
                    {t: limits[t] // 2 for t in GPU_TYPES}
                    if strategy != RESERVE and rng.random() < 0.2
                    else None
                ),
                in_share_preemption=rng.random() < 0.3,
                weight=rng.choice((1.0, 2.0, 4.0)),
                strict_fifo=rng.random() < 0.1,
            )
        )

    runnable_count = int(BASE_RUNNABLE * scale)
    drawn = []
    for number in range(runnable_count):
        share = rng.choice(shares)
        gpus, gang = rng.choice(((1, 1), (1, 1), (2, 1), (4, 1), (8, 1), (16, 2)))
        gpu_type = rng.choice(GPU_TYPES)
        priority = rng.choice((0, 0, 0, 10, 100))
        drawn.append((rng.randrange(100_000), number, share.name, gpu_type, gpus, gang, priority))
    # Issue #3 defines the snapshot's runnable jobs as in submission order, the order a live
    # queue's rows come back in. They are made in that order here, each with its own id and
    # submission time, as the cycle makes them from those rows (ties keep the order drawn, so
    # the plans are those of the jobs in drawn order).
    runnable = []
    drawn_order: list[RunnableJob] = [None] * runnable_count  # type: ignore[list-item]
    for submitted, number, share_name, gpu_type, gpus, gang, priority in sorted(
        drawn, key=itemgetter(0)
    ):
        job = RunnableJob(
            id=f"r{number}",
            share=share_name,
            gpu_type=gpu_type,
            gpus=gpus,
            nodes=gang,
            priority=priority,
            submitted=float(submitted),
        )
        runnable.append(job)
        drawn_order[number] = job

    placed = []
    free = {n.name: list(range(n.gpus)) for n in nodes}
    order = list(nodes)
    rng.shuffle(order)
    target = int(BASE_PLACED * scale)
    cursor = 0
    while len(placed) < target and cursor < len(order):
        node = order[cursor]
        left = free[node.name]
        if not left:
            cursor += 1
            continue
        gpus = min(len(left), rng.choice((1, 1, 1, 1, 1, 2, 2, 4)))
        indices, free[node.name] = tuple(left[:gpus]), left[gpus:]
        stopping = rng.random() < 0.02
        placed.append(
            PlacedJob(
                id=f"p{len(placed)}",
                share=rng.choice(shares).name,
                gpu_type=node.gpu_type,
                gpus=gpus,
                priority=rng.choice((0, 0, 10, 100)),
                submitted=float(rng.randrange(100_000)),
                started=float(rng.randrange(100_000)),
                allocations=(Allocation(node.name, indices),),
                stopping=stopping,
                preempted_for=(
                    rng.choice(drawn_order).id if stopping and rng.random() < 0.5 else None
                ),
            )
        )
    return Snapshot(nodes, tuple(shares), tuple(placed), tuple(runnable), borrow_order)


def median_plan_seconds(
    snapshots: dict[tuple[int, float], Snapshot], runs: int
) -> dict[tuple[int, float], float]:
    """The median time of one plan() of each snapshot. Runs go round the snapshots in turn, so a
    machine that is slower for a while slows every size alike and the ratios stay fair."""
    times: dict[tuple[int, float], list[float]] = {key: [] for key in snapshots}
    for _ in range(runs):
        for key, snapshot in snapshots.items():
            start = time.perf_counter()
            plan(snapshot)
            times[key].append(time.perf_counter() - start)
    return {key: statistics.median(seconds) for key, seconds in times.items()}


def nlogn_growth(snapshot: Snapshot, base: Snapshot) -> float:
    n, base_n = _size(snapshot), _size(base)
    return (n * math.log(n)) / (base_n * math.log(base_n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=20, help="random clusters of each size")
    parser.add_argument("--seed", type=int, default=1, help="the first seed")
    args = parser.parse_args()
    seeds = range(args.seed, args.seed + args.seeds)
    scales = sorted(SCALES, key=lambda s: s != 1.0)

    for borrow_order in (FIFO, FAIR):
        print(
            f"borrow_order={borrow_order}, seeds {seeds.start}-{seeds.stop - 1}: the mean over "
            f"the seeds of the median of {args.runs} runs"
        )
        print(
            f"{'scale':>5} {'nodes':>6} {'placed':>7} {'runnable':>8} {'mean ms':>8} "
            f"{'x base':>7} {'/ nlogn':>8}  placed/preempted/waiting (all seeds)"
        )
        snapshots = {
            (seed, scale): synthetic_snapshot(scale, seed, borrow_order)
            for seed in seeds
            for scale in scales
        }
        medians = median_plan_seconds(snapshots, args.runs)
        mean = {scale: statistics.mean(medians[seed, scale] for seed in seeds) for scale in scales}
        outcomes = {key: plan(snapshot) for key, snapshot in snapshots.items()}
        for scale in scales:
            ratio = mean[scale] / mean[1.0]
            nlogn = nlogn_growth(snapshots[seeds.start, scale], snapshots[seeds.start, 1.0])
            planned = [outcomes[seed, scale] for seed in seeds]
            snapshot = snapshots[seeds.start, scale]
            print(
                f"{scale:>5} {len(snapshot.nodes):>6} {len(snapshot.placed):>7} "
                f"{len(snapshot.runnable):>8} {mean[scale] * 1000:>8.1f} {ratio:>7.2f} "
                f"{ratio / nlogn:>8.2f}  {sum(len(o.placements) for o in planned)}/"
                f"{sum(len(o.preemptions) for o in planned)}/"
                f"{sum(len(o.waiting) for o in planned)}"
            )
        top = max(scales)
        preempted = {
            scale: sum(len(outcomes[seed, scale].preemptions) for seed in seeds) for scale in scales
        }
        print(
            f"preemptions, all seeds: {top}x against 1x, x {preempted[top] / preempted[1.0]:.2f} "
            f"for a cluster {top:g} times as large"
        )
        print(f"each seed alone, {top}x against 1x:")
        for seed in seeds:
            base, large = snapshots[seed, 1.0], snapshots[seed, top]
            ratio = medians[seed, top] / medians[seed, 1.0]
            preempted = len(outcomes[seed, top].preemptions) / max(
                1, len(outcomes[seed, 1.0].preemptions)
            )
            print(
                f"  seed {seed}: {medians[seed, 1.0] * 1000:.1f} ms -> "
                f"{medians[seed, top] * 1000:.1f} ms, x {ratio:.2f}, / nlogn "
                f"{ratio / nlogn_growth(large, base):.2f}; preemptions x {preempted:.2f}"
            )
        print()


def _size(snapshot: Snapshot) -> int:
    return len(snapshot.placed) + len(snapshot.runnable) + len(snapshot.nodes)


if __name__ == "__main__":
    main()
