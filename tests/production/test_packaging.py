"""The wheel, as a GPU node gets it: built from this checkout, installed into a fresh virtual
environment (its dependencies from the package index), it brings the agent and the client and
nothing of the server (no Django, no Celery), and its `gpu-agent` runs jobs for a live portal,
run outside the checkout so that nothing of the checkout is imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.models import Job
from scheduler.version import VERSION
from tests.live import JOIN_TOKEN, ROOT
from tests.reliability.common import ApiClient, job_command, wait_jobs, wait_nodes

pytestmark = pytest.mark.live

# What the agent-only install may hold besides pip: the agent's NVML bindings and the client's
# requests with its own dependencies.
AGENT_DISTRIBUTIONS = {
    "gpu-quota-portal", "nvidia-ml-py", "requests", "charset-normalizer", "idna", "urllib3",
    "certifi", "pip",
}  # fmt: skip


@pytest.fixture(scope="module")
def agent_venv(tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed, as on a GPU node."""
    where = tmp_path_factory.mktemp("node")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(where / "dist"), str(ROOT)],
        check=True, cwd=where,
    )  # fmt: skip
    (wheel,) = (where / "dist").glob("gpu_quota_portal-*.whl")
    assert wheel.name.startswith(f"gpu_quota_portal-{VERSION}-")
    subprocess.run([sys.executable, "-m", "venv", str(where / "venv")], check=True)
    subprocess.run(
        [str(where / "venv" / "bin" / "python"), "-m", "pip", "install", "-q",
         "--disable-pip-version-check", str(wheel)],
        check=True, cwd=where,
    )  # fmt: skip
    return where / "venv"


def run_in(venv: Path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], cwd=venv.parent, capture_output=True,
        text=True,
    )  # fmt: skip


def test_the_agent_install_brings_the_agent_and_the_client_and_no_server(agent_venv):
    imported = run_in(agent_venv, "import scheduler.agent.core, portal_client, json; "
                                  "print(json.dumps(scheduler.agent.core.__file__))")  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    assert str(agent_venv) in json.loads(imported.stdout), "imported from outside the venv"
    for server_package in ("django", "celery", "rest_framework", "psycopg"):
        refused = run_in(agent_venv, f"import {server_package}")
        assert "ModuleNotFoundError" in refused.stderr, server_package
    listed = subprocess.run(
        [str(agent_venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    installed = {d["name"].lower().replace("_", "-") for d in json.loads(listed.stdout)}
    assert installed <= AGENT_DISTRIBUTIONS | {"setuptools", "wheel"}, installed
    for command in (["gpu-agent"], ["gpu-portal"], ["gpu-agent", "slurm"]):
        shown = subprocess.run([str(agent_venv / "bin" / command[0]), *command[1:], "--version"],
                               capture_output=True, text=True)  # fmt: skip
        assert shown.returncode == 0 and VERSION in shown.stdout, (command, shown)


def test_the_installed_agent_runs_jobs_for_a_live_portal(agent_venv, live, world):
    system = live()
    system.start_web()
    system.start_worker()
    system.start_agent("node-wheel", 2, program=[str(agent_venv / "bin" / "gpu-agent")],
                       AGENT_JOIN_TOKEN=JOIN_TOKEN)  # fmt: skip
    wait_nodes("node-wheel")
    client = ApiClient(system.url, world.alice)
    jobs = [client.submit("research", job_command(2, 0.1), gpus=1) for _ in range(3)]
    wait_jobs(jobs, Job.State.SUCCEEDED)
    for job in Job.objects.filter(pk__in=jobs):
        assert [a.allocations[0]["node"] for a in job.attempts.all()] == ["node-wheel"]


def test_the_wheel_installs_the_documents_where_the_portal_serves_them_from(agent_venv):
    """portal.settings.DOCS_DIR of an installed portal: <prefix>/share/gpu-quota-portal/docs,
    the pages under /docs/ (and what a person on a node can read)."""
    installed = agent_venv / "share" / "gpu-quota-portal" / "docs"
    names = sorted(p.name for p in installed.glob("*.md"))
    assert names == sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    assert (installed / "agent.md").read_text() == (ROOT / "docs" / "agent.md").read_text()
