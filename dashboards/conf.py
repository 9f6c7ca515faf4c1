"""Settings of the utilization history and /metrics, read from the environment.

portal/settings.py star-imports this module, so each name here is a Django setting
(docs/dashboards.md lists them). Numbers are read with portal/env.py's readers: a malformed
value stops the portal at start, naming the variable and its rule."""

import environ

from portal.env import days, seconds

_env = environ.Env()

# history_sample takes at most one sample per this many seconds, however often it is called
# (beat calls it on this period; the scheduling cycle may call it after every cycle).
HISTORY_SAMPLE_SECONDS = seconds("HISTORY_SAMPLE_SECONDS", default=15.0)
# Beat rolls raw samples up into minutes and minutes into hours, and prunes, this often.
HISTORY_ROLLUP_SECONDS = seconds("HISTORY_ROLLUP_SECONDS", default=60.0)
# How long each resolution is kept.
HISTORY_RAW_RETENTION_DAYS = days("HISTORY_RAW_RETENTION_DAYS", default=2.0)
HISTORY_MINUTE_RETENTION_DAYS = days("HISTORY_MINUTE_RETENTION_DAYS", default=30.0)
HISTORY_HOUR_RETENTION_DAYS = days("HISTORY_HOUR_RETENTION_DAYS", default=730.0)

# /metrics answers a request that carries `Authorization: Bearer <METRICS_TOKEN>` (when set) or
# that comes from one of METRICS_ALLOWED_NETS (CIDRs; empty: no network is trusted).
METRICS_TOKEN = _env.str("METRICS_TOKEN", default="")
METRICS_ALLOWED_NETS = _env.list("METRICS_ALLOWED_NETS", default=["127.0.0.1/32", "::1/128"])
