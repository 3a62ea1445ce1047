"""A fault-injecting HTTP proxy to put in front of kmock (or any API server): chosen requests (the next ones
that match, or every n-th) get a 409, a 500, a 503 or a delay instead of (or before) being forwarded;
everything else, watch streams included, is relayed as it comes.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

REASONS = {409: "Conflict", 500: "InternalError", 503: "ServiceUnavailable", 429: "TooManyRequests"}


@dataclass
class Fault:
    """Injected into the next requests whose method is in `methods` and whose path contains `path`:
    each entry of `actions` is used once, in order: a status code, or a delay in seconds (a float)."""

    methods: frozenset[str]
    path: str
    actions: deque[int | float]
    every: int = 1  # inject into every n-th matching request (the others pass)
    seen: int = 0


@dataclass
class FaultProxy:
    upstream: str
    faults: list[Fault] = field(default_factory=list)
    injected: Counter[str] = field(default_factory=Counter)

    def add(self, methods: set[str], path: str, *actions: int | float, every: int = 1) -> None:
        self.faults.append(Fault(frozenset(methods), path, deque(actions), every))

    def _next_action(self, method: str, path: str) -> int | float | None:
        for fault in self.faults:
            if method in fault.methods and fault.path in path and fault.actions:
                fault.seen += 1
                if fault.seen % fault.every == 0:
                    return fault.actions.popleft()
        return None

    def app(self) -> Starlette:
        client = httpx.AsyncClient(base_url=self.upstream, timeout=None)

        async def forward(request: Request) -> Response:
            action = self._next_action(request.method, request.url.path)
            if isinstance(action, int):
                self.injected[str(action)] += 1
                status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": action}
                status |= {"reason": REASONS.get(action, "Unknown"), "message": "injected by the fault proxy"}
                return JSONResponse(status, status_code=action)
            if isinstance(action, float):
                self.injected["delay"] += 1
                await asyncio.sleep(action)
            body = await request.body()
            headers = {
                k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")
            }
            upstream = await client.send(
                client.build_request(
                    request.method,
                    request.url.path,
                    params=request.query_params,
                    headers=headers,
                    content=body,
                ),
                stream=True,
            )

            async def relay() -> AsyncIterator[bytes]:
                try:
                    async for chunk in upstream.aiter_raw():
                        yield chunk
                finally:
                    await upstream.aclose()

            kept = {k: v for k, v in upstream.headers.items() if k.lower() in ("content-type",)}
            return StreamingResponse(relay(), status_code=upstream.status_code, headers=kept)

        methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]
        return Starlette(routes=[Route("/{path:path}", forward, methods=methods)])
