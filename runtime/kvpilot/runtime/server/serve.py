"""Runs the app under uvicorn with our own signal handling, so that SIGTERM drains instead of cutting.

SIGTERM/SIGINT: /health turns 503 and new requests get 503 at once; running requests get
`grace_seconds` to finish (the rest are aborted), then uvicorn stops and the process exits 0.
A second signal skips the wait. A model that fails to load stops the server with exit code 1.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Generator

import uvicorn
from kvpilot.runtime.server.app import build_app
from kvpilot.runtime.server.engine_client import EngineClient
from kvpilot.runtime.server.engine_loop import EngineLike
from kvpilot.runtime.server.metrics import ServerMetrics

logger = logging.getLogger(__name__)
ABORTED_DRAIN_SECONDS = 5.0
EXIT_OK = 0
EXIT_LOAD_FAILED = 1


class _Server(uvicorn.Server):
    """uvicorn without its signal capture (it would re-raise SIGTERM at exit and end with -15)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class GracefulShutdown:
    def __init__(self, client: EngineClient, server: uvicorn.Server, grace_seconds: float) -> None:
        self.client = client
        self.server = server
        self.grace_seconds = grace_seconds
        self.exit_code = EXIT_OK
        self._drain: asyncio.Task[None] | None = None

    def request(self) -> None:
        """Signal handler (event loop thread). The first call drains; a second one stops now."""
        if self._drain is None:
            logger.info(
                "shutdown requested: draining %d request(s), grace %.0fs",
                self.client.num_streams,
                self.grace_seconds,
            )
            self.client.begin_drain()
            self._drain = asyncio.ensure_future(self._drain_then_exit())
        else:
            logger.info("second shutdown signal: aborting running requests now")
            self.client.abort_all()
            self.server.should_exit = True

    def load_failed(self, err: BaseException) -> None:
        logger.error("the model could not be loaded: %s", err)
        self.exit_code = EXIT_LOAD_FAILED
        self.server.should_exit = True

    async def _drain_then_exit(self) -> None:
        if not await self.client.wait_idle(self.grace_seconds):
            logger.warning("grace period over: aborting %d request(s)", self.client.num_streams)
            self.client.abort_all()
            await self.client.wait_idle(ABORTED_DRAIN_SECONDS)
        self.server.should_exit = True


async def serve(
    engine_factory: Callable[[], EngineLike],
    *,
    served_model_name: str,
    model_root: str,
    host: str,
    port: int,
    max_waiting_requests: int,
    grace_seconds: float,
    cache_config: dict[str, object],
    log_level: str = "info",
) -> int:
    """Serves until a signal (exit 0) or a load failure (exit 1); returns the exit code."""
    loop = asyncio.get_running_loop()
    metrics = ServerMetrics(served_model_name, cache_config)
    client = EngineClient(
        engine_factory,
        metrics,
        served_model_name=served_model_name,
        max_waiting_requests=max_waiting_requests,
    )
    app = build_app(client, metrics, model_root=model_root)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        lifespan="off",
        timeout_graceful_shutdown=int(ABORTED_DRAIN_SECONDS),
        access_log=False,
    )
    server = _Server(config)
    shutdown = GracefulShutdown(client, server, grace_seconds)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, shutdown.request)
    client.start(loop, on_load_failed=shutdown.load_failed)
    try:
        await server.serve()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        client.stop()
    return shutdown.exit_code
