"""A demo job: works in steps, checkpoints after each one to $CHECKPOINT_DIR, resumes from its
checkpoint, and on SIGTERM saves and exits within the grace period.

`python scripts/demo_job.py --steps 20 --step-seconds 0.5 [--ignore-sigterm] [--exit-code N]`

Besides its checkpoint it leaves, in $CHECKPOINT_DIR, the files the tests and benchmarks read:
`attempt-N.start` (the step it resumed from, written once its SIGTERM handler is set),
`sigterm-N` (time.time() at SIGTERM), `done`."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-seconds", type=float, default=0.5)
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--exit-code", type=int, default=0)
    args = parser.parse_args()
    directory = Path(os.environ.get("CHECKPOINT_DIR", "."))
    attempt = os.environ.get("ATTEMPT", "1")
    checkpoint = directory / "checkpoint"
    step = int(checkpoint.read_text()) if checkpoint.exists() else 0
    stop = False

    def on_sigterm(*_args) -> None:
        nonlocal stop
        (directory / f"sigterm-{attempt}").write_text(repr(time.time()))
        if args.ignore_sigterm:
            print("SIGTERM ignored", flush=True)
            return
        stop = True

    signal.signal(signal.SIGTERM, on_sigterm)
    # Written once the handler is in place: a test that sees this file knows a SIGTERM from
    # now on reaches the handler (before it, Python's default ends the process).
    (directory / f"attempt-{attempt}.start").write_text(str(step))
    gpus = os.environ.get("CUDA_VISIBLE_DEVICES")
    print(f"job {os.environ.get('JOB_ID')} attempt {attempt} on GPUs {gpus}: step {step}")
    sys.stdout.flush()
    while step < args.steps and not stop:
        deadline = time.monotonic() + args.step_seconds
        while not stop and time.monotonic() < deadline:
            time.sleep(min(0.02, args.step_seconds))
        if stop:
            break
        step += 1
        # A gang runs this on each of its nodes, all in the same checkpoint directory: each
        # process writes its own file, then renames it over the checkpoint (atomic), so no
        # process renames away a file another was about to rename.
        tmp = directory / f"checkpoint.{socket.gethostname()}.{os.getpid()}.tmp"
        tmp.write_text(str(step))
        tmp.replace(checkpoint)
    if stop:
        print(f"SIGTERM: checkpointed at step {step}, exiting", flush=True)
        return 143
    if args.exit_code == 0:
        (directory / "done").write_text(str(step))
    print(f"finished {step} steps", flush=True)
    return args.exit_code


if __name__ == "__main__":
    sys.exit(main())
