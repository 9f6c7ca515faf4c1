#!/usr/bin/env bash
# Installs what the tests need and runs pytest with the arguments given: `make test` leaves out
# the tests marked slow, `make test-slow` runs only those, no argument runs them all.
# With DATABASE_URL / REDIS_URL set it uses them; without, SQLite and the embedded Redis.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
bash scripts/install_browser.sh
bash tests/sso/provider/install.sh
if [ -z "${REDIS_URL:-}" ]; then
  .venv/bin/python scripts/embedded_redis.py start
  export REDIS_URL=$(.venv/bin/python scripts/embedded_redis.py url)
fi
mkdir -p var
set +e
.venv/bin/python -m pytest "$@"
rc=$?
set -e
# pytest exits 5 when it collected no test: that is a failure of the suite, not a pass.
exit $rc
