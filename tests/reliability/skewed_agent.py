"""`python -m tests.reliability.skewed_agent ...`: the node agent with its wall clock off by
AGENT_CLOCK_SKEW_SECONDS (time.time, and a Date header on every request it sends), for the
test that the portal orders and times everything by its own clock."""

from __future__ import annotations

import email.utils
import os
import sys
import time

from scheduler.agent.transport import PortalClient

SKEW = float(os.environ.get("AGENT_CLOCK_SKEW_SECONDS", "0"))
_real_time, _real_time_ns = time.time, time.time_ns
time.time = lambda: _real_time() + SKEW
time.time_ns = lambda: _real_time_ns() + int(SKEW * 1e9)
_post = PortalClient.post


def _post_with_date(self, path, **kwargs):
    headers = dict(kwargs.pop("headers", None) or {})
    headers["Date"] = email.utils.formatdate(time.time(), usegmt=True)
    return _post(self, path, headers=headers, **kwargs)


PortalClient.post = _post_with_date

if __name__ == "__main__":
    from scheduler.agent.__main__ import main

    sys.exit(main())
