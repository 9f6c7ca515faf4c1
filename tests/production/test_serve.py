"""`gpu-portal-server serve` (`make serve`): it migrates, collects the static files, starts the
web server, the Celery worker and beat, serves /health/ and the static files with DEBUG off,
logs JSON lines, and Ctrl-C stops every process it started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import psutil
import pytest
import requests

from tests.live import ROOT, database_url, free_port, stop, wait_for

pytestmark = pytest.mark.live


def answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False


def test_serve_starts_everything_serves_and_ctrl_c_stops_it_all(transactional_db, tmp_path):
    from django.conf import settings
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("the production server runs on PostgreSQL (CI's database)")
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "PORTAL_ADDRESS": f"127.0.0.1:{port}",
        "PORTAL_VAR_DIR": str(tmp_path / "var"),
        "SECURE_SSL_REDIRECT": "0",
        "WEB_WORKERS": "1",
        "WORKER_CONCURRENCY": "1",
    }
    env.pop("DEBUG", None)
    env.pop("SECRET_KEY", None)
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 — closed below
    server = subprocess.Popen([sys.executable, "-m", "portal.server", "serve"], cwd=ROOT, env=env,
                              stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: answers(f"{base}/health/"), timeout=90, what="/health/")
        started = psutil.Process(server.pid).children(recursive=True)
        names = " ".join(" ".join(p.cmdline()) for p in started)
        assert "portal.server web" in names and " worker" in names and " beat" in names, names
        # Collected static files, served with DEBUG off (no finders).
        plotly = (tmp_path / "var" / "static" / "vendor" / "plotly.min.js").read_bytes()
        # Larger than what the server gathers before it answers: streamed, and whole.
        served = requests.get(f"{base}/static/vendor/plotly.min.js", timeout=10)
        assert served.status_code == 200 and served.content == plotly
        # DEBUG off: an unknown page is a plain 404, not Django's debug page.
        missing = requests.get(f"{base}/no-such-page/", timeout=5)
        assert missing.status_code == 404 and "URLconf" not in missing.text
        # The key it generated is kept, private.
        assert (tmp_path / "var" / "secret-key").stat().st_mode & 0o077 == 0

        # The worker logs (structured) once it is up; on a loaded machine that comes after
        # the web server answers.
        wait_for(lambda: any(name.startswith("celery") for name in _loggers(tmp_path)),
                 timeout=90, what="the worker's first log line")  # fmt: skip

        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=30) == 0
        gone, alive = psutil.wait_procs(started, timeout=15)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        if server.poll() is None:
            server.kill()
        log.close()
    logged = _logged(tmp_path)
    loggers = {entry["logger"] for entry in logged}
    assert "uvicorn.error" in loggers, loggers
    assert any(name.startswith("celery") for name in loggers), loggers
    assert all({"time", "level", "logger", "message"} <= set(entry) for entry in logged)


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"DATABASE_URL": ""}, "DATABASE_URL=postgres://"),
        ({"REDIS_URL": ""}, "REDIS_URL=redis://"),
        ({"DATABASE_URL": "sqlite:///portal.sqlite3"}, "must be a PostgreSQL database"),
        ({"DATABASE_POOL_SIZE": "0"}, "DATABASE_POOL_SIZE must be 1 or more"),
    ],
)
def test_the_server_refuses_to_start_without_what_it_needs_and_says_what(env, says, tmp_path):
    base = {**os.environ, "DATABASE_URL": "postgres://127.0.0.1/x", "REDIS_URL": "redis://x",
            "PORTAL_VAR_DIR": str(tmp_path)}  # fmt: skip
    result = subprocess.run([sys.executable, "-m", "portal.server", "web"], cwd=ROOT,
                            env={**base, **env}, capture_output=True, text=True)  # fmt: skip
    assert result.returncode != 0 and says in result.stderr, result.stderr


def test_setup_says_which_service_does_not_answer_without_a_traceback(tmp_path):
    """Before migrating: one line naming PostgreSQL or Redis, where and why, and no password;
    not ten seconds of a pool's warnings and two tracebacks."""
    from django.conf import settings
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("the production server runs on PostgreSQL (CI's database)")
    port = free_port()  # nothing listens there
    base = {**os.environ, "PORTAL_VAR_DIR": str(tmp_path), "REDIS_URL": settings.REDIS_URL,
            "SECRET_KEY": "test-only-secret-key-0123456789-0123456789-0123456789"}  # fmt: skip
    cases = [
        ({"DATABASE_URL": f"postgres://portal:s3cret@127.0.0.1:{port}/portal"},
         f"gpu-portal-server: cannot reach PostgreSQL at DATABASE_URL "
         f"(postgres://127.0.0.1:{port}/portal): connection failed: "),
        ({"DATABASE_URL": database_url(), "REDIS_URL": f"redis://:s3cret@127.0.0.1:{port}/0"},
         f"gpu-portal-server: cannot reach Redis at REDIS_URL (redis://127.0.0.1:{port}/0): "),
    ]  # fmt: skip
    for env, says in cases:
        result = subprocess.run([sys.executable, "-m", "portal.server", "setup"], cwd=ROOT,
                                env={**base, **env}, capture_output=True, text=True,
                                timeout=60)  # fmt: skip
        assert result.returncode == 1 and result.stderr.startswith(says), result.stderr
        assert "Traceback" not in result.stderr and "s3cret" not in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_beat_alone_keeps_its_schedule_where_setup_never_ran(tmp_path):
    """`gpu-portal-server beat` as its own systemd unit, maybe on a host of its own: the state
    directory does not exist yet (`setup` makes it, with the static files, where it runs). Beat
    makes it and keeps its schedule there, instead of ending on a FileNotFoundError."""
    from django.conf import settings

    var = tmp_path / "state" / "var"
    redis_url = settings.REDIS_URL.rsplit("/", 1)[0] + "/13"  # its cycle messages go nowhere
    env = {**os.environ, "DATABASE_URL": "postgres://127.0.0.1/unused", "REDIS_URL": redis_url,
           "PORTAL_VAR_DIR": str(var),
           "SECRET_KEY": "test-only-secret-key-0123456789-0123456789-0123456789"}  # fmt: skip
    log_path = tmp_path / "beat.log"
    with open(log_path, "wb") as log:
        beat = subprocess.Popen([sys.executable, "-m", "portal.server", "beat"], cwd=ROOT,
                                env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            wait_for(lambda: beat.poll() is not None or any(var.glob("celerybeat-schedule*")),
                     timeout=60, what="beat's schedule file")  # fmt: skip
            assert beat.poll() is None, log_path.read_text(errors="replace")[-2000:]
        finally:
            stop(beat)


def _logged(tmp_path) -> list[dict]:
    lines = (tmp_path / "serve.log").read_text(errors="replace").splitlines()
    entries = []
    for line in lines:
        if line.startswith("{"):
            try:
                entries.append(json.loads(line))
            except ValueError:  # a line still being written
                continue
    return entries


def _loggers(tmp_path) -> set[str]:
    return {entry.get("logger", "") for entry in _logged(tmp_path)}


def test_the_worker_keeps_its_database_sessions_from_one_cycle_to_the_next(transactional_db,
                                                                          tmp_path):  # fmt: skip
    """The production worker (prefork, with a pool of DATABASE_POOL_SIZE connections) runs
    cycle after cycle on the PostgreSQL sessions it opened: Celery's Django fixup would close
    them (and the pool) after every task, so that each cycle opened a new session, a backend
    process whose caches start cold and whose prepared statements are gone."""
    import redis
    from django.conf import settings
    from django.db import connection

    from dashboards.models import CycleStats

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's sessions")
    redis_url = settings.REDIS_URL.rsplit("/", 1)[0] + "/12"  # this worker's messages only
    redis.Redis.from_url(redis_url).flushdb()
    env = {**os.environ, "DATABASE_URL": database_url(), "REDIS_URL": redis_url,
           "PORTAL_VAR_DIR": str(tmp_path / "var"), "CYCLE_INTERVAL_SECONDS": "0.2",
           "WORKER_CONCURRENCY": "1", "DATABASE_POOL_SIZE": "2",
           "SECRET_KEY": "test-only-secret-key-0123456789-0123456789-0123456789"}  # fmt: skip

    def cycles() -> int:
        return CycleStats.objects.filter(pk=1).values_list("runs_ok", flat=True).first() or 0

    def others(select: str) -> set[tuple]:
        """`select` over the sessions of the test database but this test's own."""
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {select} FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return set(cursor.fetchall())

    def sessions() -> set[tuple]:
        return others("pid, backend_start")

    processes = []
    try:
        for name in ("worker", "beat"):
            log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 — closed with the process
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "portal.server", name], cwd=ROOT, env=env, stdout=log,
                stderr=subprocess.STDOUT,
            ))  # fmt: skip
        wait_for(lambda: cycles() >= 3, timeout=90, what="the worker's first cycles")
        before, counted = sessions(), cycles()
        wait_for(lambda: cycles() >= counted + 10, timeout=60, what="ten more cycles")
        assert before & sessions(), (before, sessions())
        # A session cut under it (PostgreSQL restarted, an administrator's
        # pg_terminate_backend): a task may fail on it, and the next ones run on a new one.
        others("pg_terminate_backend(pid)")
        counted = cycles()
        wait_for(lambda: cycles() >= counted + 5, timeout=60, what="cycles after the cut")
    finally:
        for process in processes:
            stop(process)
