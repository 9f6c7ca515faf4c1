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
from concurrent.futures import ThreadPoolExecutor
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

    def lowered() -> R:
        os.setpriority(
            os.PRIO_PROCESS,
            threading.get_native_id(),
            os.getpriority(os.PRIO_PROCESS, 0) + LOWER_BY,
        )
        return fn()

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="low-priority") as pool:
        return pool.submit(lowered).result()
