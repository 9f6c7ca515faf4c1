"""How long a node agent takes to start a batch of job processes: the starts that one answer
of the portal grants at once (a node freeing many GPUs for one-GPU jobs), on a busy node.

An agent with fake GPUs (no portal: the run orders are handed to `Agent.start_all` directly)
starts `--processes` processes of `sleep`, one per GPU, through the launcher (setpriv), as it
does live. With `--load K`, K busy-looping processes keep the machine's CPUs busy meanwhile (the
kueue benchmark's agents share 2 cores with the portal and 15,000 job processes). Timed: from
the call until each process's log file was created (its start), the median and the last; the
median over `--runs` runs. Baseline in the same run: the same agent code with one start at a
time (a spawn pool of one thread, as the agent started them before).

    python bench/agent_starts.py [--processes 60] [--runs 5] [--load 4]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scheduler.agent import core  # noqa: E402
from scheduler.agent.gpus import fake_gpus  # noqa: E402


@contextmanager
def busy(processes: int):
    """`processes` processes that keep a CPU busy each, until the block ends."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        time.sleep(0.5)
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def one_batch(threads: int, processes: int, work: Path) -> tuple[float, float]:
    """Seconds from the call to the median and to the last process start of one batch (each
    batch its own agent and work directory)."""
    agent = core.Agent(portal="http://127.0.0.1:9", join_token="x", name="bench",
                       gpu_type="h100", gpus=fake_gpus(processes, "h100"), work_dir=work,
                       checkpoint_root=work / "checkpoints")  # fmt: skip
    if agent.pdeathsig_launcher is None:
        raise SystemExit(
            "this machine's setpriv has no --pdeathsig: the agent starts one at a time"
        )
    agent._spawner = ThreadPoolExecutor(threads, thread_name_prefix="spawn")
    orders = [
        {"attempt": i + 1, "job": i + 1, "number": 1, "command": "sleep 0.5", "env": {},
         "gpu_indices": [i], "timeout_seconds": None, "grace_seconds": 0}
        for i in range(processes)
    ]  # fmt: skip
    started = time.time()
    agent.start_all(orders)
    starts = sorted(os.stat(p.log_path).st_mtime - started for p in agent.processes.values())
    if len(starts) != processes:
        raise SystemExit(f"{processes - len(starts)} processes did not start")
    for process in agent.processes.values():
        process.popen.wait()
    agent._spawner.shutdown()
    return statistics.median(starts), starts[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=60)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--load", type=int, default=4, help="busy-looping processes meanwhile")
    args = parser.parse_args()
    print(f"{args.processes} starts at once, {os.cpu_count()} CPUs, {args.load} busy loops; "
          f"median of {args.runs} runs (each run: one batch each way, in turns)")  # fmt: skip
    figures: dict[int, list[tuple[float, float]]] = {1: [], core.SPAWN_THREADS: []}
    with tempfile.TemporaryDirectory() as tmp, busy(args.load):
        for run in range(args.runs):
            for threads in figures:
                work = Path(tmp) / f"{threads}-{run}"
                figures[threads].append(one_batch(threads, args.processes, work))
    medians = {
        threads: (
            statistics.median(m for m, _ in runs),
            statistics.median(last for _, last in runs),
        )
        for threads, runs in figures.items()
    }
    for threads, (median, last) in medians.items():
        what = "one at a time (before)" if threads == 1 else f"{threads} at a time (now)"
        print(f"  {what:>24}: median start {median * 1000:6.0f} ms, last {last * 1000:6.0f} ms")
    base, now = medians[1], medians[core.SPAWN_THREADS]
    print(f"  ratio before / now: median start {base[0] / now[0]:.2f}x, "
          f"last {base[1] / now[1]:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
