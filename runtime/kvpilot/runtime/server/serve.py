"""Runs the HTTP process: uvicorn with our own signal handling, plus the engine-core process it supervises.

Two processes serve a model. This one (FastAPI, tokenization, detokenization, SSE; no torch) starts
the engine-core process (kvpilot.runtime.engine_core: scheduler, KV cache, model runner) and talks to
it over ZeroMQ. Exit codes:
  0  stopped by a signal: SIGTERM/SIGINT turn /health 503 and new requests get 503 at once; running
     requests get `grace_seconds` to finish (the rest are aborted), then the core is shut down. A
     second signal skips the wait.
  1  the model could not be loaded (the reason is logged; the core's traceback precedes it).
  2  the port is already in use (the message says so and names --port).
  3  the engine-core process died while serving: /health turns 503, requests in flight end with an
     OpenAI error (an SSE error event when streaming), new ones get 503, and the server exits
     within about a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable, Generator
from typing import Any

import uvicorn
from kvpilot.contracts.http_serving import PortInUse, header_timeout_protocol
from kvpilot.contracts.http_serving import bind_socket as bind_listening_socket
from kvpilot.runtime.engine_core.client import EngineCoreSpec
from kvpilot.runtime.server.app import build_app
from kvpilot.runtime.server.engine_client import EngineClient
from kvpilot.runtime.server.metrics import ServerMetrics
from kvpilot.runtime.server.request_body import BodyLimits

logger = logging.getLogger(__name__)
ABORTED_DRAIN_SECONDS = 5.0
CORE_DIED_EXIT_DELAY_S = 1.0  # keep answering 503 this long after the core died (probes see why)
EXIT_OK = 0
EXIT_LOAD_FAILED = 1
EXIT_PORT_IN_USE = 2
EXIT_ENGINE_DIED = 3
HEADER_TIMEOUT_S = 30.0  # a connection that has not sent a whole request head by then is closed


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket, inheritable by the engine-core process this server starts."""
    sock = bind_listening_socket(host, port)
    sock.set_inheritable(True)
    return sock


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

    def load_failed(self, reason: str) -> None:
        logger.error("the model could not be loaded: %s", reason)
        self.exit_code = EXIT_LOAD_FAILED
        self.server.should_exit = True

    def core_died(self, code: int) -> None:
        logger.error("the engine core process died (exit code %d): exiting with %d", code, EXIT_ENGINE_DIED)
        self.exit_code = EXIT_ENGINE_DIED
        self._drain = asyncio.ensure_future(self._exit_after_failure())

    async def _drain_then_exit(self) -> None:
        if not await self.client.wait_idle(self.grace_seconds):
            logger.warning("grace period over: aborting %d request(s)", self.client.num_streams)
            self.client.abort_all()
            await self.client.wait_idle(ABORTED_DRAIN_SECONDS)
        self.server.should_exit = True

    async def _exit_after_failure(self) -> None:
        """The streams already failed: let their error events go out, then stop."""
        await asyncio.gather(
            self.client.wait_idle(ABORTED_DRAIN_SECONDS), asyncio.sleep(CORE_DIED_EXIT_DELAY_S)
        )
        self.server.should_exit = True


class RuntimeServer:
    """The app, its engine client and uvicorn, wired together (serve() runs one, tests one per thread)."""

    def __init__(
        self,
        core: EngineCoreSpec,
        tokenizer_factory: Callable[[], Any],
        *,
        served_model_name: str,
        model_root: str | None,
        host: str = "127.0.0.1",
        port: int = 8000,
        max_waiting_requests: int = 256,
        grace_seconds: float = 30.0,
        cache_config: dict[str, object] | None = None,
        log_level: str = "info",
        body_limits: BodyLimits | None = None,
    ) -> None:
        self.host, self.port = host, port
        self.metrics = ServerMetrics(served_model_name, cache_config or {})
        self.client = EngineClient(
            core,
            tokenizer_factory,
            self.metrics,
            served_model_name=served_model_name,
            max_waiting_requests=max_waiting_requests,
            log_level=log_level,
        )
        self.app = build_app(self.client, self.metrics, model_root=model_root, limits=body_limits)
        config = uvicorn.Config(
            self.app,
            host=host,
            port=port,
            log_level=log_level,
            lifespan="off",
            timeout_graceful_shutdown=int(ABORTED_DRAIN_SECONDS),
            access_log=False,
            http=header_timeout_protocol(HEADER_TIMEOUT_S),
        )
        self.server = _Server(config)
        self.shutdown = GracefulShutdown(self.client, self.server, grace_seconds)

    async def run(self, *, sockets: list[socket.socket] | None = None, handle_signals: bool = True) -> int:
        """Serves until a signal, a load failure or the core's death; returns the exit code."""
        if sockets is None:
            try:
                sockets = [bind_socket(self.host, self.port)]
            except PortInUse as err:
                logger.error("%s", err)
                return EXIT_PORT_IN_USE
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT) if handle_signals else ()
        for sig in signals:
            loop.add_signal_handler(sig, self.shutdown.request)
        try:
            self.client.start(on_load_failed=self.shutdown.load_failed, on_core_died=self.shutdown.core_died)
            await self.server.serve(sockets=sockets)
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)
            await self.client.stop()
            self.app.state.serving.worker.close()
        return self.shutdown.exit_code


async def serve(
    core: EngineCoreSpec,
    tokenizer_factory: Callable[[], Any],
    *,
    served_model_name: str,
    model_root: str,
    host: str,
    port: int,
    max_waiting_requests: int,
    grace_seconds: float,
    cache_config: dict[str, object],
    log_level: str = "info",
    body_limits: BodyLimits | None = None,
) -> int:
    """Serves until a signal (exit 0), a load failure (1) or the engine core's death (3)."""
    runtime = RuntimeServer(
        core,
        tokenizer_factory,
        served_model_name=served_model_name,
        model_root=model_root,
        host=host,
        port=port,
        max_waiting_requests=max_waiting_requests,
        grace_seconds=grace_seconds,
        cache_config=cache_config,
        log_level=log_level,
        body_limits=body_limits,
    )
    return await runtime.run()
