"""`make run`: the whole system in the foreground on its embedded default.

Migrates, seeds the demo data, starts the embedded Redis (unless REDIS_URL is set), then the
web server, a Celery worker and Celery beat. Ctrl-C stops them all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = str(ROOT / ".venv" / "bin" / "python")
sys.path.insert(0, str(ROOT / "scripts"))

import embedded_redis  # noqa: E402


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
                 "-s", str(ROOT / "var" / "celerybeat-schedule")],
    }  # fmt: skip
    processes = {
        name: subprocess.Popen(command, env=env, cwd=ROOT) for name, command in commands.items()
    }
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
    for process in processes.values():
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
