"""Reading a request body with bounds: a size cap (413 before anything is parsed) and a read deadline (408).

Without them one client could make the server buffer and parse any amount of JSON (a 10 MB body froze a
replica's event loop for seconds), or hold a connection open forever by announcing more bytes than it sends.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from kvpilot.runtime.server.openai_errors import APIError
from starlette.requests import Request

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_BODY_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class BodyLimits:
    max_bytes: int = DEFAULT_MAX_BODY_BYTES
    timeout_s: float = DEFAULT_BODY_TIMEOUT_S


def too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"Request body is larger than {limit} bytes (the server's --max-request-bytes).",
        type="invalid_request_error",
        code="request_too_large",
    )


def read_timeout(seconds: float) -> APIError:
    return APIError(
        408,
        f"The request body did not arrive within {seconds:g}s.",
        type="invalid_request_error",
        code="request_timeout",
    )


async def read_body(request: Request, limits: BodyLimits) -> bytes:
    """The whole body, or an APIError: 413 as soon as it is known to be too large (the Content-Length
    header, else the bytes received so far), 408 when it does not arrive in time. A client that goes
    away raises starlette's ClientDisconnect (answered quietly, see app.py)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limits.max_bytes:
        raise too_large(limits.max_bytes)
    try:
        async with asyncio.timeout(limits.timeout_s):
            return await _collect(request, limits.max_bytes)
    except TimeoutError as err:
        raise read_timeout(limits.timeout_s) from err


async def _collect(request: Request, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        parts.append(chunk)
    return b"".join(parts)
