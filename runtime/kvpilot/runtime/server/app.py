"""The FastAPI app: OpenAI routes, /health, /v1/models, /metrics. The engine comes in through `client`."""

from __future__ import annotations

import time

from fastapi import FastAPI
from kvpilot.runtime.server.engine_client import EngineClient, ServerState
from kvpilot.runtime.server.metrics import ServerMetrics
from kvpilot.runtime.server.middleware import RequestIdMiddleware
from kvpilot.runtime.server.openai_errors import APIError, route_not_found, unavailable
from kvpilot.runtime.server.request_body import BodyLimits
from kvpilot.runtime.server.serving import CLIENT_CLOSED_STATUS, OpenAIServing
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

HEALTH_REASONS = {
    ServerState.LOADING: ("The model is still loading.", "model_loading"),
    ServerState.DRAINING: ("The server is shutting down.", "shutting_down"),
    ServerState.FAILED: ("The engine is not running; the server is exiting.", "engine_dead"),
}


def build_app(
    client: EngineClient,
    metrics: ServerMetrics,
    *,
    model_root: str | None = None,
    limits: BodyLimits | None = None,
) -> FastAPI:
    app = FastAPI(title="kvpilot runtime", docs_url=None, redoc_url=None, openapi_url=None)
    serving = app.state.serving = OpenAIServing(client, limits)
    created = int(time.time())

    @app.exception_handler(ClientDisconnect)
    async def client_gone(_: Request, __: ClientDisconnect) -> Response:
        # The client left while sending its body: nobody reads the answer, and nothing went wrong here.
        return Response(status_code=CLIENT_CLOSED_STATUS)

    @app.exception_handler(APIError)
    async def api_error(_: Request, err: APIError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, err: StarletteHTTPException) -> JSONResponse:
        body = route_not_found(err.status_code, str(err.detail)).body()
        return JSONResponse(body, status_code=err.status_code)

    @app.get("/health")
    async def health() -> Response:
        if client.state is ServerState.READY:
            return JSONResponse({"status": "ok"})
        err = unavailable(*HEALTH_REASONS[client.state])
        return JSONResponse(err.body(), status_code=503)

    @app.get("/v1/models")
    async def models() -> Response:
        card = {
            "id": client.served_model_name,
            "object": "model",
            "created": created,
            "owned_by": "kvpilot",
            "root": model_root or client.served_model_name,
            "max_model_len": client.max_model_len,
        }
        return JSONResponse({"object": "list", "data": [card]})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await serving.completions(request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await serving.chat(request)

    app.add_middleware(RequestIdMiddleware)
    return app
