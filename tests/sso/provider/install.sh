#!/usr/bin/env bash
# Installs the test OpenID provider (tests/sso/provider: oidc-provider from npm, as locked in
# package-lock.json) for tests/sso/. Needs node >= 20 and npm; without them it says so and the
# provider's tests are skipped with that message.
set -euo pipefail
cd "$(dirname "$0")"
if ! command -v npm >/dev/null 2>&1; then
  echo "npm not found: the single sign-on tests against a real provider will be skipped" >&2
  exit 0
fi
# Once per lock file: `npm ci` starts by removing node_modules.
stamp=node_modules/.package-lock.sha256
want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
echo "$want" > "$stamp"
