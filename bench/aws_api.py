"""SubmitServiceJob through boto3 beside the native submit (POST /api/v1/jobs/), on the same
server, the same database and the same clients, in the same run. Goal: the AWS path's submit
rate ≥ 0.8 × the native one's (the SigV4 check and the payload parse must stay cheap), no
submit refused.

    python bench/aws_api.py [--runs 3] [--rounds 4] [--seconds 3] [--clients 8]
                            [--server gunicorn|production] [--quick]

Set-up is bench/api.py's (its functions): a scratch PostgreSQL database (BENCH_AWS_DATABASE,
default `portal_bench_aws`; dropped and re-created, and dropped at the end), migrated, with the
team, the share `bench` (64 h100), 8 nodes and the user `bench` with a token; this bench adds
that user an access key (`manage.py aws_access_key bench`). Then the server (default gunicorn,
2 gthread workers × 4 threads; `--server production`: uvicorn, 2 workers) and a pool of
--clients client processes on this machine, which share its CPUs with the server. Each process
opens one keep-alive connection a phase (bench/api.py's native client) and keeps one boto3
`batch` client of its own (botocore's parameter validation on, no retries), signed with the
key, pointed at /aws. Both paths submit the same job: 8 h100 on one node in share `bench` (natively
`gpus: 8`; through AWS `ml.p5.48xlarge` × 1 in a SageMaker CreateTrainingJob payload). No
Celery worker and no agents, as in bench/api.py: jobs stay queued, the cycle requests coalesce
into one message in Redis.

Each run: --rounds rounds, each --seconds of native submits then --seconds of AWS submits
(every other round the other way round, so drift hits both alike), all --clients back to back.
Per path and run: submits/s (accepted / the phases' wall time), p50/p99 latency (every
request, as the client sees it), refused (any answer but 200/201, or an error), and CPU
milliseconds per request of the client processes (their own process time, boto3's cost), the
server (its processes), PostgreSQL (the whole server, its ended backends included), Redis
(its server) and the rest of the machine's busy CPU (the kernel, anything else running: other
users). Time-based phases: what other users take shows up per request on the slower path more.
Prints each run, then one table of medians over the runs; exits 1 if a goal is missed."""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import boto3
import psutil
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import api  # noqa: E402 — its set-up, server and native client
import soak  # noqa: E402 — its CPU and percentile helpers

# api.py's helpers take the database's name from its module: this bench's own, so that it never
# drops the database of a bench/api.py run next to it.
api.DB_NAME = os.environ.get("BENCH_AWS_DATABASE", "portal_bench_aws")

QUEUE = "gpu-portal"
REGION = "us-east-1"
SHARE = "bench"  # api.SETUP's share
INSTANCE = "ml.p5.48xlarge"  # seeded: 8 × h100, as api.client's native submit asks
PAYLOAD = json.dumps({
    "TrainingJobName": "bench",
    "AlgorithmSpecification": {
        "TrainingImage": "123456789012.dkr.ecr.us-east-1.amazonaws.com/train:latest",
        "TrainingInputMode": "File",
        "ContainerEntrypoint": ["python", "train.py"],
    },
    "RoleArn": "arn:aws:iam::123456789012:role/SageMakerRole",
    "ResourceConfig": {"InstanceType": INSTANCE, "InstanceCount": 1, "VolumeSizeInGB": 30},
    "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
})  # fmt: skip
GOAL_RATIO = 0.8
PATHS = ("native", "aws")

_batch = None  # this client process's own boto3 client (boto3 clients are not shared)


def _behind_proxy(request, **_) -> None:
    """As production's proxy, which terminates TLS and says so after the client signed (see
    api.client); without it SECURE_SSL_REDIRECT answers 301."""
    request.headers["X-Forwarded-Proto"] = "https"


def init_client(endpoint: str, key_id: str, secret: str) -> None:
    """Each pool process: its boto3 client, made before any timing; Ctrl-C is the parent's."""
    global _batch
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _batch = boto3.client(
        "batch",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        config=Config(retries={"total_max_attempts": 1}, read_timeout=30, connect_timeout=5),
    )
    _batch.meta.events.register("before-send.batch", _behind_proxy)


def native_client(args: tuple) -> tuple[int, int, list[float], float, list[str]]:
    """bench/api.py's submit client, and the CPU it used."""
    started = time.process_time()
    ok, errors, latencies = api.client(args)
    return ok, errors, latencies, time.process_time() - started, []


def aws_client(seconds: float) -> tuple[int, int, list[float], float, list[str]]:
    """SubmitServiceJob back to back for `seconds`: (ok, refused, latencies, CPU, reasons)."""
    ok = errors = 0
    latencies: list[float] = []
    reasons: list[str] = []
    started = time.process_time()
    deadline = time.perf_counter() + seconds
    while (start := time.perf_counter()) < deadline:
        try:
            _batch.submit_service_job(
                jobName="bench", jobQueue=QUEUE, serviceJobType="SAGEMAKER_TRAINING",
                quotaShareName=SHARE, serviceRequestPayload=PAYLOAD,
            )  # fmt: skip
            ok += 1
        except (ClientError, BotoCoreError) as error:
            errors += 1
            if len(reasons) < 3:
                reasons.append(str(error)[:300])
        latencies.append(time.perf_counter() - start)
    return ok, errors, latencies, time.process_time() - started, reasons


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its descendants (the server's workers)."""
    total = 0.0
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        for process in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += soak.process_cpu(process)
    return total


def machine_cpu() -> float:
    times = psutil.cpu_times()
    return sum(getattr(times, name, 0.0) for name in ("user", "system", "nice", "irq", "softirq"))


def postgres_cpu() -> float:
    """CPU seconds of the whole PostgreSQL server, its ended backends included (soak's count):
    counting only the live backends of this bench's database lost the CPU of those that ended
    between two readings, and gave negative figures. Other databases' work counts too: run it
    on a quiet server."""
    return soak.postgres_cpu()


def redis_cpu() -> float:
    """CPU seconds of the Redis server (the replay check's and the cycle requests' store; its
    other users count too)."""
    total = 0.0
    for process in psutil.process_iter(["name"]):
        if process.info["name"] == "redis-server":
            with contextlib.suppress(psutil.Error):
                total += soak.process_cpu(process)
    return total


def cpu_now(server: subprocess.Popen) -> dict[str, float]:
    return {"server": tree_cpu(server.pid), "postgres": postgres_cpu(), "redis": redis_cpu(),
            "machine": machine_cpu()}  # fmt: skip


def phase(pool, server, path: str, port: int, token: str, seconds: float, clients: int) -> dict:
    """One path for `seconds` with every client: its raw counts, latencies and CPU seconds."""
    before = cpu_now(server)
    started = time.perf_counter()
    if path == "native":
        results = pool.map(native_client, [(port, "submit", token, seconds, [])] * clients)
    else:
        results = pool.map(aws_client, [seconds] * clients)
    elapsed = time.perf_counter() - started
    after = cpu_now(server)
    return {
        "ok": sum(r[0] for r in results),
        "errors": sum(r[1] for r in results),
        "latencies": [x for r in results for x in r[2]],
        "elapsed": elapsed,
        "cpu": {
            "client": sum(r[3] for r in results),
            **{part: after[part] - before[part] for part in after},
        },  # fmt: skip
        "reasons": [reason for r in results for reason in r[4]],
    }


def figures(phases: list[dict]) -> dict:
    """One path's figures over a run's rounds."""
    ok = sum(p["ok"] for p in phases)
    errors = sum(p["errors"] for p in phases)
    latencies = [x for p in phases for x in p["latencies"]]
    requests = max(1, ok + errors)
    result = {
        "rate": ok / sum(p["elapsed"] for p in phases),
        "p50": soak.percentile(latencies, 0.50) * 1000,
        "p99": soak.percentile(latencies, 0.99) * 1000,
        "ok": ok,
        "refused": errors,
        "reasons": [reason for p in phases for reason in p["reasons"]][:3],
    }
    for part in ("client", "server", "postgres", "redis", "machine"):
        result[f"{part} cpu"] = sum(p["cpu"][part] for p in phases) / requests * 1000
    # The kernel's own work and whatever else runs on the machine (other users too).
    result["rest cpu"] = result["machine cpu"] - sum(
        result[f"{part} cpu"] for part in ("client", "server", "postgres", "redis")
    )
    return result


def access_key() -> tuple[str, str]:
    """A new access key of the bench user, as an admin makes one."""
    result = subprocess.run(
        [api.PYTHON, str(ROOT / "manage.py"), "aws_access_key", "bench",
         "--description", "bench/aws_api.py"],
        check=True, env=api.server_env(), cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    lines = dict(line.split("=", 1) for line in result.stdout.split() if "=" in line)
    return lines["AWS_ACCESS_KEY_ID"], lines["AWS_SECRET_ACCESS_KEY"]


def count_jobs() -> tuple[int, int]:
    """Jobs in the database, and of those the service jobs (the AWS path's)."""
    import psycopg

    with psycopg.connect(api.database_url()) as connection:
        jobs = connection.execute("SELECT count(*) FROM scheduler_job").fetchone()[0]
        service = connection.execute("SELECT count(*) FROM awsbatch_servicejob").fetchone()[0]
    return jobs, service


def stop_server(server: subprocess.Popen) -> None:
    children = []
    with contextlib.suppress(psutil.Error):
        children = psutil.Process(server.pid).children(recursive=True)
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
    _, alive = psutil.wait_procs(children, timeout=5)  # workers that outlive their master
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()


def drop_database() -> None:
    import psycopg

    with psycopg.connect(api.ADMIN_URL, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{api.DB_NAME}" WITH (FORCE)')


def interrupted(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_line(number: int, run: dict) -> str:
    parts = []
    for path in PATHS:
        f = run[path]
        parts.append(
            f"{path} {f['rate']:.0f}/s p50 {f['p50']:.1f} ms p99 {f['p99']:.1f} ms "
            f"refused {f['refused']} cpu/req client {f['client cpu']:.2f} server "
            f"{f['server cpu']:.2f} pg {f['postgres cpu']:.2f} redis {f['redis cpu']:.2f} "
            f"rest {f['rest cpu']:.2f} ms"
        )
    ratio = run["aws"]["rate"] / run["native"]["rate"]
    return f"run {number}: " + " | ".join(parts) + f" | AWS/native {ratio:.2f}"


def table(runs: list[dict]) -> str:
    rows = []

    def row(name, values, fmt, goal="—", met=None):
        each = ", ".join(format(v, fmt) for v in values)
        verdict = "—" if met is None else ("met" if met else "missed")
        median = statistics.median(values)
        rows.append((name, f"{median:{fmt}} ({each})", goal, verdict))
        return median

    ratios = [r["aws"]["rate"] / r["native"]["rate"] for r in runs]
    for path in PATHS:
        row(f"{path} submits/s", [r[path]["rate"] for r in runs], ".0f")
    median = statistics.median(ratios)
    row("AWS/native submit rate", ratios, ".2f", f"≥ {GOAL_RATIO}", median >= GOAL_RATIO)
    for path in PATHS:
        row(f"{path} p50 ms", [r[path]["p50"] for r in runs], ".1f")
        row(f"{path} p99 ms", [r[path]["p99"] for r in runs], ".1f")
    for part, name in (("client", "client CPU"), ("server", "server CPU"),
                       ("postgres", "PostgreSQL CPU"), ("redis", "Redis CPU"),
                       ("rest", "rest CPU")):  # fmt: skip
        for path in PATHS:
            row(f"{path} {name} ms/req", [r[path][f"{part} cpu"] for r in runs], ".2f")
    for path in PATHS:
        refused = [r[path]["refused"] for r in runs]
        row(f"{path} refused submits", refused, "d", "0 each run", not any(refused))
    lines = [("figure", "median (each run)", "goal", "met/missed"), *rows]
    widths = [max(len(line[i]) for line in lines) for i in range(4)]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
                     for line in lines)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4, help="native/AWS alternations per run")
    parser.add_argument("--seconds", type=float, default=3.0, help="per path and round")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--server", choices=("gunicorn", "production"), default="gunicorn")
    parser.add_argument("--quick", action="store_true", help="1 run of 2 rounds of 1 s each")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.rounds, args.seconds = 1, 2, 1.0
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)
    server = None
    counted = 0
    runs: list[dict] = []
    try:
        token = api.prepare()
        key_id, secret = access_key()
        port = api.free_port()
        print(
            f"server: {api.SERVERS[args.server]} on 127.0.0.1:{port}, PostgreSQL database "
            f"{api.DB_NAME} ({api.ADMIN_URL.rsplit('@', 1)[-1]}), Redis {api.REDIS_URL}; no "
            f"Celery worker, no agents (jobs stay queued)\nclients: {args.clients} processes on "
            f"the same {os.cpu_count()} CPUs, each with a keep-alive connection of bench/api.py's "
            f"native client and its own boto3 {boto3.__version__} batch client (SigV4, "
            f"parameter validation, no retries) on /aws\neach submit: 8 × h100 on one "
            f"node in share {SHARE} (AWS: {INSTANCE} × 1 in a CreateTrainingJob payload)\n"
            f"each run: {args.rounds} rounds of {args.seconds:g} s native + {args.seconds:g} s "
            f"AWS, the order alternating; {args.runs} run(s)",
            flush=True,
        )
        server = api.start_server(port, args.server)
        endpoint = f"http://127.0.0.1:{port}/aws"
        with multiprocessing.Pool(
            args.clients, initializer=init_client, initargs=(endpoint, key_id, secret)
        ) as pool:
            # Warm up both workers and both paths (imports, connections, caches); not counted.
            for path in PATHS:
                warm = phase(pool, server, path, port, token, 1.0, args.clients)
                counted += warm["ok"]
                if warm["errors"]:
                    print(f"warm-up {path}: {warm['errors']} refused {warm['reasons'][:1]}")
            order = list(PATHS)
            for number in range(1, args.runs + 1):
                done = {path: [] for path in PATHS}
                for _ in range(args.rounds):
                    for path in order:
                        done[path].append(
                            phase(pool, server, path, port, token, args.seconds, args.clients)
                        )
                    order.reverse()
                run = {path: figures(done[path]) for path in PATHS}
                counted += sum(run[path]["ok"] for path in PATHS)
                runs.append(run)
                print(run_line(number, run), flush=True)
                for path in PATHS:
                    for reason in run[path]["reasons"]:
                        print(f"  {path} refused: {reason}")
        jobs, service = count_jobs()
        aws_ok = sum(r["aws"]["ok"] for r in runs)
        print(
            f"the database holds {jobs} jobs, {service} of them service jobs; the clients "
            f"counted {counted} accepted (warm-ups included), {aws_ok} through AWS in the runs"
        )
    finally:
        if server is not None:
            stop_server(server)
        drop_database()
    print(
        f"\nmedian of {len(runs)} run(s) ({args.clients} clients, {api.SERVERS[args.server]}, "
        f"PostgreSQL, {os.cpu_count()} CPUs); CPU per request (accepted or refused): client = "
        f"the client processes' own, server = the server's processes, PostgreSQL = the whole "
        f"server's, Redis = its server, rest = the machine's other busy CPU (kernel, "
        f"other users)"
    )
    print(table(runs))
    ratio = statistics.median(r["aws"]["rate"] / r["native"]["rate"] for r in runs)
    refused = sum(r[path]["refused"] for r in runs for path in PATHS)
    return 0 if ratio >= GOAL_RATIO and not refused else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as stop:
        print(f"interrupted ({str(stop) or 'Ctrl-C'}); server stopped, {api.DB_NAME} dropped")
        sys.exit(130)
