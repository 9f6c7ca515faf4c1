#!/usr/bin/env bash
# Installs Debian's Chromium for the browser tests (Playwright drives /usr/bin/chromium; it never
# downloads a browser of its own). Does nothing when /usr/bin/chromium is already there; needs
# root (CI runs as root). Without root or apt it says so and leaves the browser tests to skip.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "install_browser: /usr/bin/chromium is missing and cannot be installed here" \
       "(needs root and apt-get); the browser tests will be skipped." >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
