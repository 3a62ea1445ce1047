"""One proxied request: validate, pick a pool, route (with retries before the first byte), relay.

Lifecycle guarantees: the ticket (in-flight counters) is released in `finally` on every path; a client that
disconnects while we wait for a replica, the upstream headers or a non-streaming body cancels that work
(closing the upstream connection, which makes the runtime abort the sequence); a streaming disconnect is
handled by RelayResponse in the same way.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import Response
from kvpilot.gateway.auth import ApiKeys
from kvpilot.gateway.config import GatewayConfig
from kvpilot.gateway.metrics import GatewayMetrics
from kvpilot.gateway.openai_errors import GatewayError, ModelNotFound, UpstreamFailed, error_response
from kvpilot.gateway.pool import Pool, PoolRegistry, Ticket
from kvpilot.gateway.prefix import block_hashes, estimate_tokens, prompt_text
from kvpilot.gateway.request_body import parse_body, read_body
from kvpilot.gateway.routing import RequestView
from kvpilot.gateway.upstream import (
    AttemptBounds,
    RelayResponse,
    ReplicaUnavailable,
    ReplicaWentDown,
    forward_headers,
    open_upstream,
    read_rest,
    response_headers,
)
from starlette.requests import ClientDisconnect

log = logging.getLogger(__name__)
CLIENT_CLOSED = 499
UNKNOWN_MODEL = "(unknown)"  # the metrics label of requests for no known pool: label values stay bounded


@dataclass
class GatewayState:
    config: GatewayConfig
    registry: PoolRegistry
    client: httpx.AsyncClient
    metrics: GatewayMetrics
    auth: ApiKeys


def request_id_of(request: Request) -> str:
    given = request.headers.get("x-request-id", "")
    return given if 0 < len(given) <= 128 and given.isprintable() else uuid.uuid4().hex


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def handle(state: GatewayState, request: Request, path: str) -> Response:
    loop = asyncio.get_running_loop()
    started, rid, model = loop.time(), request_id_of(request), UNKNOWN_MODEL
    limits, timeouts = state.config.limits, state.config.timeouts
    try:
        state.auth.check(request.headers)
        raw = await read_body(request, limits.max_request_bytes, timeouts.request_body_seconds)
        body = parse_body(raw)
        pool = state.registry.get(body["model"])
        if pool is None:
            raise ModelNotFound(f"the model {body['model'][:200]!r} does not exist", param="model")
        model = pool.name
        text = prompt_text(body)
        prefix = state.config.prefix
        hashes = block_hashes(text, prefix.block_chars, prefix.max_blocks)
        view = RequestView(hashes, estimate_tokens(body, text))
        call = _Call(
            state,
            pool,
            path,
            raw,
            forward_headers(request.headers, rid, _dropped(state)),
            rid,
            started,
            stream=bool(body.get("stream")),
        )
        response = await _unless_disconnected(request, asyncio.ensure_future(call.run(view)))
        if response is None:
            state.metrics.requests.labels(model, path, str(CLIENT_CLOSED)).inc()
            return Response(status_code=CLIENT_CLOSED)
        return response
    except ClientDisconnect:  # gone while sending its body: nobody reads an answer, nothing failed here
        state.metrics.requests.labels(model, path, str(CLIENT_CLOSED)).inc()
        return Response(status_code=CLIENT_CLOSED)
    except GatewayError as exc:
        if exc.status in (429, 503):
            state.metrics.rejected.labels(model, exc.code or str(exc.status)).inc()
        state.metrics.requests.labels(model, path, str(exc.status)).inc()
        return error_response(exc, rid)


def _dropped(state: GatewayState) -> frozenset[str]:
    # The gateway's own API key is not the runtime's business.
    return frozenset({"authorization"}) if state.auth.enabled else frozenset()


async def _unless_disconnected(request: Request, work: asyncio.Future) -> Any:
    """`work`'s result, or None (with `work` cancelled) if the client goes away first."""
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)  # its finally blocks ran before we go on
    if work.cancelled():
        return None
    return work.result()


@dataclass
class _Call:
    state: GatewayState
    pool: Pool
    path: str
    body: bytes
    headers: dict
    rid: str
    started: float
    stream: bool

    async def run(self, view: RequestView) -> Response:
        """Route and forward; on failure before any byte reached the client, try another replica."""
        tried: set[str] = set()
        metrics, pool = self.state.metrics, self.pool
        for attempt in range(self.state.config.limits.max_attempts):
            ticket = await pool.acquire(view, frozenset(tried))
            metrics.routing.labels(pool.name, pool.policy.name, ticket.url, ticket.decision.reason).inc()
            try:
                return await self._forward(ticket)
            except ReplicaUnavailable as exc:
                log.warning("attempt %d for %s failed before the first byte: %s", attempt + 1, pool.name, exc)
                pool.report_failure(ticket.url)
                if not isinstance(exc, ReplicaWentDown):
                    tried.add(ticket.url)
                metrics.retries.labels(pool.name).inc()
        raise UpstreamFailed(f"{attempt + 1} attempt(s) on {pool.name!r} failed this request")

    async def _forward(self, ticket: Ticket) -> Response:
        """Opens the upstream; owns `ticket` until it returns, then the response owns it (streaming)."""
        handed_over = False
        timeouts = self.state.config.timeouts
        bounds = AttemptBounds(
            ticket.replica.down,
            timeouts.first_byte_seconds if self.stream else None,
            timeouts.stalled_seconds,
        )
        try:
            url = ticket.url + self.path
            upstream = await open_upstream(self.state.client, url, self.body, self.headers, bounds)
            elapsed = asyncio.get_running_loop().time() - self.started
            self.state.metrics.ttfb.labels(self.pool.name).observe(elapsed)
            headers = response_headers(upstream.response.headers, self.rid)
            status = upstream.response.status_code
            if self.stream:
                response = RelayResponse(upstream, headers, lambda ok: self._done(ticket, status, ok), bounds)
                handed_over = True
                return response
            try:
                content = await read_rest(upstream)
            finally:
                await upstream.aclose()
            self._count(status)
            return Response(content, status_code=status, headers=headers)
        finally:
            if not handed_over:
                ticket.release()

    def _done(self, ticket: Ticket, status: int, ok: bool) -> None:
        ticket.release()
        if not ok:
            self.pool.report_failure(ticket.url)
        self._count(status)

    def _count(self, status: int) -> None:
        self.state.metrics.requests.labels(self.pool.name, self.path, str(status)).inc()
