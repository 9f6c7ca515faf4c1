"""What the Kubernetes connector refuses at start, with exit 2 and one line, rather than
retrying for ever what no retry mends: a --kubeconfig that is no file, and no credentials at
all (no kubeconfig anywhere, and not in a pod)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("kubernetes")


def start(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "scheduler.agent", "kubernetes", "--portal", "http://127.0.0.1:9",
         "--join-token", "t", "--work-dir", str(tmp_path / "work"), *args],
        env={**env, "HOME": str(tmp_path)}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_a_kubeconfig_that_is_no_file_is_refused(tmp_path):
    missing = tmp_path / "kubeconfig"
    started = start(tmp_path, "--kubeconfig", str(missing))
    assert (started.returncode, started.stderr) == (
        2, f"error: --kubeconfig {missing}: no such file\n"
    )  # fmt: skip


def test_no_credentials_at_all_are_refused(tmp_path):
    """HOME without ~/.kube/config, no KUBECONFIG, not in a pod."""
    started = start(tmp_path)
    assert started.returncode == 2
    assert started.stderr.startswith("error: no Kubernetes credentials: ")
    assert started.stderr.endswith(
        "(give --kubeconfig, or run the connector in a pod with a service account)\n"
    )
