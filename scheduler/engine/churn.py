"""The churn breaker (docs/semantics.md): a job preempted too often is held off borrowed GPUs.

A job preempted `limit` times within `window` seconds is not placed on borrowed GPUs again
until the window has passed since the earliest of those preemptions: within its share's limit
it still runs, and there no reclaim can take it. The production cycle, the simulator, the
metrics and the pages all ask this one function.
"""

from __future__ import annotations

from collections.abc import Sequence


def held_off_until(
    preempted_at: Sequence[float], now: float, limit: int, window: float
) -> float | None:
    """When the job may borrow again, if it is held off at `now`; None: it is not."""
    if limit <= 0 or len(preempted_at) < limit:
        return None
    recent = sorted(preempted_at)[-limit]  # the earliest of the latest `limit` preemptions
    until = recent + window
    return until if until > now else None


def preemptions_within(preempted_at: Sequence[float], now: float, window: float) -> int:
    """How many of the preemptions happened within the window before `now`."""
    return sum(1 for at in preempted_at if now - window < at <= now)
