"""Quota management walkthrough (mirrors AWS Batch's sample notebook for SageMaker quota
shares), driven through the Python client against `make run`.

    .venv/bin/python manage.py drf_create_token bob     # borrower: ml-research, share research
    .venv/bin/python manage.py drf_create_token carol   # owner: vision, share vision
    export PORTAL_URL=http://127.0.0.1:8000 BOB_TOKEN=... CAROL_TOKEN=...
    .venv/bin/python docs/walkthrough.py

See docs/walkthrough.md for what it prints."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from portal_client import Client  # noqa: E402

URL = os.environ.get("PORTAL_URL", "http://127.0.0.1:8000")
# The demo job: works in steps, checkpoints to $CHECKPOINT_DIR, stops cleanly on SIGTERM and
# resumes from its checkpoint (the fake-GPU agents of `make run` run on this machine).
JOB = f"{sys.executable} {Path(__file__).resolve().parent.parent / 'scripts' / 'demo_job.py'}"
TIMEOUT = float(os.environ.get("WALKTHROUGH_TIMEOUT", "300"))
WORK_SECONDS = 3.0  # how long the borrower works before the owner's job arrives


def usage(portal: Client, title: str) -> None:
    print(f"-- {title}")
    for name, rows in sorted(portal.queue()["shares"].items()):
        for gpu_type, row in sorted(rows.items()):
            print(
                f"   {name:<10} {gpu_type:<5} limit {row['limit']:>2}  own {row['own']:>2}  "
                f"borrowed {row['borrowed']:>2}  lent {row['lent']:>2}"
            )


def first_log_line(portal: Client, job_id: int, timeout: float = 30) -> str:
    """The attempt's first log line (the job prints the step it resumes from); the agent sends
    the log tail a moment after the job starts."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = portal.logs(job_id).strip().splitlines()
        if lines:
            return lines[0]
        time.sleep(0.5)
    return "(no log yet)"


def main() -> int:
    bob = Client(URL, os.environ["BOB_TOKEN"])
    carol = Client(URL, os.environ["CAROL_TOKEN"])

    print("1. Three shares, one per strategy")
    for share in bob.shares() + carol.shares():
        print(f"   {share['name']:<10} {share['strategy']:<16} {share['capacity_limits']}")

    print("2. ml-research borrows vision's idle H100s for a background run")
    background = bob.submit(
        share="research",
        gpus=16,
        nodes=2,
        gpu_type="h100",
        name="background-pretrain",
        command=f"{JOB} --steps 240 --step-seconds 0.5",
        client_token="walkthrough-background",
    )
    background = bob.wait(background["id"], states={"RUNNING"}, timeout=TIMEOUT)
    print(f"   job {background['id']} {background['state']} on {background['gpus']} h100")
    usage(carol, "usage while research borrows")
    usage(bob, "(as bob)")
    # It works a few steps (half a second each), checkpointing after each, so that there is a
    # checkpoint to resume from when the reclaim comes.
    time.sleep(WORK_SECONDS)

    print("3. vision's own high-priority job arrives and reclaims its GPUs")
    urgent = carol.submit(
        share="vision",
        gpus=8,
        gpu_type="h100",
        priority=100,
        name="urgent-finetune",
        command=f"{JOB} --steps 30 --step-seconds 0.5",
        client_token="walkthrough-urgent",
    )
    preempted = bob.wait(background["id"], states={"RUNNABLE"}, timeout=TIMEOUT)
    summary = bob.job(preempted["id"])["preemptions"]
    print(f"   job {preempted['id']} preempted {summary['count']} time(s): {preempted['reason']}")
    for attempt in summary["recent"]:
        print(f"   attempt {attempt['number']} stopped for job {attempt['preempted_for']}")
    urgent = carol.wait(urgent["id"], states={"RUNNING"}, timeout=TIMEOUT)
    print(f"   job {urgent['id']} {urgent['state']}")
    usage(carol, "usage after the reclaim")

    print("4. The owner's job ends; the borrower resumes from its checkpoint")
    carol.wait(urgent["id"], timeout=TIMEOUT)
    resumed = bob.wait(background["id"], states={"RUNNING"}, timeout=TIMEOUT)
    print(f"   job {resumed['id']} {resumed['state']}, attempt {resumed['attempt_count']}")
    print("   log:", first_log_line(bob, resumed["id"]))
    bob.cancel(resumed["id"])
    print(f"   job {resumed['id']} cancelled: the walkthrough is over")
    return 0


if __name__ == "__main__":
    sys.exit(main())
