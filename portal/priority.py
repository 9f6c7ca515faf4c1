"""Work that can wait, at a lower CPU priority than the rest of its process.

On a busy machine the scheduling cycle and the requests must not wait for work that only keeps
a display fresh (the estimated starts): `at_low_priority(fn)` runs `fn` on a thread of its own
whose nice value is LOWER_BY above its process's, so it gets the CPU the others leave. Linux
gives each thread its own nice value; elsewhere `fn` runs as it would anyway."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

R = TypeVar("R")

# Nice 10 above the process: under Linux's scheduler about a tenth of the CPU of a thread at the
# process's own priority, when both want it; all of it when nothing else does.
LOWER_BY = 10


def at_low_priority(fn: Callable[[], R]) -> R:
    """`fn()` on a thread of its own at LOWER_BY less priority (Linux), here elsewhere; returns
    what it returns and raises what it raises. `fn` must not need this thread's state (a
    database connection, context variables): it runs on another thread."""
    if not sys.platform.startswith("linux"):
        return fn()
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            thread = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, thread, os.getpriority(os.PRIO_PROCESS, 0) + LOWER_BY)
            outcome["value"] = fn()
        except BaseException as error:  # noqa: BLE001 — handed to the caller
            outcome["error"] = error

    worker = threading.Thread(target=run, name="low-priority")
    worker.start()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]
