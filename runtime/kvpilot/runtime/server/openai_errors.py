"""HTTP errors in OpenAI's JSON shape: {"error": {"message", "type", "param", "code"}}.

Status codes the server uses:
  400 invalid_request_error  bad JSON, wrong types, out-of-range values, prompt + max_tokens too long
  404 invalid_request_error  unknown model (code "model_not_found") or unknown route
  503 service_unavailable    model still loading, shutting down, the engine core died, or the waiting
                             queue is full (the first and last with a Retry-After header)
  500 server_error           anything unexpected; the message carries the request id
"""

from __future__ import annotations

from typing import Any

from kvpilot.runtime.errors import InvalidRequestError
from pydantic import ValidationError

RETRY_AFTER_SECONDS = 1


class APIError(Exception):
    """An error that becomes an HTTP response with OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, type="invalid_request_error", param=param, code=code)


def from_invalid_request(err: InvalidRequestError) -> APIError:
    return invalid_request(err.message, err.param)


def model_not_found(model: str) -> APIError:
    return APIError(
        404,
        f"The model `{model}` does not exist.",
        type="invalid_request_error",
        param="model",
        code="model_not_found",
    )


def route_not_found(status: int, detail: str) -> APIError:
    return APIError(status, detail, type="invalid_request_error")


def unavailable(message: str, code: str, retry_after: int | None = None) -> APIError:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return APIError(503, message, type="service_unavailable", code=code, headers=headers)


def internal_error(request_id: str) -> APIError:
    return APIError(
        500,
        f"Internal server error while handling request {request_id}; see the server log.",
        type="server_error",
        code="internal_error",
    )


def json_error_hint(message: str) -> str:
    """The JSON parser's message, plus what it means where that is not obvious."""
    if "hex escape" in message or "surrogate" in message:
        return (
            f"{message} (a \\uD800-\\uDFFF escape must be part of a surrogate pair: a lone UTF-16 "
            "surrogate is not a character)"
        )
    if "recursion limit" in message:
        return f"{message} (the body is nested too deeply)"
    if "number out of range" in message:
        return f"{message} (an integer literal is too long)"
    return message


def from_validation_error(err: ValidationError) -> APIError:
    """The first pydantic error, with its field path as `param`."""
    first = err.errors(include_url=False)[0]
    loc = ".".join(str(part) for part in first["loc"])
    if first["type"] == "json_invalid":
        return invalid_request(f"Request body is not valid JSON: {json_error_hint(first['msg'])}")
    if not loc:
        return invalid_request(f"Request body: {first['msg']}")
    return invalid_request(f"{loc}: {first['msg']}", param=str(first["loc"][0]))
