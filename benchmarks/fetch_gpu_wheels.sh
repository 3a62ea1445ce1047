#!/usr/bin/env bash
# Download, on a machine with internet, the wheels the GPU machine lacks for the HTTP server (it has no
# network; Python 3.12, torch 2.11 and httpx/h11/jinja2/tokenizers/safetensors/prometheus-client/uvloop are
# there). benchmarks/gpu_http.sh installs them from .whl/ (git-ignored; the device copy carries it).
#
#   bash benchmarks/fetch_gpu_wheels.sh
#
# The pins are the versions the CPU suite runs with (they work together); fastapi 0.165 imports
# opentelemetry-api at import time. anyio, h11, click and typing-extensions are pinned too, so the
# versions on the GPU machine cannot be too old for starlette/uvicorn/pydantic.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=(
  fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0
  typing-inspection==0.4.5 annotated-doc==0.0.7 opentelemetry-api==1.45.2 typing-extensions==4.16.0
  uvicorn==0.54.0 click==8.5.1 h11==0.16.0 anyio==4.16.0 idna==3.20
  pyzmq==27.3.0 msgspec==0.23.0
  openai==3.57.0 jiter==0.19.0 sniffio==1.3.1 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5  # the third-party load client (bench_http_burst.py --client openai)
)
mkdir -p .whl
for wheel in "${WHEELS[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "$wheel"
done
ls .whl
