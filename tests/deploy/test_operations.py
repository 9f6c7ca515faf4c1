"""Running the portal as an operator does (docs/deploy.md): its systemd units and the environment
files they read, `gpu-portal-server` when PostgreSQL or Redis does not answer, and an upgrade
from the previous release on a database with data in it."""

from __future__ import annotations

import io
import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from dashboards.models import CycleStats
from dashboards.services import cycle_record
from portal.server import main as server_main
from scheduler.agent import __main__ as agent
from scheduler.cycle.run import cycle_run
from scheduler.models import GpuAssignment, Job, JobAttempt, Node
from tests.conftest import make_node, place_a_borrower
from tests.deploy.test_odd_settings import assert_refused_in_one_line, free_port, server
from tests.live import database_url
from tests.portal.test_setup import settings_in_subprocess

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "deploy" / "systemd"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
SECRET_KEY = "test-only-secret-key-0123456789-0123456789-0123456789"


def unit_settings(path: Path) -> dict[str, list[str]]:
    """A unit file's settings, "Section.Key" -> its values in order (a key may repeat)."""
    found: dict[str, list[str]] = {}
    section = ""
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        found.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return found


def portal_units() -> dict[str, tuple[str, dict[str, list[str]]]]:
    """The portal's units by name, with the `gpu-portal-server` command each runs."""
    units = {}
    for path in sorted(UNITS.glob("gpu-portal-*.service")):
        found = unit_settings(path)
        program, command = found["Service.ExecStart"][0].split()
        assert program == "/opt/gpu-portal/bin/gpu-portal-server", path.name
        units[path.name] = (command, found)
    return units


def test_each_portal_unit_starts_after_the_services_its_command_checks():
    """`setup`, `web` and `worker` end at once when PostgreSQL or Redis does not answer yet,
    `beat` when Redis does not: on a machine that runs them, each unit is ordered after them.
    The setup unit was not ordered after Redis, so at boot it could run first and fail, and the
    web server, the worker and beat, which require it, with it."""
    units = portal_units()
    assert {command for command, _ in units.values()} == {"setup", "web", "worker", "beat"}
    for name, (command, found) in units.items():
        after = " ".join(found.get("Unit.After", [])).split()
        needed = ["redis-server.service"]
        if command != "beat":  # beat never reads the database
            needed.append("postgresql.service")
        missing = [service for service in needed if service not in after]
        assert not missing, f"{name} ({command}) is not ordered after {missing}"


def test_each_unit_runs_a_console_script_with_arguments_it_takes(monkeypatch):
    """What the units start is what `pip install` puts in the virtual environment of the
    install guide (pyproject.toml's console scripts), with arguments the command accepts."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for variable in [v for v in os.environ if v.startswith(("AGENT_", "CONNECTOR_"))]:
        monkeypatch.delenv(variable)
    monkeypatch.setenv("PORTAL_URL", "https://portal.example.org")
    for path in sorted(UNITS.glob("*.service")):
        program, *arguments = unit_settings(path)["Service.ExecStart"][0].split()
        venv, script = program.rsplit("/", 1)
        assert script in scripts, f"{path.name}: {script} is no console script of the project"
        assert venv in ("/opt/gpu-portal/bin", "/opt/gpu-agent/bin"), path.name
        if script == "gpu-portal-server":
            with pytest.raises(SystemExit) as help_shown:  # the subcommand exists
                server_main([*arguments, "--help"])
            assert help_shown.value.code == 0, path.name
        elif arguments[:1] == ["slurm"]:
            agent.parse_slurm(arguments[1:])
        elif arguments[:1] == ["kubernetes"]:
            agent.parse_kubernetes(arguments[1:])
        else:
            agent.parse(arguments)


def example_environment_files() -> list[str]:
    """The blocks of docs/deploy.md that are environment files (portal.env, agent.env)."""
    blocks = re.findall(r"```sh\n(.*?)```", DEPLOY_DOC.read_text(), flags=re.S)
    files = []
    for block in blocks:
        lines = [line for line in block.splitlines() if line.strip()]
        if all(re.match(r"#|[A-Z][A-Z0-9_]*=", line) for line in lines):
            files.append(block)
    return files


def read_as_systemd(text: str) -> dict[str, str]:
    """An EnvironmentFile= as systemd.exec(5) reads one: a line that starts with # or ; is a
    comment; an unquoted value is the rest of the line, trimmed, interior spaces and any
    `# ...` after the value included."""
    env = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;" or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        assert value[:1] not in ("'", '"'), f"quoted values are read differently: {line}"
        env[key.strip()] = re.sub(r"\\(.)", r"\1", value)
    return env


def read_as_sh(text: str, tmp_path: Path) -> dict[str, str]:
    """The same file as the install guide's `sh -c 'set -a; . portal.env; ...'` reads it."""
    path = tmp_path / "example.env"
    path.write_text(text)
    shown = subprocess.run(
        ["sh", "-c", f'set -a; . "{path}"; env -0'], env={}, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    pairs = (entry.partition("=") for entry in shown.stdout.split("\0") if entry)
    return {key: value for key, _, value in pairs if key not in ("PWD", "SHLVL", "_")}


def test_the_example_environment_files_read_the_same_to_systemd_and_to_sh(tmp_path):
    """The units read portal.env (and agent.env) as systemd reads an EnvironmentFile, and the
    guide's `manage` commands source portal.env with sh. The examples had a comment after each
    value: sh drops it, systemd keeps it in the value, so WEB_WORKERS was "2   # uvicorn
    processes: one per core", which the settings refuse, and ALLOWED_HOSTS gained a host named
    "#"."""
    files = example_environment_files()
    assert len(files) == 2, "portal.env and agent.env"
    for text in files:
        assert read_as_systemd(text) == read_as_sh(text, tmp_path)
    portal_env = read_as_systemd(files[0])
    assert "DATABASE_URL" in portal_env
    loaded = settings_in_subprocess(
        "print(settings.WEB_WORKERS, *settings.ALLOWED_HOSTS)", **portal_env
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.split() == [portal_env["WEB_WORKERS"], portal_env["ALLOWED_HOSTS"]]


@pytest.mark.parametrize("command", ["web", "worker"])
def test_web_and_worker_end_in_one_line_when_postgresql_does_not_answer(command, tmp_path):
    """The web server started and answered every request with an error; the worker logged a
    pool's warnings and a traceback for every cycle. Both end now, like `setup`, naming
    PostgreSQL, where and why, without the password (systemd starts them again)."""
    result = server(command, tmp_path, SECRET_KEY=SECRET_KEY)
    line = assert_refused_in_one_line(result, "cannot reach PostgreSQL at DATABASE_URL")
    assert "hunter2" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "connection failed" in line


def test_beat_ends_in_one_line_when_redis_does_not_answer(tmp_path):
    """Beat started and logged a connection error every few seconds, for as long as Redis was
    down. It never reads the database, so PostgreSQL is not asked (tests/production: beat on a
    host of its own, with no database at all)."""
    result = server("beat", tmp_path, SECRET_KEY=SECRET_KEY)
    assert_refused_in_one_line(result, "cannot reach Redis at REDIS_URL")
    assert "PostgreSQL" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("command", ["web", "worker"])
def test_web_and_worker_end_in_one_line_when_redis_does_not_answer(command, tmp_path, db):
    """With PostgreSQL up and Redis down, the web server started without the agents' wake-ups,
    and the worker retried the broker for minutes before it ended."""
    if connection.vendor != "postgresql":
        pytest.skip("the production server runs on PostgreSQL (CI's database)")
    port = free_port()
    result = server(command, tmp_path, SECRET_KEY=SECRET_KEY, DATABASE_URL=database_url(),
                    REDIS_URL=f"redis://:hunter2@127.0.0.1:{port}/0")  # fmt: skip
    where = f"redis://127.0.0.1:{port}/0"
    assert_refused_in_one_line(result, f"cannot reach Redis at REDIS_URL ({where})")
    assert "hunter2" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_the_migrations_match_the_models(db):
    """`makemigrations --check`: a model change without its migration would leave an upgraded
    database short of a column the code reads."""
    call_command("makemigrations", "--check", "--dry-run", stdout=io.StringIO())


# The last migrations of the release before nodes said whether they ask to start (scheduler
# 0017) and the cycle histogram moved to columns (dashboards 0002); the other apps' were as now.
PREVIOUS_RELEASE = [
    ("scheduler", "0016_job_estimated_nodes_from_allocations"),
    ("dashboards", "0001_initial"),
]


def migrate(targets) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def head() -> list[tuple[str, str]]:
    executor = MigrationExecutor(connection)
    return executor.loader.graph.leaf_nodes()


@pytest.mark.django_db(transaction=True)
def test_an_upgrade_from_the_previous_release_applies_on_a_database_with_jobs(world):
    """Every migration since the previous release applies on a database with shares, nodes,
    jobs, attempts and GPU assignments in it, keeps them, and the cycle runs on the result."""
    make_node("gpu-0")
    make_node("gpu-1")
    borrower, attempt = place_a_borrower(world)
    cycle_record(0.02, True)
    state = Job.objects.get(pk=borrower.pk).state

    def counts() -> list[int]:
        return [model.objects.count() for model in (Job, JobAttempt, GpuAssignment)]

    before = counts()
    try:
        migrate(PREVIOUS_RELEASE)
        migrate(head())
        assert counts() == before
        assert JobAttempt.objects.get(pk=attempt.pk).borrowed_gpus == 8
        assert set(Node.objects.values_list("name", "asks_to_start")) == {
            ("gpu-0", False), ("gpu-1", False)  # until their agents register again
        }  # fmt: skip
        assert CycleStats.objects.get().le_0_025 == 1
        assert not cycle_run(force=True).skipped
        assert Job.objects.get(pk=borrower.pk).state == state
    finally:
        migrate(head())
