"""Python's cycle collector paused while the engine, or a replay of it, works.

A plan allocates many small objects and frees them all, and none forms a reference cycle
(scheduler/engine/tests/test_memory.py holds a plan and a simulation to it): reference counting
frees them. Yet the collector, counting allocations, would rescan everything alive many times
over: on a large snapshot, a third of a replay's time (bench/cycle.py's estimates refresh,
bench/engine.py)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cycle collector off until the block ends, and back on then if it was on before (a
    block within another leaves it to the outer one)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
