"""A small demo workload for `make run`: borrowers fill the idle H100s, then the lender
submits and reclaims its GPUs (the borrower gets SIGTERM, checkpoints, and resumes later).

Jobs run scripts/demo_job.py, which sleeps in steps, checkpoints to $CHECKPOINT_DIR and handles
SIGTERM. Needs the demo data (seed_demo) and running agents."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from scheduler.jobs.services import job_submit
from scheduler.models import Node

JOB_SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "demo_job.py"


def command(steps: int, step_seconds: float = 0.5) -> str:
    return f"{sys.executable} {JOB_SCRIPT} --steps {steps} --step-seconds {step_seconds}"


class Command(BaseCommand):
    help = "Submit demo jobs: borrowing first, a reclaim after --reclaim-after seconds."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--reclaim-after", type=float, default=15.0)

    def handle(self, *args, reclaim_after: float, **options) -> None:
        self._wait_for_agents()
        User = get_user_model()
        alice, carol, dave = (User.objects.get(username=n) for n in ("alice", "carol", "dave"))
        submitted = [
            # research: 8 H100 within its limit, 8 more borrowed from vision's idle quota.
            job_submit(user=alice, share_name="research", gpu_type="h100", gpus=8,
                       command=command(60), name="pretrain-a"),
            job_submit(user=alice, share_name="research", gpu_type="h100", gpus=8,
                       command=command(60), name="pretrain-b"),
            job_submit(user=alice, share_name="research", gpu_type="l4", gpus=2,
                       command=command(30), name="eval"),
            job_submit(user=dave, share_name="inference", gpu_type="l4", gpus=4,
                       command=command(40), name="serve-batch"),
        ]  # fmt: skip
        for job, _ in submitted:
            self.stdout.write(f"submitted {job.name} ({job.gpus} × {job.gpu_type}, {job.share})")
        self.stdout.write(f"vision reclaims its H100s in {reclaim_after:g} s")
        time.sleep(reclaim_after)
        job, _ = job_submit(user=carol, share_name="vision", gpu_type="h100", gpus=8,
                            command=command(30), name="vision-finetune")  # fmt: skip
        self.stdout.write(f"submitted {job.name}: watch a borrower get preempted in the admin")

    def _wait_for_agents(self, timeout: float = 60.0) -> None:
        """The demo nodes are READY once their agents have registered."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            types = set(
                Node.objects.filter(
                    state=Node.State.READY, last_heartbeat__isnull=False
                ).values_list("gpu_type", flat=True)
            )
            if {"h100", "l4"} <= types:
                return
            time.sleep(0.5)
        raise CommandError("no READY h100 and l4 nodes: are the agents running?")
