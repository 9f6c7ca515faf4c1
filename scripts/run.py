"""`make run`: the whole system in the foreground on its embedded default.

Migrates, seeds the demo data, starts the embedded Redis (unless REDIS_URL is set), then the
web server, a Celery worker and Celery beat, four node agents with fake GPUs (the demo nodes)
and a small demo workload (borrowing, then a reclaim); the agents start once the web server
answers. Ctrl-C stops them all, the embedded Redis included.
DEMO_WORKLOAD=0 skips the workload."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python")
# Everything the system writes (database, Redis socket, agents' work and checkpoint dirs).
VAR = Path(os.environ.get("PORTAL_VAR_DIR", ROOT / "var"))
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))

import embedded_redis  # noqa: E402

from portal.server import (  # noqa: E402
    DEFAULT_ADDRESS,
    load_settings,
    stop_in_reverse,
    supervise,
    wait_until_answering,
)

# The demo nodes of seed_demo, each run by an agent with fake GPUs.
DEMO_NODES = [("node-h100-0", "h100", 8), ("node-h100-1", "h100", 8),
              ("node-l4-0", "l4", 4), ("node-l4-1", "l4", 4)]  # fmt: skip


def interrupted(*_args) -> None:
    raise KeyboardInterrupt


def main() -> int:
    # Until supervision begins, Ctrl-C or SIGTERM (even where SIGINT came in ignored, as in a
    # script's background job) stops what was started so far.
    signal.signal(signal.SIGINT, interrupted)
    signal.signal(signal.SIGTERM, interrupted)
    env = dict(os.environ)
    # A setting that breaks its rule is one line here, not a traceback from migrate.
    load_settings(env, prog="make run")
    processes: dict[str, subprocess.Popen] = {}
    manage = [PYTHON, str(ROOT / "manage.py")]
    try:
        if "REDIS_URL" not in env:
            if not embedded_redis.running():  # one left by `make test` is used, and left running
                VAR.mkdir(parents=True, exist_ok=True)
                # In the foreground, as one of the processes that Ctrl-C stops.
                processes["redis"] = subprocess.Popen(embedded_redis.command(daemonize=False))
                embedded_redis.wait_until_running()
            env["REDIS_URL"] = embedded_redis.url()
        subprocess.run([*manage, "migrate", "--no-input", "-v0"], check=True, env=env, cwd=ROOT)
        subprocess.run([*manage, "seed_demo"], check=True, env=env, cwd=ROOT)
        join_token = subprocess.run(
            [*manage, "agent_join_token"], check=True, env=env, cwd=ROOT, capture_output=True,
            text=True,
        ).stdout.strip()  # fmt: skip
    except (subprocess.CalledProcessError, KeyboardInterrupt):
        stop_in_reverse(processes.values())
        return 1
    address = env.get("PORTAL_ADDRESS", DEFAULT_ADDRESS)
    commands = {
        "web": [*manage, "runserver", address, "--noreload"],
        "worker": [PYTHON, "-m", "celery", "-A", "portal", "worker", "-l", "info", "-c", "2"],
        "beat": [PYTHON, "-m", "celery", "-A", "portal", "beat", "-l", "info",
                 "-s", str(VAR / "celerybeat-schedule")],
    }  # fmt: skip
    for name, command in commands.items():
        processes[name] = subprocess.Popen(command, env=env, cwd=ROOT)
    portal = f"http://{address}"
    # The agents start once the web server answers: before, they would only log that the
    # portal is unreachable.
    try:
        answering = wait_until_answering(f"{portal}/health/", timeout=120)
    except KeyboardInterrupt:
        answering = False
    if not answering:
        print("the web server did not answer; stopping.", flush=True)
        stop_in_reverse(processes.values())
        return 1
    for name, gpu_type, gpus in DEMO_NODES:
        processes[f"agent-{name}"] = subprocess.Popen(
            [PYTHON, "-m", "scheduler.agent", "--portal", portal, "--name", name,
             "--fake-gpus", str(gpus), "--gpu-type", gpu_type, f"--join-token={join_token}",
             "--work-dir", str(VAR / "agents" / name),
             "--checkpoint-root", str(VAR / "checkpoints")],
            env=env, cwd=ROOT,
        )  # fmt: skip
    one_shots = []
    if env.get("DEMO_WORKLOAD", "1") == "1":
        # Submits the demo jobs once the agents are up, then exits; not supervised.
        one_shots.append(subprocess.Popen([*manage, "demo_workload"], env=env, cwd=ROOT))
    print(f"Portal at {portal}/admin/ (the login is above) — Ctrl-C stops everything.",
          flush=True)  # fmt: skip
    exit_code = supervise(processes)
    stop_in_reverse(one_shots)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
