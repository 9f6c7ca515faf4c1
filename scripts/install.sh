#!/usr/bin/env bash
# Creates .venv, installs the pinned requirements and the project itself (editable, for its
# console scripts: gpu-portal-server, gpu-agent, gpu-portal). Does nothing when they are in.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.requirements.sha256
want=$(cat requirements.txt pyproject.toml | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
  # (setuptools warns that an editable install is one: it is meant to be.)
  PYTHONWARNINGS=ignore .venv/bin/python -m pip install --quiet --disable-pip-version-check \
    --no-deps --no-build-isolation --editable .
  echo "$want" > "$stamp"
fi
