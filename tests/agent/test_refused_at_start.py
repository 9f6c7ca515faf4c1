"""What the node agent and its connectors refuse at start, with exit 2 and one line rather than
a traceback, or retrying for ever what no retry mends: a portal URL that is none, a directory
they cannot make, and for the Kubernetes connector a --kubeconfig that is no file or no
credentials at all (no kubeconfig anywhere, and not in a pod). The Slurm connector's, which
need a Slurm cluster to ask, are in tests/slurm/test_connector_inventory.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from scheduler.agent.__main__ import parse as parse_agent
from scheduler.agent.__main__ import parse_kubernetes, parse_slurm


def start_kubernetes(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "scheduler.agent", "kubernetes", "--portal", "http://127.0.0.1:9",
         "--join-token", "t", "--work-dir", str(tmp_path / "work"), *args],
        env={**env, "HOME": str(tmp_path)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_kubeconfig_that_is_no_file_is_refused(tmp_path):
    missing = tmp_path / "kubeconfig"
    pytest.importorskip("kubernetes")
    started = start_kubernetes(tmp_path, "--kubeconfig", str(missing))
    assert (started.returncode, started.stderr) == (
        2, f"error: --kubeconfig {missing}: no such file\n"
    )  # fmt: skip


def test_no_credentials_at_all_are_refused(tmp_path):
    """HOME without ~/.kube/config, no KUBECONFIG, not in a pod."""
    pytest.importorskip("kubernetes")
    started = start_kubernetes(tmp_path)
    assert started.returncode == 2
    assert started.stderr.startswith("error: no Kubernetes credentials: ")
    assert started.stderr.endswith(
        "(give --kubeconfig, or run the connector in a pod with a service account)\n"
    )


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "http://host:port", "ftp://portal", "http://"])
def test_a_portal_url_that_is_none_is_refused_at_start_naming_the_flag(url, capsys):
    """By the agent and both connectors: exit 2 and one line, not a traceback."""
    for parse, extra in ((parse_agent, []), (parse_slurm, ["--partition", "gpu"]),
                         (parse_kubernetes, [])):  # fmt: skip
        with pytest.raises(SystemExit) as stopped:
            parse(["--portal", url, *extra])
        assert stopped.value.code == 2
        error = capsys.readouterr().err.strip().splitlines()[-1]
        assert error.endswith(
            f"error: argument --portal: portal URL must be http(s)://host[:port][/path], "
            f"not {url!r}"
        )
    assert parse_agent(["--portal", "https://portal.example.com/gpu"]).portal == (
        "https://portal.example.com/gpu"
    )


@pytest.mark.parametrize("flag", ["--work-dir", "--checkpoint-root"])
def test_a_directory_the_agent_cannot_make_is_refused_at_start(flag, tmp_path):
    """Exit 2 and one line naming it, not a traceback."""
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    started = subprocess.run(
        [sys.executable, "-m", "scheduler.agent", "--portal", "http://127.0.0.1:9",
         "--join-token", "t", "--fake-gpus", "1", "--gpu-type", "h100",
         "--work-dir", str(tmp_path / "work"), flag, str(blocked / "below")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert started.returncode == 2
    assert started.stderr.startswith(f"error: cannot use {blocked / 'below'}")
    assert started.stderr.endswith(": Not a directory (see --work-dir and --checkpoint-root)\n")
