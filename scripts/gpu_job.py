"""A job that uses a real GPU, for scripts/gpu_check.py: it takes `--gib` GiB of the GPU's memory,
multiplies matrices in steps, checkpoints after each step to $CHECKPOINT_DIR (with the portal's
checkpoint marker), resumes from its checkpoint, and on SIGTERM saves and exits (or, with
`--ignore-sigterm`, holds on until it is killed).

It writes one JSON line a record to `gpu-job.jsonl` in $CHECKPOINT_DIR: `ready` (the device it
got: CUDA_VISIBLE_DEVICES, the device count and UUID as CUDA sees them, the step it resumed
from, the time), `sigterm` (the time), `saved`, `done`. `--without-cuda` skips the GPU (to try
the check on a machine without one)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

MARKER = ".portal-checkpoint"  # docs/agent.md: what tells the agent a checkpoint was saved


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--ignore-sigterm", action="store_true")
    parser.add_argument("--without-cuda", action="store_true")
    args = parser.parse_args()
    directory = Path(os.environ["CHECKPOINT_DIR"])
    attempt = int(os.environ["ATTEMPT"])
    records = directory / "gpu-job.jsonl"

    def record(kind: str, **fields) -> None:
        with records.open("a") as out:
            out.write(
                json.dumps({"record": kind, "attempt": attempt, "time": time.time(), **fields})
                + "\n"
            )

    stop = False

    def on_sigterm(*_args) -> None:
        nonlocal stop
        record("sigterm")
        stop = not args.ignore_sigterm

    signal.signal(signal.SIGTERM, on_sigterm)
    checkpoint = directory / "step"
    step = int(checkpoint.read_text()) if checkpoint.exists() else 0
    device = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    if not args.without_cuda:
        import torch

        properties = torch.cuda.get_device_properties(0)
        held = torch.empty(int(args.gib * 2**30), dtype=torch.uint8, device="cuda")
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
        device.update(
            device_count=torch.cuda.device_count(),
            name=properties.name,
            uuid=f"GPU-{properties.uuid}",
            held_bytes=held.numel(),
        )
    record("ready", step=step, **device)
    while step < args.steps and not stop:
        deadline = time.monotonic() + args.step_seconds
        while not stop and time.monotonic() < deadline:
            if not args.without_cuda:
                a = (a @ a).clamp_(-1, 1)
                torch.cuda.synchronize()
            else:
                time.sleep(0.01)
        if stop:
            break
        step += 1
        (directory / "step.tmp").write_text(str(step))
        (directory / "step.tmp").replace(checkpoint)
        (directory / "marker.tmp").touch()
        (directory / "marker.tmp").replace(directory / MARKER)
    if stop:
        record("saved", step=step)
        return 143
    record("done", step=step)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
