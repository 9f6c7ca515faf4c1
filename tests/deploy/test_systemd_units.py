"""The systemd units shipped in deploy/systemd/ are valid: `systemd-analyze verify` finds no
error and no warning in them (an unknown key or a bad value is only a warning to systemd, and a
unit that silently ignores a setting is a broken unit). Their programs are pointed at this
checkout's console scripts, since the units name where the install guide puts them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
INSTALLED = {"/opt/gpu-portal/bin/": "gpu-portal-server", "/opt/gpu-agent/bin/": "gpu-agent"}


def test_the_shipped_units_verify_without_a_warning(tmp_path):
    verify = shutil.which("systemd-analyze")
    if verify is None:
        pytest.skip("systemd-analyze is not installed here")
    scripts = Path(sys.executable).parent
    units = sorted(UNITS.glob("*.service"))
    assert {u.name for u in units} >= {"gpu-portal-web.service", "gpu-portal-worker.service",
                                       "gpu-portal-beat.service", "gpu-agent.service"}  # fmt: skip
    for unit in units:
        text = unit.read_text()
        for prefix, script in INSTALLED.items():
            assert (scripts / script).exists(), f"{script}: run make install"
            text = text.replace(prefix, f"{scripts}/")
        (tmp_path / unit.name).write_text(text)
    result = subprocess.run(
        [verify, "verify", *(str(tmp_path / u.name) for u in units)],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr
