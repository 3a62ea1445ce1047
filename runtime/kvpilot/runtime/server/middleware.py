"""Request ids and the last-resort error boundary, as plain ASGI (streaming and disconnects pass through).

Every response carries `x-request-id` (the client's own, when it sent a sane one). An exception that
escapes a handler becomes a 500 in OpenAI's error shape naming that id, and is logged with it.
"""

from __future__ import annotations

import json
import logging
import re
import uuid

from kvpilot.runtime.server.openai_errors import internal_error
from starlette.types import ASGIApp, Message, Receive, Scope, Send

logger = logging.getLogger(__name__)
REQUEST_ID_KEY = "kvpilot.request_id"
HEADER = b"x-request-id"
_SANE_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def pick_request_id(headers: list[tuple[bytes, bytes]]) -> str:
    for name, value in headers:
        if name.lower() == HEADER:
            candidate = value.decode("latin-1")
            if _SANE_ID.match(candidate):
                return candidate
    return uuid.uuid4().hex


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = pick_request_id(scope.get("headers", []))
        scope[REQUEST_ID_KEY] = rid
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != HEADER]
                message = {**message, "headers": [*headers, (HEADER, rid.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            logger.exception("unhandled error in request %s", rid)
            if started:  # headers are out: the client sees the connection end
                raise
            await _send_500(send, rid)


async def _send_500(send: Send, rid: str) -> None:
    body = json.dumps(internal_error(rid).body()).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 500,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (HEADER, rid.encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
