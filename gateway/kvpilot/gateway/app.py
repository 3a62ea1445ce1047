"""The gateway's FastAPI app: `create_app(config, discovery, driver)`.

Everything the app needs is passed in or built in its lifespan (one shared httpx.AsyncClient, the pool
registry, the health checker, the autoscaler), so several apps can live in one process (tests, `kvpilot up`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from kvpilot.gateway.auth import ApiKeys, load_keys
from kvpilot.gateway.autoscale.drivers import ScaleDriver
from kvpilot.gateway.autoscale.loop import Autoscaler
from kvpilot.gateway.config import GatewayConfig
from kvpilot.gateway.discovery import Discovery, StaticDiscovery
from kvpilot.gateway.health import HealthChecker
from kvpilot.gateway.metrics import GatewayMetrics
from kvpilot.gateway.openai_errors import GatewayError, MethodNotAllowed, RouteNotFound, error_response
from kvpilot.gateway.pool import PoolRegistry
from kvpilot.gateway.proxy import GatewayState, handle, request_id_of
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)


def _http_client(config: GatewayConfig) -> httpx.AsyncClient:
    t = config.timeouts
    timeout = httpx.Timeout(
        connect=t.connect_seconds, read=t.read_seconds, write=t.write_seconds, pool=t.connect_seconds
    )
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    return httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False)


async def _supervise(name: str, coro: Any) -> None:
    try:
        await coro
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("%s stopped with an error", name)


def create_app(
    config: GatewayConfig,
    discovery: Discovery | Sequence[Discovery] | None = None,
    driver: ScaleDriver | None = None,
    metrics_registry: CollectorRegistry | None = None,
    background: Sequence[Callable[[], Awaitable[None]]] = (),
) -> FastAPI:
    """Build the gateway app.

    discovery: where endpoints come from (default: the config's static endpoints). A LocalDriver is both a
      discovery source and a driver: pass it in both places.
    driver: applies autoscaling decisions (KubernetesScaler, LocalDriver); None disables the autoscaler
      (queue depth is still exported for HPA/KEDA).
    background: coroutine functions run for the app's lifetime (e.g. LeaseElector.run).
    """
    sources = (
        [StaticDiscovery(config)]
        if discovery is None
        else (list(discovery) if isinstance(discovery, Sequence) else [discovery])
    )
    metrics = GatewayMetrics(metrics_registry)
    keys = ApiKeys(load_keys(config.api_keys_file) if config.api_keys_file else None)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        registry = PoolRegistry(config.pools, config.default_pool, config.prefix, config.limits)
        async with _http_client(config) as client:
            state = GatewayState(config, registry, client, metrics, keys)
            checker = HealthChecker(registry, client, config.health)
            app.state.gateway, app.state.checker = state, checker
            tasks = [asyncio.create_task(_supervise("health checker", checker.run()))]
            registry.on_endpoints = checker.kick
            if driver is not None:
                autoscaler = app.state.autoscaler = Autoscaler(registry, driver, config.autoscaler, metrics)
                for pool in registry.pools.values():
                    pool.on_hold = autoscaler.poke
                registry.on_new_pool = lambda pool: setattr(pool, "on_hold", autoscaler.poke)
                tasks.append(asyncio.create_task(_supervise("autoscaler", autoscaler.run())))
            tasks += [
                asyncio.create_task(_supervise(f"discovery {type(s).__name__}", s.run(registry)))
                for s in sources
            ]
            tasks += [
                asyncio.create_task(_supervise(getattr(fn, "__qualname__", "task"), fn()))
                for fn in background
            ]
            try:
                yield
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                for source in [*sources, driver]:
                    close = getattr(source, "aclose", None)
                    if close is not None:
                        await close()

    # No /docs, /redoc or /openapi.json: they would load Swagger UI from a CDN and document nothing a
    # client needs (the API is OpenAI's).
    app = FastAPI(title="kvpilot gateway", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.metrics = metrics
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    _routes(app)
    app.add_middleware(RequestIdMiddleware)
    return app


async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
    """Unknown routes and methods get OpenAI's error shape too."""
    if exc.status_code == 405:
        error: GatewayError = MethodNotAllowed(f"{request.method} is not allowed on {request.url.path}")
    elif exc.status_code == 404:
        error = RouteNotFound(f"no route {request.url.path}")
    else:
        error = GatewayError(str(exc.detail))
        error.status = exc.status_code
        error.type = "invalid_request_error" if exc.status_code < 500 else "server_error"
    response = error_response(error, request_id_of(request))
    if exc.headers:
        response.headers.update(exc.headers)
    return response


class RequestIdMiddleware:
    """Pure ASGI (no response buffering): every response carries an x-request-id."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                if "x-request-id" not in headers:
                    given = Headers(scope=scope).get("x-request-id")
                    headers["x-request-id"] = given if given and len(given) <= 128 else uuid.uuid4().hex
            await send(message)

        await self.app(scope, receive, send_with_id)


def _routes(app: FastAPI) -> None:
    def state_of(request: Request) -> GatewayState:
        return request.app.state.gateway

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await handle(state_of(request), request, "/v1/chat/completions")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await handle(state_of(request), request, "/v1/completions")

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        state, rid = state_of(request), request_id_of(request)
        try:
            state.auth.check(request.headers)
        except GatewayError as exc:
            return error_response(exc, rid)
        created = int(time.time())
        data = [
            {"id": name, "object": "model", "created": created, "owned_by": "kvpilot"}
            for name in sorted(state.registry.pools)
        ]
        return JSONResponse({"object": "list", "data": data}, headers={"x-request-id": rid})

    @app.get("/health")
    async def health(request: Request) -> Response:
        pools = {name: len(pool.ready_replicas()) for name, pool in state_of(request).registry.pools.items()}
        return JSONResponse(
            {"status": "ok", "readyReplicas": pools}, headers={"x-request-id": request_id_of(request)}
        )

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        state = state_of(request)
        _refresh_gauges(state)
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _refresh_gauges(state: GatewayState) -> None:
    m = state.metrics
    for name, pool in state.registry.pools.items():
        m.held.labels(name).set(pool.held)
        m.queued.labels(name).set(pool.waiting)
        m.ready_replicas.labels(name).set(len(pool.ready_replicas()))
        m.queue_depth.labels(name).set(pool.queue_depth(state.config.autoscaler.count_running))
        for url, replica in pool.replicas.items():
            m.inflight.labels(name, url).set(replica.inflight)
