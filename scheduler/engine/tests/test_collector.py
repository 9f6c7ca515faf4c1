"""The cycle collector, paused while the engine, a replay or a cycle works, is always back on
after it: a worker left without it would keep every reference cycle it ever made."""

from __future__ import annotations

import gc

import pytest

from scheduler.engine import Snapshot, plan
from scheduler.engine.collector import collector_paused


def test_the_collector_is_back_on_after_a_plan_and_after_one_that_fails():
    assert gc.isenabled()
    plan(Snapshot((), (), (), ()))
    assert gc.isenabled()
    with pytest.raises(AttributeError):
        plan(None)  # type: ignore[arg-type]
    assert gc.isenabled()


def test_a_pause_within_another_leaves_the_collector_to_the_outer_one():
    with collector_paused():
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off():
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
