"""What one node's report costs the portal for a gang's attempt, by the gang's size.

    python bench/gang_report.py [--nodes 1,8,32] [--runs 5] [--reports 10]

Each node of a gang reports the attempt's start and exit (and a real agent sends them again when
an answer is lost), so a gang of N nodes makes N reports, each read where the attempt holds
GPUs. On a scratch PostgreSQL database `portal_gang_report` (GANG_REPORT_DATABASE; dropped and
re-created, dropped after) the bench places one attempt on N nodes of 8 h100 (its GPU rows and
its `allocations` as the cycle writes them), then times `node_report` of a `started` event from
every node, --reports times over, in this process: CPU milliseconds per report, the median of
--runs runs. The baseline is the 1-node gang of the same run: the ratio says how a report's
cost grows with the gang (1.0: not at all). Needs PostgreSQL (BENCH_ADMIN_DATABASE_URL, default
postgres://postgres@127.0.0.1:5432/postgres) and Redis (REDIS_URL, default
redis://127.0.0.1:6379/15).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
ADMIN_URL = os.environ.get(
    "BENCH_ADMIN_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"
)
DB_NAME = os.environ.get("GANG_REPORT_DATABASE", "portal_gang_report")


def scratch_database(create: bool) -> None:
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        if create:
            connection.execute(f'CREATE DATABASE "{DB_NAME}"')


def setup_django() -> None:
    os.environ["DATABASE_URL"] = urlparse(ADMIN_URL)._replace(path=f"/{DB_NAME}").geturl()
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def gang(nodes: int, index: int):
    """A running attempt of a gang on `nodes` new nodes of 8 GPUs; (its nodes, its id)."""
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from scheduler.models import GpuAssignment, Job, JobAttempt, Node
    from shares.models import Team
    from shares.services import share_create

    team = Team.objects.create(name=f"Gang {index}", slug=f"gang-{index}")
    user = get_user_model().objects.create_user(f"gang-{index}")
    share = share_create(name=f"gang-{index}", team=team, capacity_limits={"h100": 8 * nodes})
    held = [
        Node.objects.create(name=f"gang-{index}-{i}", gpu_type="h100", gpus=8) for i in range(nodes)
    ]
    job = Job.objects.create(
        share=share, submitted_by=user, gpu_type="h100", gpus=8 * nodes, nodes=nodes,
        command="python train.py", state=Job.State.RUNNING,
    )  # fmt: skip
    attempt = JobAttempt.objects.create(
        job=job, number=1, started_at=timezone.now(),
        allocations=[{"node": node.name, "gpu_indices": list(range(8))} for node in held],
    )  # fmt: skip
    GpuAssignment.objects.bulk_create(
        GpuAssignment(attempt=attempt, node=node, gpu_index=i) for node in held for i in range(8)
    )
    return held, attempt.pk


def report_cpu_ms(nodes: int, index: int, runs: int, reports: int) -> float:
    from scheduler.nodes.attempts import node_report

    held, attempt = gang(nodes, index)
    event = {"type": "started", "attempt": attempt}
    for node in held:  # the first report of each node records its start
        node_report(node=node, events=[event])
    figures = []
    for _ in range(runs):
        started = time.process_time()
        for _ in range(reports):
            for node in held:
                node_report(node=node, events=[event])
        figures.append((time.process_time() - started) / (reports * nodes) * 1000)
    return statistics.median(figures)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1,8,32", help="gang sizes, the first the baseline")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--reports", type=int, default=10, help="reports per node per run")
    args = parser.parse_args()
    sizes = [int(size) for size in args.nodes.split(",")]
    scratch_database(create=True)
    try:
        setup_django()
        figures = [
            (size, report_cpu_ms(size, index, args.runs, args.reports))
            for index, size in enumerate(sizes)
        ]
        from django.db import connections

        connections.close_all()
    finally:
        scratch_database(create=False)
    baseline = figures[0][1]
    print(f"one node's report of a gang's start, CPU ms in the portal (median of {args.runs}):")
    for size, ms in figures:
        ratio = ms / baseline
        print(f"  {size:>3} nodes × 8 GPUs: {ms:.3f} ms, {ratio:.2f}× the {sizes[0]}-node gang's")


if __name__ == "__main__":
    main()
