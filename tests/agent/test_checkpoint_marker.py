"""The checkpoint marker a training script writes and its agent reads (docs/agent.md)."""

from __future__ import annotations

import os
import time

import pytest

from portal_client import checkpoint_saved
from portal_client.checkpoint import NO_CHECKPOINT_DIR
from scheduler.agent.core import checkpoint_saved_at


def test_a_saved_checkpoint_is_seen_once_and_a_marker_from_before_the_attempt_is_not(tmp_path):
    """The helper replaces the marker in $CHECKPOINT_DIR; the agent sees a marker written after
    the attempt started (or after the last one it reported), and only then."""
    old = checkpoint_saved(tmp_path)
    os.utime(old, (time.time() - 60, time.time() - 60))  # an earlier attempt's
    started = time.time() - 1
    assert checkpoint_saved_at(old, after=started) is None
    marker = checkpoint_saved(tmp_path)
    assert marker == old and list(tmp_path.iterdir()) == [marker]  # no temporary file left
    seen = checkpoint_saved_at(marker, after=started)
    assert seen is not None and started < seen <= time.time()
    assert checkpoint_saved_at(marker, after=seen) is None
    assert checkpoint_saved_at(tmp_path / "missing", after=0) is None


def test_the_helper_uses_checkpoint_dir_and_says_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("CHECKPOINT_DIR", str(tmp_path))
    assert checkpoint_saved().parent == tmp_path
    monkeypatch.delenv("CHECKPOINT_DIR")
    with pytest.raises(RuntimeError, match="CHECKPOINT_DIR is not set") as error:
        checkpoint_saved()
    assert str(error.value) == NO_CHECKPOINT_DIR
