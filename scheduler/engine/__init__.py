"""The scheduling engine: DESIGN §2 as pure Python. Snapshot in, plan out; no Django here."""

from scheduler.engine.planner import plan
from scheduler.engine.snapshot import (
    Allocation,
    NodeView,
    PlacedJob,
    Placement,
    Plan,
    Preemption,
    Rejection,
    RunnableJob,
    ShareView,
    Snapshot,
)

__all__ = [
    "Allocation",
    "NodeView",
    "PlacedJob",
    "Placement",
    "Plan",
    "Preemption",
    "Rejection",
    "RunnableJob",
    "ShareView",
    "Snapshot",
    "plan",
]
