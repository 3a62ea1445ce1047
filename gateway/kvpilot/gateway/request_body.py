"""A client's request body, read with bounds and parsed without Python recursion.

Size: 413 as soon as the body is known to be larger than `maxRequestBytes` (its Content-Length, else the
bytes so far), before any parsing. Time: 408 when it has not arrived within `requestBodySeconds`. Parsing
uses pydantic-core's JSON parser (iterative, depth-limited): a body nested 100,000 deep, an integer of
thousands of digits or a lone UTF-16 surrogate is a 400, never a RecursionError or ValueError.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pydantic_core
from fastapi import Request
from kvpilot.gateway.openai_errors import InvalidRequest, PayloadTooLarge, RequestTimeout


async def read_body(request: Request, max_bytes: int, timeout_s: float) -> bytes:
    """Raises starlette's ClientDisconnect when the client leaves mid-upload (answered quietly)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(f"request body is larger than {max_bytes} bytes")
    parts: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > max_bytes:
                    raise PayloadTooLarge(f"request body is larger than {max_bytes} bytes")
                parts.append(chunk)
    except TimeoutError as exc:
        raise RequestTimeout(f"the request body did not arrive within {timeout_s:g}s") from exc
    return b"".join(parts)


def _hint(message: str) -> str:
    if "hex escape" in message or "surrogate" in message:
        return message + " (a lone UTF-16 surrogate such as \\ud800 is not a character)"
    if "recursion limit" in message:
        return message + " (the body is nested too deeply)"
    return message


def parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = pydantic_core.from_json(raw, allow_inf_nan=False)
    except ValueError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {_hint(str(exc))}") from exc
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise InvalidRequest("'model' is required and must be a string", param="model")
    return body
