"""`python -m tests.reliability.slow_start_agent ...`: the node agent, slow to act on a run
order it has not seen before (AGENT_TEST_START_DELAY_SECONDS), as an agent on a loaded machine
or an order still in flight is: for the test that an attempt whose stop is ordered before it
starts never starts."""

from __future__ import annotations

import os
import sys
import time

from scheduler.agent.core import Agent

DELAY = float(os.environ.get("AGENT_TEST_START_DELAY_SECONDS", "0"))
_apply = Agent.apply


def _slow_apply(self, orders, **kwargs):
    """Sits on an answer with new run orders; first, for a test to see that they arrived, it
    writes WORK_DIR/order-<attempt> for each."""
    known = set(self.processes) | set(self.finished) | set(getattr(self, "claims", {}))
    new = [order["attempt"] for order in orders.get("run", []) if order["attempt"] not in known]
    for attempt in new:
        (self.work_dir / f"order-{attempt}").touch()
    if new:
        time.sleep(DELAY)
    _apply(self, orders, **kwargs)


Agent.apply = _slow_apply

if __name__ == "__main__":
    from scheduler.agent.__main__ import main

    sys.exit(main())
