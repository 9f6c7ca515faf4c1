"""Odd settings and odd starts: a setting that is empty, malformed or out of range stops the
portal at start with one line naming the variable and the rule (never a traceback, never a
silent fallback), and `gpu-portal-server` says so before it starts anything. PostgreSQL and
Redis are never touched: their URLs point at ports nothing listens on."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.portal.test_setup import settings_in_subprocess

ROOT = Path(__file__).resolve().parents[2]
SETTINGS_ERROR = "django.core.exceptions.ImproperlyConfigured: "


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def settings_error(**env: str) -> str:
    """The one-line reason the settings refuse to load with `env`."""
    result = settings_in_subprocess("print(settings.DEBUG)", **env)
    assert result.returncode != 0, f"{env} was accepted"
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(SETTINGS_ERROR), result.stderr
    return last.removeprefix(SETTINGS_ERROR)


def server(command: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """`gpu-portal-server COMMAND` with PostgreSQL and Redis where nothing answers."""
    clean = {k: v for k, v in os.environ.items() if k not in ("DEBUG", "SECRET_KEY")}
    clean.update(
        DATABASE_URL=f"postgres://portal:hunter2@127.0.0.1:{free_port()}/portal",
        REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
        PORTAL_VAR_DIR=str(tmp_path / "var"),
        PORTAL_ADDRESS=f"127.0.0.1:{free_port()}",
    )
    clean.update(env)
    return subprocess.run(
        [sys.executable, "-m", "portal.server", command],
        cwd=ROOT, env=clean, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def assert_refused_in_one_line(result: subprocess.CompletedProcess, *words: str) -> str:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("gpu-portal-server: "), result.stderr
    for word in words:
        assert word in line, line
    return line


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("WEB_THREADS", "abc"),
        ("WEB_THREADS", "0"),
        ("DATABASE_THREADS", "-1"),
        ("CYCLE_INTERVAL_SECONDS", "-1"),
        ("CYCLE_INTERVAL_SECONDS", ""),
        ("CYCLE_INTERVAL_SECONDS", "nan"),
        ("NODE_HEARTBEAT_TIMEOUT_SECONDS", "0"),
        ("AGENT_POLL_MAX_WAIT_SECONDS", "0"),
        ("ESTIMATE_BUDGET_SECONDS", "inf"),
        ("JOB_PAGE_FOLLOW_SECONDS", "-10"),
        ("CELERY_BROKER_SOCKET_TIMEOUT_SECONDS", "soon"),
        ("SECURE_HSTS_SECONDS", "-5"),
        ("DATA_UPLOAD_MAX_MEMORY_SIZE", "1MB"),
    ],
)
def test_a_number_that_is_malformed_or_out_of_range_is_refused_naming_the_variable(name, value):
    """A timeout or an interval of 0 or less, a thread count of 0, or words where a number
    belongs stop the settings with the variable's name and its rule, instead of a bare
    ValueError or a cycle timer firing without pause."""
    reason = settings_error(**{name: value})
    assert reason.startswith(f"{name} must be "), reason
    assert repr(value) in reason


def test_a_pool_size_below_zero_is_refused():
    reason = settings_error(DATABASE_URL="postgres://u@127.0.0.1:1/db", DATABASE_POOL_SIZE="-3")
    assert reason.startswith("DATABASE_POOL_SIZE must be "), reason


@pytest.mark.parametrize(
    ("name", "value"), [("SECURE_SSL_REDIRECT", "ture"), ("DEBUG", "maybe"), ("DEBUG", "")]
)
def test_a_yes_or_no_setting_that_is_neither_is_refused(name, value):
    """SECURE_SSL_REDIRECT=ture (a typo) no longer turns the redirect to HTTPS off in silence."""
    reason = settings_error(**{name: value})
    assert reason.startswith(f"{name} must be "), reason
    assert "true" in reason and "false" in reason


def test_yes_and_no_are_read_in_their_usual_spellings():
    result = settings_in_subprocess(
        "print(settings.SECURE_SSL_REDIRECT, settings.ESTIMATES_ENABLED)",
        SECURE_SSL_REDIRECT="Yes", ESTIMATES_ENABLED="off",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "False"]


def test_log_level_is_read_in_any_case_and_an_unknown_one_is_refused():
    """LOG_LEVEL=debug was "ValueError: Unable to configure root logger"."""
    result = settings_in_subprocess("print(settings.LOGGING['root']['level'])", LOG_LEVEL="debug")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "DEBUG"
    reason = settings_error(LOG_LEVEL="verbose")
    assert reason.startswith("LOG_LEVEL must be "), reason


@pytest.mark.parametrize("url", ["nonsense", "", "postgres://portal:hunter2@db.example:abc/portal"])
def test_a_malformed_database_url_is_refused_without_showing_its_password(url):
    """It was a KeyError: 'ENGINE' or a ValueError about a port."""
    reason = settings_error(DATABASE_URL=url)
    assert reason.startswith("DATABASE_URL must be "), reason
    assert "hunter2" not in reason


@pytest.mark.parametrize(
    "url", ["", "http://cache.example:6379/0", "redis://:hunter2@cache.example:abc/0", "unix://"]
)
def test_a_malformed_redis_url_is_refused_without_showing_its_password(url):
    """It was accepted, and every task, lock and wake-up failed later."""
    reason = settings_error(REDIS_URL=url)
    assert reason.startswith("REDIS_URL must be "), reason
    assert "hunter2" not in reason


@pytest.mark.parametrize(
    ("address", "allowed"),
    [("10.1.2.3:8001", "10.1.2.3"), ("[fd00::5]:8000", "[fd00::5]"), ("0.0.0.0:8000", "0.0.0.0")],
)
def test_the_host_the_portal_listens_on_is_an_allowed_host(address, allowed):
    """`make run` with PORTAL_ADDRESS=10.1.2.3:8001 points its agents at http://10.1.2.3:8001,
    which Django refused (400) as a host not in ALLOWED_HOSTS; an IPv6 host is bracketed, as in
    the Host header, and never carries the port."""
    result = settings_in_subprocess("print(*settings.ALLOWED_HOSTS)", PORTAL_ADDRESS=address)
    assert result.returncode == 0, result.stderr
    assert allowed in result.stdout.split()
    assert "127.0.0.1" in result.stdout.split()


@pytest.mark.parametrize(
    "address", ["host:8000:extra", "localhost:99999", ":8000", "127.0.0.1:0", "[::1", "::1:8000"]
)
def test_the_server_refuses_a_malformed_address_before_starting_anything(address, tmp_path):
    """`localhost:99999` was an OverflowError traceback from uvicorn; `host:8000:extra` was
    uvicorn's "Name or service not known" about a host "host:8000"."""
    result = server("web", tmp_path, PORTAL_ADDRESS=address)
    assert_refused_in_one_line(result, "PORTAL_ADDRESS", repr(address))


def test_the_server_accepts_a_bracketed_ipv6_address(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", "from portal.address import split_address as s; "
         "print(*s('[::1]:8000'), *s('0.0.0.0:80'), *s('portal.example.org:8443'))"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["::1", "8000", "0.0.0.0", "80", "portal.example.org", "8443"]


def test_the_web_server_on_a_port_already_taken_says_so(tmp_path):
    """It was uvicorn's bare "[Errno 98] Address already in use", after loading everything."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = server("web", tmp_path, PORTAL_ADDRESS=f"127.0.0.1:{port}")
    assert_refused_in_one_line(result, "PORTAL_ADDRESS", f"127.0.0.1:{port}", "in use")


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("WEB_THREADS", "abc"),
        ("WEB_WORKERS", "0"),
        ("WEB_WORKERS", "two"),
        ("WORKER_CONCURRENCY", "0"),
        ("KEEP_ALIVE_SECONDS", "-1"),
        ("GRACEFUL_SHUTDOWN_SECONDS", "ten"),
        ("ACCESS_LOG", "maybe"),
        ("LOG_FORMAT", "JSON"),
    ],
)
def test_the_server_reports_a_settings_error_in_one_line_before_starting_anything(
    name, value, tmp_path
):
    """Each of these was a traceback (from the server, uvicorn or Django's import of the
    settings) or, for ACCESS_LOG, access logs silently off."""
    result = server("setup", tmp_path, **{name: value})
    assert_refused_in_one_line(result, name)
    assert "PostgreSQL" not in result.stderr  # refused before any service is asked


def test_the_server_refuses_a_secret_key_file_that_others_may_read(tmp_path):
    """The key signs sessions and encrypts the AWS access keys: a copy restored with mode 0644
    was used as it was."""
    var = tmp_path / "var"
    var.mkdir()
    (var / "secret-key").write_text("k" * 60)
    (var / "secret-key").chmod(0o644)
    result = server("setup", tmp_path)
    assert_refused_in_one_line(result, str(var / "secret-key"), "0644", "chmod 600")


def test_the_server_refuses_an_empty_secret_key_file(tmp_path):
    """It was "SECRET_KEY must be set in the environment" in a traceback from each process."""
    var = tmp_path / "var"
    var.mkdir()
    (var / "secret-key").write_text("\n")
    (var / "secret-key").chmod(0o600)
    result = server("setup", tmp_path)
    assert_refused_in_one_line(result, str(var / "secret-key"), "empty")


def test_the_server_generates_a_private_secret_key_once(tmp_path):
    first = server("setup", tmp_path)
    key = tmp_path / "var" / "secret-key"
    assert key.stat().st_mode & 0o077 == 0 and len(key.read_text().strip()) > 40
    kept = key.read_text()
    second = server("setup", tmp_path)
    assert key.read_text() == kept
    for result in (first, second):  # and it goes on to find PostgreSQL down
        assert_refused_in_one_line(result, "cannot reach PostgreSQL", "DATABASE_URL")
        assert "hunter2" not in result.stderr


def test_log_level_accepts_exactly_the_levels_its_message_lists():
    """The message said DEBUG, INFO, WARNING, ERROR, CRITICAL, but every name logging knows
    (NOTSET, WARN, FATAL) was accepted too: one list now makes the rule and the message."""
    for refused in ("notset", "WARN", "fatal"):
        reason = settings_error(LOG_LEVEL=refused)
        assert reason.startswith("LOG_LEVEL must be "), reason
    listed = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
    assert all(f"'{level}'" in reason for level in listed), reason
    for level in listed:
        result = settings_in_subprocess(
            "print(settings.LOGGING['root']['level'])", LOG_LEVEL=level.lower()
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == level


def test_the_settings_do_not_import_the_server_command():
    """PORTAL_ADDRESS is read by the settings and by `gpu-portal-server`; the settings imported
    the server command's module (and with it subprocess, signal, uvicorn's launcher) to parse it."""
    result = settings_in_subprocess("import sys; print('portal.server' in sys.modules)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("HISTORY_RAW_RETENTION_DAYS", "two"),
        ("HISTORY_SAMPLE_SECONDS", "0"),
        ("EMAIL_PORT", "0"),
        ("EMAIL_PORT", "99999"),
        ("EMAIL_USE_TLS", "ture"),
        ("NOTIFICATIONS_ENABLED", "ture"),
        ("NOTIFICATIONS_MAX_ATTEMPTS", "eight"),
        ("NOTIFICATIONS_RETENTION_DAYS", "-1"),
        ("OIDC_ENABLED", "ture"),
        ("OIDC_TIMEOUT", "5s"),
        ("OIDC_STATE_LIFETIME_SECONDS", "0"),
    ],
)
def test_an_apps_setting_that_is_malformed_is_refused_naming_the_variable(name, value):
    """The apps' settings (dashboards, notifications, single sign-on) were read with plain
    casts: NOTIFICATIONS_ENABLED=ture or OIDC_ENABLED=ture was silently false, EMAIL_PORT=0 or a
    retention of -1 days was accepted, HISTORY_RAW_RETENTION_DAYS=two was a bare ValueError.
    They follow the rule of the portal's own settings now."""
    reason = settings_error(**{name: value})
    assert reason.startswith(f"{name} must be "), reason
    assert repr(value) in reason


def test_the_server_reports_an_apps_malformed_setting_in_one_line(tmp_path):
    result = server("setup", tmp_path, NOTIFICATIONS_ENABLED="ture")
    line = assert_refused_in_one_line(result, "NOTIFICATIONS_ENABLED", "'ture'")
    assert "true or false" in line
    assert "PostgreSQL" not in result.stderr
