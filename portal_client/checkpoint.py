"""For training scripts: tell the portal that a checkpoint was saved.

    from portal_client import checkpoint_saved
    save_my_checkpoint(os.environ["CHECKPOINT_DIR"])
    checkpoint_saved()

The node agent (or the Slurm connector) sees it within a second and reports it: a reclaim then
prefers to stop the borrower that loses the least work since its last checkpoint, and this job
loses only what it did after the call (docs/agent.md).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from scheduler.agent.protocol import CHECKPOINT_MARKER

NO_CHECKPOINT_DIR = (
    "CHECKPOINT_DIR is not set: run the job through the portal, or pass the directory"
)


def checkpoint_saved(directory: str | os.PathLike[str] | None = None) -> Path:
    """Mark the checkpoint in `directory` (default: $CHECKPOINT_DIR) complete, now: call it
    once the checkpoint's own files are written. Replaces the marker atomically, so the agent
    never reads a half-written one. Returns the marker's path."""
    where = directory if directory is not None else os.environ.get("CHECKPOINT_DIR")
    if not where:
        raise RuntimeError(NO_CHECKPOINT_DIR)
    marker = Path(where) / CHECKPOINT_MARKER
    written = marker.with_name(f"{CHECKPOINT_MARKER}.{os.getpid()}.tmp")
    written.write_text(f"{time.time():.3f}\n")
    os.replace(written, marker)
    return marker
