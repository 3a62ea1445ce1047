# syntax=docker/dockerfile:1
# kvpilot gateway: FastAPI + httpx + the Kubernetes client, no torch. Build from the repository root:
#   docker build -f docker/gateway.Dockerfile -t ghcr.io/kvpilot/gateway:0.1.0 .
FROM python:3.12-slim AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY cli/ cli/
COPY contracts/ contracts/
COPY gateway/ gateway/
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[gateway]"

FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels "kvpilot[gateway]"
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["kvpilot-gateway"]
CMD ["--kubernetes", "--port", "8080"]
