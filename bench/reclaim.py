"""Benchmark of reclaims on a live system: web server, Celery worker with beat, Redis, two
agents with 8 fake H100 each, SQLite (or DATABASE_URL) in a scratch directory.

A borrower fills the idle GPUs; then, --reclaims times, the owner submits an 8-GPU job and we
measure from job_submit returning to (a) the borrower's SIGTERM (time.time() the job script
writes on SIGTERM) and (b) the owner's job RUNNING (started_at, set when its agent reports the
start). Baseline in the same run: the owner's job started on idle GPUs (no reclaim).
The same two borrowers are reclaimed again and again, so the churn breaker (which would keep a
job preempted that often off borrowed GPUs) is turned off here: what is measured is the reclaim.
Prints p50 and p99. `python bench/reclaim.py [--reclaims 20]`"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
GRACE = 2


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reclaims", type=int, default=20)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-reclaim-"))
    os.environ.setdefault("DATABASE_URL", f"sqlite:///{tmp / 'bench.sqlite3'}")
    os.environ.setdefault("LOG_LEVEL", "WARNING")
    os.environ["DJANGO_SETTINGS_MODULE"] = "portal.settings"
    if not os.environ.get("REDIS_URL"):
        sys.path.insert(0, str(ROOT / "scripts"))
        import embedded_redis

        embedded_redis.start()
        os.environ["REDIS_URL"] = embedded_redis.url()
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    from scheduler.jobs.services import job_submit
    from scheduler.models import ClusterSettings, Job, JobAttempt
    from shares.models import QuotaShare, Team
    from shares.services import share_create
    from tests.live import JOIN_TOKEN, LiveSystem, job_command, wait_for

    call_command("migrate", verbosity=0)
    # The agents' join token (as the live system's own processes would make it), and the churn
    # breaker off (see above).
    ClusterSettings.objects.update_or_create(
        pk=1, defaults={"agent_join_token": JOIN_TOKEN, "churn_preemptions": 0}
    )
    user = get_user_model().objects.create(username="bench")
    lender, borrower = (Team.objects.create(name=n, slug=n) for n in ("lender", "borrower"))
    share_create(name="owner", team=lender, capacity_limits={"h100": 8},
                 strategy=QuotaShare.Strategy.LEND, grace_seconds=GRACE)  # fmt: skip
    share_create(name="borrower", team=borrower, capacity_limits={"h100": 8},
                 strategy=QuotaShare.Strategy.LEND_AND_BORROW, grace_seconds=GRACE)  # fmt: skip
    system = LiveSystem(tmp)
    system.start({"node-a": (8, "h100"), "node-b": (8, "h100")})
    try:
        from scheduler.models import Node

        wait_for(lambda: Node.objects.filter(state="READY").count() == 2, what="agents")

        def submit(share: str, command: str) -> tuple[Job, float]:
            job, _ = job_submit(user=user, share_name=share, gpu_type="h100", gpus=8,
                                command=command)  # fmt: skip
            return job, time.time()

        def running(job: Job) -> float:
            wait_for(lambda: Job.objects.get(pk=job.pk).started_at, timeout=60, what="start")
            return Job.objects.get(pk=job.pk).started_at.timestamp()

        baseline = []
        for _ in range(5):
            job, t0 = submit("owner", job_command(1, 0.05))
            baseline.append(running(job) - t0)
            wait_for(lambda job=job: Job.objects.get(pk=job.pk).state == "SUCCEEDED")
        borrowers = [submit("borrower", job_command(100000, 0.05))[0] for _ in range(2)]
        to_sigterm, to_running = [], []
        for _ in range(args.reclaims):
            for job in borrowers:
                wait_for(lambda job=job: Job.objects.get(pk=job.pk).state == "RUNNING",
                         timeout=60, what="borrowers running")  # fmt: skip
            owner, t0 = submit("owner", job_command(2, 0.05))
            started = running(owner)
            stopped = JobAttempt.objects.get(preempted_for=owner)
            sigterm = system.checkpoint_dir(stopped.job_id) / f"sigterm-{stopped.number}"
            wait_for(sigterm.exists, what="SIGTERM file")
            to_sigterm.append(float(sigterm.read_text()) - t0)
            to_running.append(started - t0)
            wait_for(lambda o=owner: Job.objects.get(pk=o.pk).state == "SUCCEEDED", timeout=60)
        print(f"reclaim bench: {args.reclaims} reclaims, grace {GRACE} s, "
              f"{os.environ['DATABASE_URL'].split(':')[0]}")  # fmt: skip
        print(f"  submit → borrower SIGTERM:  p50 {pct(to_sigterm, .5):.3f} s   "
              f"p99 {pct(to_sigterm, .99):.3f} s")  # fmt: skip
        print(f"  submit → owner RUNNING:     p50 {pct(to_running, .5):.3f} s   "
              f"p99 {pct(to_running, .99):.3f} s")  # fmt: skip
        base = statistics.median(baseline)
        print(f"  baseline submit → RUNNING on idle GPUs (median of {len(baseline)}): {base:.3f} s")
        print(f"  ratio owner RUNNING p50 / baseline: {pct(to_running, 0.5) / base:.2f}")
    finally:
        system.stop_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
