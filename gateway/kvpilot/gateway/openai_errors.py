"""Errors in OpenAI's JSON shape, and the exceptions the gateway raises at its edges."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse


class GatewayError(Exception):
    """An error the client sees as an OpenAI-shaped JSON body with `status` (and maybe Retry-After)."""

    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(self, message: str, retry_after: int | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after
        self.param = param


class InvalidRequest(GatewayError):
    status, type = 400, "invalid_request_error"


class RequestTimeout(GatewayError):
    status, type, code = 408, "invalid_request_error", "request_timeout"


class PayloadTooLarge(GatewayError):
    status, type, code = 413, "invalid_request_error", "request_too_large"


class RouteNotFound(GatewayError):
    status, type = 404, "invalid_request_error"


class MethodNotAllowed(GatewayError):
    status, type = 405, "invalid_request_error"


class Unauthorized(GatewayError):
    status, type, code = 401, "invalid_request_error", "invalid_api_key"


class ModelNotFound(GatewayError):
    status, type, code = 404, "invalid_request_error", "model_not_found"


class Overloaded(GatewayError):
    status, type, code = 429, "rate_limit_error", "pool_overloaded"


class NoReplica(GatewayError):
    status, type, code = 503, "server_error", "no_ready_replica"


class UpstreamFailed(GatewayError):
    status, type, code = 502, "server_error", "upstream_failed"


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(exc: GatewayError, request_id: str | None = None) -> JSONResponse:
    headers = {"retry-after": str(exc.retry_after)} if exc.retry_after is not None else {}
    if request_id:
        headers["x-request-id"] = request_id
    body = error_body(exc.message, exc.type, exc.code, exc.param)
    return JSONResponse(body, status_code=exc.status, headers=headers)
