"""A fingerprint of the engine's decisions: did a change leave the plans as they were?

Run: python bench/plan_hash.py [--seeds 4]

Plans the synthetic clusters of bench/engine.py (seeds 1..--seeds, scales 0.25x to 2x, borrow
orders fifo and fair) and prints one SHA-256 over every plan's placements (job, nodes, GPU
indices, borrowed), preemptions (job, for whom, kind, reason), rejections and waiting reasons,
in the order the plan lists them. Run it before and after a change to the engine: the same
hash means the same decisions on every one of those clusters.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.engine import synthetic_snapshot  # noqa: E402
from scheduler.engine import Plan, plan  # noqa: E402
from scheduler.engine.snapshot import FAIR, FIFO  # noqa: E402

SCALES = (0.25, 0.5, 1.0, 2.0)


def plan_lines(outcome: Plan):
    for p in outcome.placements:
        allocations = ";".join(
            f"{a.node}:{','.join(map(str, a.gpu_indices))}" for a in p.allocations
        )
        yield f"place {p.job_id} {allocations} {p.borrowed}"
    for p in outcome.preemptions:
        yield f"preempt {p.job_id} {p.for_job_id} {p.kind} {p.reason}"
    for r in outcome.rejections:
        yield f"reject {r.job_id} {r.reason}"
    for job_id, reason in outcome.waiting.items():
        yield f"wait {job_id} {reason}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    args = parser.parse_args()
    digest = hashlib.sha256()
    plans = 0
    for borrow_order in (FIFO, FAIR):
        for seed in range(1, args.seeds + 1):
            for scale in SCALES:
                for line in plan_lines(plan(synthetic_snapshot(scale, seed, borrow_order))):
                    digest.update(line.encode())
                    digest.update(b"\n")
                plans += 1
    print(f"{plans} plans, sha256 {digest.hexdigest()}")


if __name__ == "__main__":
    main()
