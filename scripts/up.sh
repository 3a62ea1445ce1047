#!/usr/bin/env bash
# Installs kvpilot into .venv and starts the local stack (gateway + runtime replicas) on a tiny built-in model.
# Extra arguments go to `kvpilot up` (e.g. --replicas 2, -f examples/...yaml).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e ".[all]"
exec kvpilot up "$@"
