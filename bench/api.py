"""Submit and read throughput of the REST API on PostgreSQL, concurrent clients: on the
production server (`gpu-portal-server web`: uvicorn, 2 workers, a pool of 8 connections each), or
with `--server gunicorn` on gunicorn (2 gthread workers × 4 threads), the WSGI server it had
before, for comparison.

    python bench/api.py [--runs 3] [--seconds 5] [--clients 8] [--server production|gunicorn]

Creates a scratch PostgreSQL database (dropped and re-created each time), migrates it, adds a
team, a share, nodes and a user token, starts the server (keep-alive), then per run measures
1. GET /health/ (the same server's trivial endpoint: the ceiling),
2. POST /api/v1/jobs/ (a full submit: auth, membership, validation, insert, events, and the
   cycle request — a Celery message to Redis; no worker runs, messages just accumulate), and
3. GET /api/v1/jobs/<id>/ (describe, as a user polls a job) of random jobs among READ_JOBS of
   the submitted ones, each given a history after the warm-up: a first attempt on a node,
   preempted for another job (its GPUs released), and a second one running on a node (or, past
   the cluster's 8 nodes, ended): two attempts with their GPUs, ten or eleven events,
each for --seconds with --clients concurrent clients (processes, one keep-alive connection
each). Prints per-run figures and the medians. Goal: ≥ 300 submits/s, p99 ≤ 100 ms,
submit/health ratio ≥ 0.4; ≥ 500 reads/s."""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
GUNICORN = str(Path(PYTHON).parent / "gunicorn")
ADMIN_URL = os.environ.get(
    "BENCH_ADMIN_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"
)
DB_NAME = os.environ.get("BENCH_DATABASE", "portal_bench")
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/15")


def database_url() -> str:
    admin = urlparse(ADMIN_URL)
    return admin._replace(path=f"/{DB_NAME}").geturl()


def create_database() -> None:
    import psycopg

    with psycopg.connect(ADMIN_URL, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        connection.execute(f'CREATE DATABASE "{DB_NAME}"')


SETUP = """
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from scheduler.models import Node
from shares.models import Membership, Team
from shares.services import share_create
user = get_user_model().objects.create_user("bench")
team = Team.objects.create(name="Bench", slug="bench")
Membership.objects.create(team=team, user=user, role="LEAD")
share_create(name="bench", team=team, capacity_limits={"h100": 64})
for i in range(8):
    Node.objects.create(name=f"bench-{i}", gpu_type="h100", gpus=8)
print(Token.objects.create(user=user).key)
"""


READ_JOBS = 256

# The history of a job that was preempted once and runs again, written as the cycle and the
# agents' reports write it (scheduler.transitions, attempts holding GPU rows). Prints the ids.
HISTORY = """
from django.utils import timezone
from scheduler.models import GpuAssignment, Job, JobAttempt, Node
from scheduler.transitions import Transitions
jobs = list(Job.objects.filter(share__name="bench").order_by("id")[:READ_JOBS])
nodes = list(Node.objects.filter(name__startswith="bench-").order_by("name"))
def attempt(job, number, node, ended, **fields):
    now = timezone.now()
    made = JobAttempt.objects.create(
        job=job, number=number, started_at=now, ended_at=now if ended else None,
        allocations=[{"node": node.name, "gpu_indices": list(range(8))}], **fields,
    )
    GpuAssignment.objects.bulk_create(
        GpuAssignment(attempt=made, node=node, gpu_index=i, released=ended) for i in range(8)
    )
for number, job in enumerate(jobs):
    node, other = nodes[number % len(nodes)], jobs[(number + 1) % len(jobs)]
    attempt(
        job, 1, node, True, outcome=JobAttempt.Outcome.PREEMPTED, preempted_for=other,
        end_reason=f"reclaimed for job {other.pk} of share bench", log_tail="step 100 SIGTERM",
    )
    running = number < len(nodes)  # one running attempt per node; the others have ended
    ended = {} if running else {"outcome": JobAttempt.Outcome.SUCCEEDED, "exit_code": 0}
    attempt(job, 2, node, not running, log_tail="step 200", **ended)
    steps = [
        ("SCHEDULED", f"placed on {node.name}"), ("STARTING", "sent to its node"),
        ("RUNNING", "started"), ("PREEMPTING", f"reclaimed for job {other.pk}"),
        ("RUNNABLE", "preempted; requeued"), ("SCHEDULED", f"placed on {node.name}"),
        ("STARTING", "sent to its node"), ("RUNNING", "started"),
    ]
    if not running:
        steps.append(("SUCCEEDED", "exit code 0"))
    transitions = Transitions()
    for state, reason in steps[:-1]:
        transitions.move(job, to_state=state, reason=reason)
    state, reason = steps[-1]
    counts = {"preemption_count": 1, "attempt_count": 2, "started_at": timezone.now()}
    transitions.move(job, to_state=state, reason=reason, **counts).save()
print(",".join(str(job.pk) for job in jobs))
"""


def server_env() -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": REDIS_URL,
        "DEBUG": "false",
        "SECRET_KEY": "bench-only-secret-key-not-for-production-use-0123456789",
        "LOG_LEVEL": "WARNING",
    }


def prepare() -> str:
    create_database()
    env = server_env()
    manage = [PYTHON, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "--no-input", "-v0"], check=True, env=env, cwd=ROOT)
    result = subprocess.run(
        [*manage, "shell", "-c", SETUP], check=True, env=env, cwd=ROOT, capture_output=True,
        text=True,
    )  # fmt: skip
    return result.stdout.strip().splitlines()[-1]


def give_history(count: int) -> list[int]:
    """READ_JOBS of the submitted jobs get their attempts and events (HISTORY); their ids."""
    result = subprocess.run(
        [PYTHON, str(ROOT / "manage.py"), "shell", "-c", HISTORY.replace("READ_JOBS", str(count))],
        check=True, env=server_env(), cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    return [int(pk) for pk in result.stdout.strip().splitlines()[-1].split(",")]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Still 2 worker processes, each with 4 threads (gthread). The sync worker serves one request at
# a time and closes the connection after each (no keep-alive), so a worker sat idle through
# every commit's WAL flush and Redis round trip, and every request paid a new TCP connection.
# gthread overlaps those waits within a worker and keeps connections alive (the health ceiling
# gets the same server). 2 × 4 threads: one per client at the default 8 clients.
GUNICORN_OPTIONS = ["--worker-class", "gthread", "--threads", "4", "--keep-alive", "5"]


SERVERS = {
    "production": "gpu-portal-server web (uvicorn) 2 workers, pool of 8",
    "gunicorn": "gunicorn 2 workers × 4 threads",
}


def start_server(port: int, kind: str) -> subprocess.Popen:
    if kind == "gunicorn":
        command = [GUNICORN, "portal.wsgi", "-w", "2", *GUNICORN_OPTIONS,
                   "-b", f"127.0.0.1:{port}", "--log-level", "warning"]  # fmt: skip
        env = server_env()
    else:
        command = [PYTHON, "-m", "portal.server", "web"]
        env = {**server_env(), "PORTAL_ADDRESS": f"127.0.0.1:{port}", "WEB_WORKERS": "2",
               "DATABASE_POOL_SIZE": "8", "SECURE_SSL_REDIRECT": "0"}  # fmt: skip
    server = subprocess.Popen(command, env=env, cwd=ROOT)
    for _ in range(100):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return server
        except OSError:
            time.sleep(0.1)
    server.kill()
    raise SystemExit(f"{kind} did not start")


def client(args: tuple[int, str, str, float, list[int]]) -> tuple[int, int, list[float]]:
    """One client: requests back to back for `seconds`; returns (ok, errors, latencies). A
    reader GETs a random one of `job_ids` each time."""
    port, kind, token, seconds, job_ids = args
    chooser = random.Random()
    body = json.dumps(
        {"share": "bench", "gpu_type": "h100", "gpus": 8, "command": "python train.py"}
    )
    # Production runs behind a proxy that terminates TLS and says so (SECURE_PROXY_SSL_HEADER);
    # without the header, SECURE_SSL_REDIRECT answers every submit with a 301.
    headers = {
        "Authorization": f"Token {token}",
        "Content-Type": "application/json",
        "X-Forwarded-Proto": "https",
    }
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    ok = errors = 0
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    while (start := time.perf_counter()) < deadline:
        try:
            if kind == "health":
                connection.request("GET", "/health/", headers={"X-Forwarded-Proto": "https"})
            elif kind == "read":
                path = f"/api/v1/jobs/{chooser.choice(job_ids)}/"
                connection.request("GET", path, headers=headers)
            else:
                connection.request("POST", "/api/v1/jobs/", body=body, headers=headers)
            response = connection.getresponse()
            response.read()
            if response.status in (200, 201):
                ok += 1
            else:
                errors += 1
            if response.getheader("Connection", "").lower() == "close":
                connection.close()
        except (OSError, http.client.HTTPException):
            errors += 1
            connection.close()
        latencies.append(time.perf_counter() - start)
    return ok, errors, latencies


def measure(
    pool, port: int, kind: str, token: str, seconds: float, clients: int, job_ids=()
) -> dict:
    started = time.perf_counter()
    results = pool.map(client, [(port, kind, token, seconds, list(job_ids))] * clients)
    elapsed = time.perf_counter() - started
    ok = sum(r[0] for r in results)
    latencies = sorted(x for r in results for x in r[2])
    p = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000  # noqa: E731
    return {
        "rate": ok / elapsed,
        "errors": sum(r[1] for r in results),
        "p50": p(0.50),
        "p99": p(0.99),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--server", choices=("production", "gunicorn"), default="production")
    args = parser.parse_args()
    token = prepare()
    port = free_port()
    server = start_server(port, args.server)
    runs = []
    try:
        with multiprocessing.Pool(args.clients) as pool:
            measure(pool, port, "health", token, 1.0, args.clients)  # warm up both workers
            measure(pool, port, "submit", token, 1.0, args.clients)
            job_ids = give_history(READ_JOBS)
            measure(pool, port, "read", token, 1.0, args.clients, job_ids)
            for number in range(1, args.runs + 1):
                health = measure(pool, port, "health", token, args.seconds, args.clients)
                submit = measure(pool, port, "submit", token, args.seconds, args.clients)
                read = measure(pool, port, "read", token, args.seconds, args.clients, job_ids)
                runs.append((health, submit, read))
                print(
                    f"run {number}: submit {submit['rate']:.0f}/s p50 {submit['p50']:.1f} ms "
                    f"p99 {submit['p99']:.1f} ms errors {submit['errors']} | read "
                    f"{read['rate']:.0f}/s p50 {read['p50']:.1f} ms p99 {read['p99']:.1f} ms "
                    f"errors {read['errors']} | health {health['rate']:.0f}/s p99 "
                    f"{health['p99']:.1f} ms | ratios submit {submit['rate'] / health['rate']:.2f} "
                    f"read {read['rate'] / health['rate']:.2f}",
                    flush=True,
                )
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    median = lambda values: statistics.median(values)  # noqa: E731
    submit_rate = median([s["rate"] for _, s, _ in runs])
    submit_p99 = median([s["p99"] for _, s, _ in runs])
    read_rate = median([r["rate"] for _, _, r in runs])
    read_p50 = median([r["p50"] for _, _, r in runs])
    read_p99 = median([r["p99"] for _, _, r in runs])
    health_rate = median([h["rate"] for h, _, _ in runs])
    ratio = median([s["rate"] / h["rate"] for h, s, _ in runs])
    read_ratio = median([r["rate"] / h["rate"] for h, _, r in runs])
    print(
        f"median of {len(runs)} runs ({args.clients} clients, {SERVERS[args.server]}, "
        f"PostgreSQL, {os.cpu_count()} CPUs): submits/s {submit_rate:.0f} (goal ≥ 300), "
        f"p99 {submit_p99:.1f} ms (goal ≤ 100), ratio {ratio:.2f} (goal ≥ 0.4); "
        f"reads/s {read_rate:.0f} (goal ≥ 500), p50 {read_p50:.1f} ms, p99 {read_p99:.1f} ms, "
        f"ratio {read_ratio:.2f}; health/s {health_rate:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
