"""Benchmark: dashboard pages over 30 days of per-minute history.

Generates 30 days of minute history for 20 shares × 2 GPU types (in a scratch SQLite database
in a temporary var dir, or with --database-url postgres://.../NAME in a scratch PostgreSQL
database NAME_bench, dropped afterwards), rolls it up into hours with the real roll-up service,
then measures with Django's test Client the median server time of the cluster overview and of a
share page at the 30 d and 24 h ranges, against /health/ measured in the same run.

    .venv/bin/python bench/dashboard.py [--days 30] [--shares 20] [--runs 7] [--database-url URL]

Prints its figures; nothing here is asserted (the goal is ≤ 300 ms per page)."""

from __future__ import annotations

import argparse
import math
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

GPU_TYPES = ("h100", "a100-80g")
LIMIT = 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--shares", type=int, default=20)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument(
        "--database-url", help="a PostgreSQL server and database name; default: scratch SQLite"
    )
    args = parser.parse_args()

    scratch = tempfile.mkdtemp(prefix="portal-bench-")
    os.environ["PORTAL_VAR_DIR"] = scratch
    if args.database_url:
        os.environ["DATABASE_URL"] = args.database_url
    else:
        os.environ.pop("DATABASE_URL", None)
    os.environ.setdefault("DEBUG", "false")  # no query log: measure what production runs
    os.environ.setdefault("SECRET_KEY", "bench-only-secret-key-not-for-production-use-0123456789")
    os.environ["DJANGO_SETTINGS_MODULE"] = "portal.settings"
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import django

    django.setup()
    from django.db import connection

    named = connection.settings_dict["NAME"]
    if connection.vendor == "sqlite":
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
    else:
        # A database of its own (migrated afresh, dropped at the end): never the one named.
        connection.settings_dict["TEST"]["NAME"] = f"{named}_bench"
        connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        run(args, connection.display_name)
    finally:
        if connection.vendor != "sqlite":
            connection.creation.destroy_test_db(named, verbosity=0)
        connection.close()
        shutil.rmtree(scratch, ignore_errors=True)


def run(args, database: str) -> None:
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    share_names = populate(days=args.days, shares=args.shares, now=now)
    share = share_names[0]

    from django.contrib.auth import get_user_model
    from django.test import Client

    admin = get_user_model().objects.create_superuser("bench", "bench@example.com", "pw-bench-1")
    client = Client()
    client.force_login(admin)
    pages = {
        "/health/ (baseline)": "/health/",
        "overview 30d": "/dash/?range=30d",
        "overview 24h": "/dash/?range=24h",
        f"share {share} 30d": f"/dash/shares/{share}/?range=30d",
        f"share {share} 24h": f"/dash/shares/{share}/?range=24h",
    }
    print(f"median of {args.runs} runs after one warm-up, Django test Client, {database}")
    baseline = None
    for label, url in pages.items():
        median, size = measure(client, url, args.runs)
        baseline = baseline or median
        verdict = "" if label.startswith("/health/") else ("  ok" if median <= 300 else "  SLOW")
        print(
            f"  {label:<28} {median:8.1f} ms  {median / baseline:7.1f} × baseline  "
            f"{size / 1024:7.0f} KiB{verdict}"
        )


def measure(client, url: str, runs: int) -> tuple[float, int]:
    response = client.get(url, secure=True)
    assert response.status_code == 200, (url, response.status_code)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        response = client.get(url, secure=True)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), len(response.content)


def populate(*, days: int, shares: int, now: datetime) -> list[str]:
    """Teams, shares and nodes, then minute history with daily waves, lending and borrowing.

    History goes in 100 000 rows of plain tuples at a time (executemany; COPY on PostgreSQL):
    building 1.7 million model instances for bulk_create took minutes."""
    from django.db import connection, transaction

    from dashboards.models import ClusterSample, Resolution, UsageSample
    from dashboards.services import history_rollup
    from scheduler.models import Node
    from shares.models import CapacityLimit, QuotaShare, Team

    team = Team.objects.create(name="Bench", slug="bench")
    names = [f"share-{i:02d}" for i in range(shares)]
    for name in names:
        share = QuotaShare.objects.create(name=name, team=team)
        for gpu_type in GPU_TYPES:
            CapacityLimit.objects.create(share=share, gpu_type=gpu_type, max_gpus=LIMIT)
    for gpu_type in GPU_TYPES:
        for n in range(shares):
            Node.objects.create(name=f"{gpu_type}-{n}", gpu_type=gpu_type, gpus=LIMIT)

    usage_insert = _inserter(
        UsageSample, "resolution", "at", "share", "gpu_type", "limit", "own", "borrowed", "lent",
        "idle", "demand", "usage_max", "borrowed_max", "demand_max", "samples", "seconds",
    )  # fmt: skip
    cluster_insert = _inserter(
        ClusterSample, "resolution", "at", "gpu_type", "capacity", "in_use", "down",
        "in_use_max", "samples", "seconds",
    )  # fmt: skip
    rng = random.Random(42)
    phase = {name: rng.uniform(0, 2 * math.pi) for name in names}
    minutes = days * 1440
    start = now - timedelta(minutes=minutes)
    started = time.perf_counter()
    usage_rows = cluster_rows = 0
    batch, cluster_batch = [], []
    minute = Resolution.MINUTE.value
    with transaction.atomic(), connection.cursor() as cursor:
        for m in range(minutes):
            at = connection.ops.adapt_datetimefield_value(start + timedelta(minutes=m))
            for gpu_type in GPU_TYPES:
                in_use = 0.0
                for name in names:
                    wave = 0.5 + 0.5 * math.sin(2 * math.pi * m / 1440 + phase[name])
                    use = round(min(2 * LIMIT, wave * 1.6 * LIMIT + rng.uniform(0, 1)), 2)
                    own, borrowed = min(use, LIMIT), max(0.0, use - LIMIT)
                    lent = round(max(0.0, LIMIT - own) * 0.3, 2)
                    in_use += use
                    batch.append(
                        (minute, at, name, gpu_type, LIMIT, own, borrowed, lent,
                         LIMIT - own - lent, round(borrowed * 0.5, 2), use, borrowed, borrowed,
                         4, 60)
                    )  # fmt: skip
                cluster_batch.append(
                    (minute, at, gpu_type, shares * LIMIT, in_use, 0, in_use, 4, 60)
                )
            if len(batch) >= 100_000 or m == minutes - 1:
                usage_insert(cursor, batch)
                cluster_insert(cursor, cluster_batch)
                usage_rows += len(batch)
                cluster_rows += len(cluster_batch)
                batch, cluster_batch = [], []
    generated = time.perf_counter() - started
    started = time.perf_counter()
    written = history_rollup(now + timedelta(minutes=1))
    rolled = time.perf_counter() - started
    print(
        f"history: {usage_rows} share rows + {cluster_rows} cluster rows per minute over "
        f"{days} days for {shares} shares × {len(GPU_TYPES)} GPU types, written in "
        f"{generated:.1f} s; roll-up into {written['usage_hour']} + {written['cluster_hour']} "
        f"hour rows took {rolled:.1f} s"
    )
    return names


def _inserter(model, *fields: str):
    """A function(cursor, rows) that inserts rows of `fields` into the model's table: COPY on
    PostgreSQL (executemany there sends one statement per row), executemany elsewhere."""
    from django.db import connection

    quote = connection.ops.quote_name
    table = quote(model._meta.db_table)
    columns = ", ".join(quote(model._meta.get_field(f).column) for f in fields)
    if connection.vendor == "postgresql":

        def copy(cursor, rows):
            with cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as stream:
                for row in rows:
                    stream.write_row(row)

        return copy
    sql = f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * len(fields))})"
    return lambda cursor, rows: cursor.executemany(sql, rows)


if __name__ == "__main__":
    main()
