"""`make run`: the whole system in the foreground on its embedded default.

Migrates, seeds the demo data, starts the embedded Redis (unless REDIS_URL is set), then the
web server, a Celery worker and Celery beat, four node agents with fake GPUs (the demo nodes)
and a small demo workload (borrowing, then a reclaim). Ctrl-C stops them all.
DEMO_WORKLOAD=0 skips the workload."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python")
# Everything the system writes (database, Redis socket, agents' work and checkpoint dirs).
VAR = Path(os.environ.get("PORTAL_VAR_DIR", ROOT / "var"))
sys.path.insert(0, str(ROOT / "scripts"))

import embedded_redis  # noqa: E402

# The demo nodes of seed_demo, each run by an agent with fake GPUs.
DEMO_NODES = [("node-h100-0", "h100", 8), ("node-h100-1", "h100", 8),
              ("node-l4-0", "l4", 4), ("node-l4-1", "l4", 4)]  # fmt: skip


def main() -> int:
    env = dict(os.environ)
    if "REDIS_URL" not in env:
        embedded_redis.start()
        env["REDIS_URL"] = embedded_redis.url()
    manage = [PYTHON, str(ROOT / "manage.py")]
    subprocess.run([*manage, "migrate", "--no-input", "-v0"], check=True, env=env, cwd=ROOT)
    subprocess.run([*manage, "seed_demo"], check=True, env=env, cwd=ROOT)
    address = env.get("PORTAL_ADDRESS", "127.0.0.1:8000")
    commands = {
        "web": [*manage, "runserver", address, "--noreload"],
        "worker": [PYTHON, "-m", "celery", "-A", "portal", "worker", "-l", "info", "-c", "2"],
        "beat": [PYTHON, "-m", "celery", "-A", "portal", "beat", "-l", "info",
                 "-s", str(VAR / "celerybeat-schedule")],
    }  # fmt: skip
    join_token = subprocess.run(
        [*manage, "agent_join_token"], check=True, env=env, cwd=ROOT, capture_output=True,
        text=True,
    ).stdout.strip()  # fmt: skip
    portal = f"http://{address}"
    for name, gpu_type, gpus in DEMO_NODES:
        commands[f"agent-{name}"] = [
            PYTHON, "-m", "scheduler.agent", "--portal", portal, "--name", name,
            "--fake-gpus", str(gpus), "--gpu-type", gpu_type, "--join-token", join_token,
            "--work-dir", str(VAR / "agents" / name),
            "--checkpoint-root", str(VAR / "checkpoints"),
        ]  # fmt: skip
    processes = {
        name: subprocess.Popen(command, env=env, cwd=ROOT) for name, command in commands.items()
    }
    one_shots = []
    if env.get("DEMO_WORKLOAD", "1") == "1":
        # Submits the demo jobs once the agents are up, then exits; not supervised.
        one_shots.append(subprocess.Popen([*manage, "demo_workload"], env=env, cwd=ROOT))
    print(f"Portal at http://{address}/admin/ — Ctrl-C stops everything.", flush=True)
    stopping = False

    def stop(*_args) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    exit_code = 0
    while not stopping:
        for name, process in processes.items():
            if process.poll() is not None:
                print(f"{name} exited with {process.returncode}; stopping the rest.", flush=True)
                exit_code = process.returncode or 1
                stopping = True
                break
        time.sleep(0.5)
    for process in [*processes.values(), *one_shots]:
        if process.poll() is None:
            process.terminate()
    for process in processes.values():
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
