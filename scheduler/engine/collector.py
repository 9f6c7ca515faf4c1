"""Python's cycle collector paused while the engine, a replay of it, or a cycle works.

A plan allocates many small objects and frees them all, and none forms a reference cycle
(scheduler/engine/tests/test_memory.py and tests/simulator/test_memory.py hold a plan and a
replay to it): reference counting frees them. Yet the collector, counting allocations, would
rescan everything alive many times over. In the worker's heap that was a third of an estimates
replay, and a fifth of a cycle that places thousands of jobs (bench/cycle.py). What a cycle's
Django code leaves in a cycle, if anything, waits only until the block ends: the collector,
back on, finds it among the youngest objects at its next pass."""

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
