"""Settings defaults and the demo seed: what a newcomer gets from a bare checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command

from scheduler.models import Node
from shares.models import QuotaShare, Team

ROOT = Path(__file__).resolve().parents[2]
SETUP = "import django; django.setup(); from django.conf import settings"


def settings_in_subprocess(code: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    clean.update(env, DJANGO_SETTINGS_MODULE="portal.settings")
    return subprocess.run(
        [sys.executable, "-c", f"{SETUP}; {code}"],
        cwd=ROOT, env=clean, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_defaults_are_sqlite_and_embedded_redis_under_var():
    result = settings_in_subprocess(
        "print(settings.DATABASES['default']['ENGINE']); print(settings.DATABASES['default']"
        "['NAME']); print(settings.REDIS_URL); print(settings.CELERY_BROKER_URL)"
    )
    assert result.returncode == 0, result.stderr
    engine, name, redis_url, broker = result.stdout.split()
    assert engine == "django.db.backends.sqlite3"
    assert name == str(ROOT / "var" / "portal.sqlite3")
    assert redis_url == f"unix://{ROOT / 'var' / 'redis.sock'}"
    assert broker == f"redis+socket://{ROOT / 'var' / 'redis.sock'}"


def test_database_and_redis_come_from_the_environment():
    result = settings_in_subprocess(
        "print(settings.DATABASES['default']['ENGINE'], settings.CELERY_BROKER_URL)",
        DATABASE_URL="postgres://u@db.example:5432/portal",
        REDIS_URL="redis://cache.example:6379/2",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "django.db.backends.postgresql",
        "redis://cache.example:6379/2",
    ]


def test_secret_key_is_required_when_debug_is_off():
    result = settings_in_subprocess("print(settings.SECRET_KEY)", DEBUG="false", SECRET_KEY="")
    assert result.returncode != 0
    assert "SECRET_KEY must be set in the environment when DEBUG is off" in result.stderr
    ok = settings_in_subprocess("print(settings.SECRET_KEY)", DEBUG="false", SECRET_KEY="s3cret")
    assert ok.returncode == 0 and ok.stdout.strip() == "s3cret"


@pytest.mark.django_db
def test_seed_demo_is_idempotent(settings, tmp_path, capsys):
    """Running seed_demo twice yields the same teams, shares and nodes, and the same password."""
    settings.VAR_DIR = tmp_path
    call_command("seed_demo")
    first = capsys.readouterr().out
    counts = (Team.objects.count(), QuotaShare.objects.count(), Node.objects.count())
    call_command("seed_demo")
    second = capsys.readouterr().out
    assert counts == (Team.objects.count(), QuotaShare.objects.count(), Node.objects.count())
    assert counts[0] == 3 and counts[1] == 3
    assert first == second and "admin /" in first
    strategies = set(QuotaShare.objects.values_list("strategy", flat=True))
    assert strategies == {"RESERVE", "LEND", "LEND_AND_BORROW"}
    assert set(Node.objects.values_list("gpu_type", flat=True)) == {"h100", "l4"}


def test_production_settings_pass_the_deploy_checks():
    """`manage.py check --deploy` is clean with DEBUG off and a secret key set."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL",)}
    env.update(DEBUG="false", SECRET_KEY="x" * 60 + "-not-a-real-key-but-long-and-random-enough")
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_the_embedded_redis_script_starts_answers_and_stops(tmp_path):
    """`make test` without REDIS_URL starts the embedded Redis with this script and reads its
    URL from it."""
    import redis

    var = tmp_path / "v"  # a unix socket's path must stay short
    env = {**os.environ, "PORTAL_VAR_DIR": str(var)}

    def script(action: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "embedded_redis.py"), action],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip

    started = script("start")
    assert started.returncode == 0, started.stderr
    try:
        url = script("url").stdout.strip()
        assert url == f"unix://{var / 'redis.sock'}"
        assert redis.Redis(unix_socket_path=str(var / "redis.sock")).ping()
    finally:
        assert script("stop").returncode == 0
