"""Running the local stack: the gateway app in this process, runtime processes under its LocalDriver.

Uvicorn owns SIGINT/SIGTERM: on either it stops serving, the gateway's lifespan closes the LocalDriver, and
the driver stops every runtime (SIGTERM, then SIGKILL); runtimes also die with this process (PDEATHSIG).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn
from kvpilot.gateway.app import create_app
from kvpilot.gateway.autoscale.local import LocalDriver, LocalModel
from kvpilot.gateway.config import AutoscalingSpec, GatewayConfig, PoolConfig
from kvpilot.gateway.http_server import PortInUse, bind_socket, uvicorn_config

log = logging.getLogger("kvpilot.up")


class _Server(uvicorn.Server):
    """Uvicorn re-raises a captured SIGINT/SIGTERM after shutting down, which would kill us before the
    runtimes are stopped and make a clean stop exit non-zero; here a signal only asks for the shutdown."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        try:
            yield
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)


READY_TIMEOUT_S = 300.0


def stack_config(name: str, replicas: tuple[int, int, int], autoscaling: dict[str, Any]) -> GatewayConfig:
    _, low, high = replicas
    spec = AutoscalingSpec.model_validate({**autoscaling, "minReplicas": low, "maxReplicas": high})
    return GatewayConfig(pools={name: PoolConfig(autoscaling=spec)})


def banner(name: str, base: str, replicas: int) -> str:
    question = [{"role": "user", "content": "What is the capital of France?"}]
    body = json.dumps({"model": name, "messages": question, "max_tokens": 64})
    return "\n".join(
        [
            f"kvpilot up: serving {name!r} on {replicas} replica(s)",
            f"  OpenAI base URL: {base}/v1",
            f"  curl {base}/v1/chat/completions -H 'Content-Type: application/json' -d '{body}'",
            f"  metrics: {base}/metrics    Ctrl-C stops everything",
        ]
    )


async def _bring_up(server: uvicorn.Server, driver: LocalDriver, name: str, start: int, base: str) -> None:
    """Once the gateway serves: start the replicas, wait until they pass /health, print how to call it."""
    while not server.started:
        if server.should_exit:
            return
        await asyncio.sleep(0.05)
    await driver.scale_model(name, start)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + READY_TIMEOUT_S
    while sum(r.ready for r in driver.replicas[name]) < start and loop.time() < deadline:
        if server.should_exit:
            return
        await asyncio.sleep(0.2)
    ready = sum(r.ready for r in driver.replicas[name])
    if ready < start:
        log.error("only %d of %d replicas became healthy; logs in %s", ready, start, driver.log_dir)
    print(banner(name, base, ready), flush=True)


async def serve(
    name: str,
    model_dir: Path,
    runtime_args: tuple[str, ...],
    *,
    host: str,
    port: int,
    sock: socket.socket | None = None,
    replicas: tuple[int, int, int],
    log_dir: Path,
    autoscaling: dict[str, Any],
) -> None:
    if sock is None:  # before any runtime starts: a busy port fails at once, naming --port
        sock = bind_socket(host, port)
    log_dir.mkdir(parents=True, exist_ok=True)
    driver = LocalDriver({name: LocalModel(model_dir, runtime_args)}, log_dir=log_dir)
    config = stack_config(name, replicas, autoscaling)
    app = create_app(config, driver, driver)
    server = _Server(uvicorn_config(app, config, log_level="warning", timeout_graceful_shutdown=10))
    base = f"http://{host}:{port}"
    bring_up = asyncio.create_task(_bring_up(server, driver, name, replicas[0], base))
    try:
        await server.serve(sockets=[sock])
    finally:
        bring_up.cancel()
        await driver.aclose()  # idempotent: the lifespan already closed it on a clean shutdown


def run_stack(name: str, model_dir: Path, runtime_args: tuple[str, ...], **kwargs: Any) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # health checks and scrapes every 2 s
    try:
        asyncio.run(serve(name, model_dir, runtime_args, **kwargs))
    except PortInUse as exc:
        print(f"kvpilot up: {exc}", flush=True)
        return 2
    print("kvpilot up: stopped", flush=True)
    return 0
