# syntax=docker/dockerfile:1
# kvpilot operator: kopf + httpx (its own thin API client), no torch. Build from the repository root:
#   docker build -f docker/operator.Dockerfile -t ghcr.io/kvpilot/operator:0.1.0 .
FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY cli/ cli/
COPY contracts/ contracts/
COPY operator/ operator/
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[operator]"

FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels "kvpilot[operator]"
USER 65532:65532
ENTRYPOINT ["kvpilot-operator"]
CMD ["--all-namespaces"]
