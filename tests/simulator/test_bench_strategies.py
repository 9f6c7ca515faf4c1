"""bench/strategies.py reads utilization while work waits from a result: on hand-computed runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from tests.simulator.helpers import events_of, h100_job, run, share, two_nodes

_PATH = Path(__file__).resolve().parents[2] / "bench" / "strategies.py"
_SPEC = importlib.util.spec_from_file_location("bench_strategies", _PATH)
strategies = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = strategies  # its dataclass looks its module up
_path = list(sys.path)
_SPEC.loader.exec_module(strategies)
sys.path[:] = _path  # the script puts bench/ first, where engine.py and api.py would shadow


def utilization_while_waiting(data: dict) -> float:
    return strategies.utilization_while_waiting(data, run(data), data["jobs"])


def test_gpus_idle_while_a_job_waits_count_against_it():
    """A RESERVE share of 8 of the 16 GPUs runs 8 GPUs from 0 to 100; its 4-GPU job submitted at
    10 waits for them until 100 while 8 GPUs stay idle: 8 of 16 held while work waits."""
    data = two_nodes(
        share("team", "RESERVE", 8),
        jobs=[h100_job("a", "team", 8, 0, 100), h100_job("b", "team", 4, 10, 50)],
    )
    assert utilization_while_waiting(data) == pytest.approx(0.5)


def test_a_preempted_job_holds_its_gpus_for_the_grace_period_then_waits_again():
    """b0 and b1 (borrowing the owner's 8 GPUs) run from 0 on one node each. The owner's 4-GPU
    job arrives at 100 and waits while b1 stops (grace 30): 16 of 16 held. From 130 b1 waits
    again (for a node with 8 free GPUs, and for lendable ones) while b0 and o1 hold 12 of 16,
    until o1 ends at 630."""
    data = two_nodes(
        share("owner", "LEND", grace_seconds=30),
        share("borrower", "LEND_AND_BORROW", grace_seconds=30),
        jobs=[
            h100_job("b0", "borrower", 8, 0, 5000),
            h100_job("b1", "borrower", 8, 0, 1000),
            h100_job("o1", "owner", 4, 100, 500),
        ],
    )
    assert events_of(run(data))[:5] == [
        (0, "b0", "start"),
        (0, "b1", "start"),
        (100, "b1", "preempt"),
        (130, "o1", "start"),
        (630, "o1", "finish"),
    ]
    assert utilization_while_waiting(data) == pytest.approx((16 * 30 + 12 * 500) / (16 * 530))


def test_skewed_traces_have_a_mostly_idle_team_and_one_always_over_its_quota():
    """bench/strategies.py's traces: each team asks for what its profile says, as a multiple of
    its quota over the trace, and no job is larger than its team's quota (under RESERVE it could
    never run); the same seed gives the same trace."""
    from gen_trace import SKEWED_PROFILES, generate_skewed, skewed_quotas, team_names

    horizon = 7 * 86400
    rows = generate_skewed(1500, 5, seed=3, horizon=horizon)
    assert rows == generate_skewed(1500, 5, seed=3, horizon=horizon)
    quotas = dict(zip(team_names(5), skewed_quotas(5, 3, 256), strict=True))
    asked = {name: 0.0 for name in quotas}
    for row in rows:
        assert row["gpus"] <= quotas[row["share"]]
        asked[row["share"]] += row["gpus"] * row["duration"]
    for (name, quota), (_, low, high) in zip(quotas.items(), SKEWED_PROFILES, strict=True):
        # Durations are whole seconds of at least a minute: a little above what was drawn.
        assert low * 0.95 <= asked[name] / (quota * horizon) <= high * 1.1, name


@pytest.mark.parametrize(("interval", "again"), [(None, 100), (40, 20)])
def test_a_preemption_loses_its_grace_period_and_the_work_since_its_last_checkpoint(
    interval, again
):
    """b1 (8 GPUs, borrowing) runs from 0; the owner reclaims at 100 (grace 30). It lost its
    8 GPUs' grace period and, without checkpoints, its 100 s of work; saving every 40 s, the
    20 s since its checkpoint at 80."""
    saves = {} if interval is None else {"checkpoint_interval": interval}
    data = two_nodes(
        share("owner", "LEND", grace_seconds=30),
        share("borrower", "LEND_AND_BORROW", grace_seconds=30),
        jobs=[
            h100_job("b0", "borrower", 8, 0, 5000),
            h100_job("b1", "borrower", 8, 0, 1000, **saves),
            h100_job("o1", "owner", 4, 100, 500),
        ],
    )
    result = run(data)
    assert strategies.losses(data, result, data["jobs"]) == [
        strategies.Loss(
            grace=8 * 30, again=8 * again, checkpoints=interval is not None, gpus=8, ran=100
        )
    ]
    # What the loss counts is what the simulator's GPU-hours held and finished work leave over.
    work = sum(job["gpus"] * job["duration"] for job in data["jobs"])
    assert result["cluster"]["gpu_hours_used"] * 3600 - work == pytest.approx(8 * 30 + 8 * again)
