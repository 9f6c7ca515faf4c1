"""Benchmark of one scheduling cycle on PostgreSQL: 1,000 nodes × 8 GPUs, 20,000 runnable jobs.

Creates a scratch database on the server of DATABASE_URL (default
postgres://postgres@127.0.0.1:5432/test), migrates it, and for each of --runs runs: a cycle
that places everything it can (admissions per second), a forced re-plan with nothing to place,
and an idle cycle (nothing changed since: skipped), alone and inside the Celery task that runs
it after every change (with the task's metrics, history sample and estimates check); then a
steady cycle, as a busy live system runs them: --finish jobs end (their agents report the
exits), and the next cycle places the jobs that take their GPUs (the worker's kept snapshot
reads only what changed). Then the same once more, the cycle taken by the worker's other
process, whose copy is as old as its last cycle (it catches up from the feed's history), beside
reading everything. And one refresh of the estimated starts on the full cluster (issue 21's
"≤ 2 s per refresh"): the whole Celery task, reading the snapshot and the run-time history, the
replay within its time budget, and writing every waiting job's estimate. Baseline, measured in
the same run: the engine's plan() alone on the same snapshot, so the ratio shows what loading
and applying cost on top. Prints medians.
`python bench/cycle.py [--runs 3] [--nodes 1000] [--jobs 20000] [--finish 200]`"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def scratch_database(url: str) -> tuple[str, str]:
    """Create a scratch database next to `url`'s; returns (its URL, its name)."""
    import psycopg

    name = f"bench_cycle_{os.getpid()}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}")), name


def drop_database(url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def populate(nodes: int, jobs: int) -> None:
    import random

    from django.contrib.auth import get_user_model

    from scheduler.models import Job, Node
    from shares.models import QuotaShare, Team
    from shares.services import share_create

    user = get_user_model().objects.create(username="bench")
    teams = [Team.objects.create(name=f"team {i}", slug=f"team-{i}") for i in range(10)]
    shares = [
        share_create(name=f"share-{i}", team=team, capacity_limits={"h100": nodes * 8 // 10},
                     strategy=QuotaShare.Strategy.LEND_AND_BORROW)
        for i, team in enumerate(teams)
    ]  # fmt: skip
    from django.utils import timezone

    now = timezone.now()
    Node.objects.bulk_create(
        [Node(name=f"node-{i:04d}", gpu_type="h100", gpus=8, last_heartbeat=now)
         for i in range(nodes)]
    )  # fmt: skip
    rng = random.Random(7)
    Job.objects.bulk_create(
        [
            Job(share=shares[i % len(shares)], submitted_by=user, gpu_type="h100",
                gpus=rng.choice((1, 2, 4, 8)), command="true", state=Job.State.RUNNABLE,
                priority=rng.randrange(10), reason="queued")
            for i in range(jobs)
        ],
        batch_size=2000,
    )  # fmt: skip


def reset() -> None:
    """Back to everything runnable, nothing placed; vacuumed, as autovacuum keeps a live
    system's tables (each reset leaves tens of thousands of dead rows, which made every run
    after the first place its jobs several times slower)."""
    from django.db import connection
    from django.utils import timezone

    from scheduler.models import GpuAssignment, Job, JobAttempt, JobEvent, Node

    Node.objects.update(last_heartbeat=timezone.now(), state=Node.State.READY)
    GpuAssignment.objects.all().delete()
    JobAttempt.objects.all().delete()
    JobEvent.objects.all().delete()
    Job.objects.update(state=Job.State.RUNNABLE, attempt_count=0, reason="queued")
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")


def finish_jobs(count: int) -> int:
    """End `count` running attempts as their agents would report it (exit 0); returns how many
    ended."""
    from scheduler.models import JobAttempt, Node
    from scheduler.nodes.attempts import node_report

    attempts = list(JobAttempt.objects.filter(ended_at__isnull=True).order_by("id")[:count])
    by_node: dict[str, list[dict]] = {}
    for attempt in attempts:
        node = attempt.allocations[0]["node"]
        by_node.setdefault(node, []).append(
            {"type": "exited", "attempt": attempt.pk, "end": "exit", "exit_code": 0,
             "signalled": False, "log": "", "detail": ""}
        )  # fmt: skip
    nodes = {n.name: n for n in Node.objects.filter(name__in=by_node)}
    ended = 0
    for name, events in by_node.items():
        ended += node_report(node=nodes[name], events=events).count("ok")
    return ended


# Calls of an idle cycle (and of its task) timed together in each run.
TASK_SAMPLES = 100


def per_call(call: Callable[[], object], samples: int) -> tuple[float, float]:
    """Seconds of wall-clock time and of this process's CPU per call, the median of `samples`
    calls."""
    walls, cpus = [], []
    for _ in range(samples):
        wall, cpu = time.perf_counter(), time.process_time()
        call()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def print_steps(title: str, runs: list[dict[str, float]]) -> None:
    """Median seconds of each step of a cycle (CycleResult.timings) or of an estimates refresh
    (EstimateRun.timings); of a cycle, `commit` is what the steps do not account for: mostly
    the COMMIT itself."""
    steps = [step for step in runs[0] if step != "total"]
    if "total" in runs[0]:
        for timings in runs:
            timings["commit"] = timings["total"] - sum(timings[step] for step in steps)
        steps.append("commit")
    print(f"  {title}, median per step:")
    for step in steps:
        print(f"    {step:<20} {statistics.median(t.get(step, 0.0) for t in runs) * 1000:8.1f} ms")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--finish", type=int, default=200)
    args = parser.parse_args()
    server = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
    if not server.startswith("postgres"):
        sys.exit("bench/cycle.py needs PostgreSQL: set DATABASE_URL=postgres://...")
    url, name = scratch_database(server)
    try:
        os.environ["DATABASE_URL"] = url
        os.environ.setdefault("LOG_LEVEL", "WARNING")
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "portal.settings")
        import django

        django.setup()
        from django.core.management import call_command

        from scheduler import engine
        from scheduler.cycle import run as cycle_module
        from scheduler.cycle.estimates import estimates_refresh
        from scheduler.cycle.run import cycle_run
        from scheduler.cycle.snapshot import SnapshotCache, cycle_snapshot
        from scheduler.cycle.tasks import cycle as cycle_task

        call_command("migrate", verbosity=0)
        populate(args.nodes, args.jobs)
        placing, placed, idle, replan, plan_only = [], [], [], [], []
        steady, steady_placed, steady_plan, steady_steps = [], [], [], []
        placing_steps, replan_steps = [], []
        idle_run: list[tuple[float, float]] = []
        idle_task: list[tuple[float, float]] = []
        other_load, other_kind, full_load = [], [], []
        refreshes = []
        this_process = cycle_module.snapshot_cache
        for _ in range(args.runs):
            reset()
            start = time.perf_counter()
            result = cycle_run(force=True)
            placing.append(time.perf_counter() - start)
            placed.append(result.placed)
            placing_steps.append(result.timings)
            # The worker's other process takes a cycle now and then: its copy, as of now.
            other = SnapshotCache()
            cycle_module.snapshot_cache = other
            try:
                cycle_run(force=True)
            finally:
                cycle_module.snapshot_cache = this_process
            start = time.perf_counter()
            replan_steps.append(cycle_run(force=True).timings)
            replan.append(time.perf_counter() - start)
            # After a cycle that changed nothing, the next one with no new change is skipped.
            start = time.perf_counter()
            assert cycle_run().skipped
            idle.append(time.perf_counter() - start)
            # The Celery task around such a cycle, which runs after every change (its
            # metrics, a history sample, mostly too soon, and whether to queue an estimates
            # refresh), beside the cycle alone.
            idle_run.append(per_call(cycle_run, TASK_SAMPLES))
            idle_task.append(per_call(cycle_task, TASK_SAMPLES))
            # A steady cycle: some jobs end, the next cycle fills their GPUs.
            finish_jobs(args.finish)
            start = time.perf_counter()
            result = cycle_run(force=True)
            steady.append(time.perf_counter() - start)
            steady_placed.append(result.placed)
            steady_steps.append(result.timings)
            snapshot, _ = cycle_snapshot()
            start = time.perf_counter()
            engine.plan(snapshot)
            steady_plan.append(time.perf_counter() - start)
            refreshes.append(estimates_refresh())
            # Then the other process's turn, a few cycles behind.
            finish_jobs(args.finish)
            cycle_module.snapshot_cache = other
            try:
                other_load.append(cycle_run(force=True).timings["snapshot"])
            finally:
                cycle_module.snapshot_cache = this_process
            other_kind.append(other.last_load)
            start = time.perf_counter()
            cycle_snapshot()
            full_load.append(time.perf_counter() - start)
            reset()
            snapshot, _ = cycle_snapshot()
            start = time.perf_counter()
            engine.plan(snapshot)
            plan_only.append(time.perf_counter() - start)
        med = statistics.median
        print(f"cycle bench on PostgreSQL: {args.nodes} nodes × 8 GPUs, {args.jobs} runnable "
              f"jobs, {args.runs} runs (medians)")  # fmt: skip
        print(f"  placing cycle:        {med(placing):8.3f} s, {med(placed):.0f} jobs placed")
        print(f"  admissions per second: {med(placed) / med(placing):8.0f}")
        print(f"  idle cycle (skipped):  {med(idle) * 1000:8.1f} ms")
        run_wall, run_cpu = (med(t[i] for t in idle_run) * 1000 for i in (0, 1))
        task_wall, task_cpu = (med(t[i] for t in idle_task) * 1000 for i in (0, 1))
        print(f"  the cycle task around an idle cycle: {task_wall:8.2f} ms ({task_cpu:.2f} ms of "
              f"CPU), against the cycle alone {run_wall:.2f} ms ({run_cpu:.2f} ms of CPU): "
              f"+{task_wall - run_wall:.2f} ms ({task_cpu - run_cpu:.2f} ms of CPU) for its "
              f"metrics, history sample and estimates check; median of {TASK_SAMPLES} calls "
              "in each run")  # fmt: skip
        print(f"  forced re-plan, nothing to place: {med(replan):8.3f} s")
        print(f"  baseline engine.plan() alone on the same snapshot: {med(plan_only):8.3f} s")
        print(f"  ratio placing cycle / plan alone: {med(placing) / med(plan_only):8.2f}")
        steady_ratio = med(steady) / med(steady_plan)
        print(f"  steady cycle after {args.finish} jobs ended: {med(steady):8.3f} s, "
              f"{med(steady_placed):.0f} jobs placed; plan alone on its snapshot "
              f"{med(steady_plan):8.3f} s; ratio {steady_ratio:8.2f}")  # fmt: skip
        print(f"  the other worker process's steady cycle: its snapshot {med(other_load):8.3f} s "
              f"({', '.join(other_kind)}), reading everything {med(full_load):8.3f} s; ratio "
              f"{med(full_load) / med(other_load):8.2f}")  # fmt: skip
        print(f"  estimates refresh, the whole task on the full cluster: "
              f"{med([r.seconds for r in refreshes]):8.3f} s; the replay reached "
              f"{med([r.replayed for r in refreshes]) / 60:.0f} simulated minutes, "
              f"{med([r.estimated for r in refreshes]):.0f} of "
              f"{med([r.runnable for r in refreshes]):.0f} waiting jobs estimated")  # fmt: skip
        print_steps("estimates refresh", [r.timings for r in refreshes])
        print_steps("placing cycle", placing_steps)
        print_steps("steady cycle", steady_steps)
        print_steps("forced re-plan", replan_steps)
    finally:
        from django.db import connections

        connections.close_all()
        drop_database(server, name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
