"""`gpu-agent` (or `python -m scheduler.agent`): run the node agent. See docs/agent.md."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
from pathlib import Path

from scheduler.agent.core import Agent
from scheduler.agent.gpus import DiscoveryError, fake_gpus, nvml_gpus
from scheduler.version import VERSION


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="gpu-agent", description="Run jobs of the GPU portal on this node."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {VERSION}")
    parser.add_argument(
        "--portal",
        default=env("PORTAL_URL", "http://127.0.0.1:8000"),
        help="portal base URL (PORTAL_URL)",
    )
    parser.add_argument(
        "--join-token",
        default=env("AGENT_JOIN_TOKEN", ""),
        help="the cluster's join token, from the admin (AGENT_JOIN_TOKEN)",
    )
    parser.add_argument(
        "--name",
        default=env("AGENT_NAME", socket.gethostname()),
        help="node name (AGENT_NAME; default: host name)",
    )
    parser.add_argument(
        "--fake-gpus",
        type=int,
        default=int(env("AGENT_FAKE_GPUS", "0")),
        help="pretend to have N GPUs instead of asking NVML (AGENT_FAKE_GPUS)",
    )
    parser.add_argument(
        "--gpu-type",
        default=env("AGENT_GPU_TYPE", ""),
        help="GPU type of the fake GPUs, or to override NVML's (AGENT_GPU_TYPE)",
    )
    parser.add_argument(
        "--work-dir",
        default=env("AGENT_WORK_DIR", ""),
        help="logs and state (AGENT_WORK_DIR; default ~/.gpu-agent/NAME)",
    )
    parser.add_argument(
        "--checkpoint-root",
        default=env("AGENT_CHECKPOINT_ROOT", ""),
        help="CHECKPOINT_DIR of job J is ROOT/job-J; share it between nodes so a "
        "job resumes anywhere (AGENT_CHECKPOINT_ROOT; default WORK_DIR/checkpoints)",
    )
    parser.add_argument(
        "--poll-wait",
        type=float,
        default=float(env("AGENT_POLL_WAIT", "10")),
        help="seconds a long poll may wait for orders (AGENT_POLL_WAIT)",
    )
    parser.add_argument("--log-level", default=env("AGENT_LOG_LEVEL", "INFO"))
    return parser.parse_args(argv)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logging.basicConfig(
        level=args.log_level,
        format=f"%(asctime)s %(levelname)s agent[{args.name}]: %(message)s",
    )
    if not args.join_token:
        print("error: --join-token (or AGENT_JOIN_TOKEN) is required; the admin shows it "
              "under Cluster settings.", file=sys.stderr)  # fmt: skip
        return 2
    if args.fake_gpus:
        if not args.gpu_type:
            print("error: --fake-gpus needs --gpu-type (e.g. h100).", file=sys.stderr)
            return 2
        gpus, gpu_type = fake_gpus(args.fake_gpus, args.gpu_type), args.gpu_type
    else:
        try:
            gpus, gpu_type = nvml_gpus()
        except DiscoveryError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
        gpu_type = args.gpu_type or gpu_type
    work_dir = Path(args.work_dir or Path.home() / ".gpu-agent" / args.name)
    agent = Agent(
        portal=args.portal,
        join_token=args.join_token,
        name=args.name,
        gpu_type=gpu_type,
        gpus=gpus,
        work_dir=work_dir,
        checkpoint_root=Path(args.checkpoint_root or work_dir / "checkpoints"),
        poll_wait=args.poll_wait,
    )

    def stop(*_args) -> None:
        agent.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    agent.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
