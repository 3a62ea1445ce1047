# syntax=docker/dockerfile:1
# kvpilot runtime: the inference engine and its OpenAI server on CUDA (torch + triton). Build from the
# repository root:
#   docker build -f docker/runtime.Dockerfile -t ghcr.io/kvpilot/runtime:0.1.0 .
# torch's PyPI wheels bring their own CUDA libraries; the CUDA base image supplies the driver hooks.
# Triton compiles its launchers at run time, so the image keeps a C compiler and the Python headers.
FROM nvidia/cuda:12.8.1-base-ubuntu24.04
ENV DEBIAN_FRONTEND=noninteractive PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PATH=/opt/venv/bin:$PATH
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.12 python3.12-venv python3.12-dev gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* \
    && python3.12 -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY cli/ cli/
COPY contracts/ contracts/
COPY runtime/ runtime/
RUN pip install --no-cache-dir ".[runtime]" && rm -rf /src
WORKDIR /
RUN useradd --uid 10001 --user-group --create-home --home-dir /home/kvpilot kvpilot
# Model downloads and Triton's kernel cache go to writable places (mount a volume there for reuse).
ENV HF_HOME=/home/kvpilot/.cache/huggingface TRITON_CACHE_DIR=/home/kvpilot/.cache/triton
USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["kvpilot-runtime"]
