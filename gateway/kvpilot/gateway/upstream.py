"""Talking to one replica: header hygiene, opening a request up to its first byte, relaying the rest."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

import httpx
from kvpilot.gateway.openai_errors import error_body
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

log = logging.getLogger(__name__)

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
# Set by our own server on every response: relayed too, a client would see each of them twice.
OWN_HEADERS = frozenset({"date", "server"})
RETRYABLE_STATUS = frozenset({502, 503, 504})


class ReplicaUnavailable(Exception):
    """The replica failed before sending a byte we could pass on: safe to try another one."""


class ReplicaWentDown(ReplicaUnavailable):
    """Given up while the replica failed its health checks: it may pass them again (an overloaded replica
    does), so the retry may come back to it, unlike one that refused or broke the connection."""


def forward_headers(headers: Mapping[str, str], request_id: str, drop: frozenset[str] = frozenset()) -> dict:
    """Client -> replica: end-to-end headers only, plus our request id."""
    listed = {h.strip().lower() for h in headers.get("connection", "").split(",") if h.strip()}
    out = {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP | listed | drop}
    out["x-request-id"] = request_id
    return out


def response_headers(headers: httpx.Headers, request_id: str) -> dict[str, str]:
    """Replica -> client: end-to-end headers only (raw bytes are relayed, so content-encoding stays)."""
    listed = {h.strip().lower() for h in headers.get("connection", "").split(",") if h.strip()}
    out = {k: v for k, v in headers.items() if k.lower() not in HOP_BY_HOP | OWN_HEADERS | listed}
    out["x-request-id"] = request_id
    return out


@dataclass(frozen=True)
class AttemptBounds:
    """How long one attempt may wait on its replica.

    down: set when the replica fails its health checks (a frozen or dead process): an attempt still
      waiting for its first byte gives up at once (and is retried elsewhere); a relay gives up once the
      replica has also been silent for `stalled_seconds`.
    first_byte_seconds: the most an attempt waits for its first byte (None: no bound, e.g. non-streaming
      requests, whose first byte comes with the whole answer).
    """

    down: asyncio.Event
    first_byte_seconds: float | None
    stalled_seconds: float


@dataclass
class OpenedUpstream:
    response: httpx.Response
    first: bytes  # the first body chunk ('' for an empty body)
    rest: AsyncIterator[bytes]

    async def aclose(self) -> None:
        await self.response.aclose()


async def open_upstream(
    client: httpx.AsyncClient, url: str, body: bytes, headers: dict, bounds: AttemptBounds
) -> OpenedUpstream:
    """Send the request and wait for the first body byte; any failure until then (including the replica
    going down, or no byte within the bound) is ReplicaUnavailable."""
    if bounds.down.is_set():
        raise ReplicaUnavailable(f"{url}: the replica is down")
    attempt = asyncio.ensure_future(_first_byte(client, url, body, headers))
    down = asyncio.ensure_future(bounds.down.wait())
    try:
        await asyncio.wait(
            {attempt, down}, timeout=bounds.first_byte_seconds, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        down.cancel()
        if not attempt.done():
            attempt.cancel()
            await asyncio.gather(attempt, return_exceptions=True)  # closes the upstream connection
    if attempt.cancelled():
        if bounds.down.is_set():
            raise ReplicaWentDown(f"{url}: the replica failed its health checks before the first byte")
        raise ReplicaUnavailable(f"{url}: the replica sent no byte in time")
    return attempt.result()


async def _first_byte(client: httpx.AsyncClient, url: str, body: bytes, headers: dict) -> OpenedUpstream:
    request = client.build_request("POST", url, content=body, headers=headers)
    try:
        response = await client.send(request, stream=True)
    except httpx.TransportError as exc:
        raise ReplicaUnavailable(f"{url}: {exc!r}") from exc
    try:
        if response.status_code in RETRYABLE_STATUS:
            raise ReplicaUnavailable(f"{url}: HTTP {response.status_code}")
        chunks = response.aiter_raw()
        try:
            first = await chunks.__anext__()
        except StopAsyncIteration:
            first = b""
        return OpenedUpstream(response, first, chunks)
    except BaseException as exc:
        await response.aclose()
        if isinstance(exc, httpx.TransportError):
            raise ReplicaUnavailable(f"{url}: {exc!r}") from exc
        raise


async def read_rest(upstream: OpenedUpstream) -> bytes:
    """The whole body of a non-streaming answer (a failure here is still before the client's first byte)."""
    parts = [upstream.first]
    try:
        async for chunk in upstream.rest:
            parts.append(chunk)
    except httpx.TransportError as exc:
        raise ReplicaUnavailable(repr(exc)) from exc
    return b"".join(parts)


def _stream_error_event(message: str) -> bytes:
    body = error_body(message, "server_error", "upstream_failed")
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class RelayResponse(StreamingResponse):
    """Streams an upstream body through unbuffered; `on_done(ok)` runs exactly once, whatever happens
    (client disconnect, upstream failure, cancellation), after the upstream is closed."""

    def __init__(
        self,
        upstream: OpenedUpstream,
        headers: dict[str, str],
        on_done: Callable[[bool], None],
        bounds: AttemptBounds,
    ) -> None:
        self.upstream, self.on_done, self.ok, self.bounds = upstream, on_done, True, bounds
        is_sse = upstream.response.headers.get("content-type", "").startswith("text/event-stream")
        self.is_sse = is_sse
        super().__init__(self._relay(), status_code=upstream.response.status_code, headers=headers)

    async def _relay(self) -> AsyncIterator[bytes]:
        if self.upstream.first:
            yield self.upstream.first
        loop = asyncio.get_running_loop()
        stalled = self.bounds.stalled_seconds
        try:
            async with asyncio.timeout(None) as deadline:
                watcher = asyncio.ensure_future(self._watch_down(deadline))
                try:
                    async for chunk in self.upstream.rest:
                        if deadline.when() is not None:  # the replica is down but still talking
                            deadline.reschedule(loop.time() + stalled)
                        yield chunk
                finally:
                    watcher.cancel()
        except (httpx.TransportError, TimeoutError) as exc:
            self.ok = False
            cause: Exception = exc
            if isinstance(exc, TimeoutError):
                cause = ReplicaUnavailable(f"failed its health checks and sent nothing for {stalled:g}s")
            log.warning("upstream %s failed mid-stream: %r", self.upstream.response.url, cause)
            if not self.is_sse:
                raise  # the server aborts the connection: the client sees a truncated body, not a hang
            # The OpenAI clients raise on an error event: a clean error, not a hang or a silent cut.
            yield _stream_error_event(f"the replica serving this request failed mid-stream: {cause!r}")

    async def _watch_down(self, deadline: asyncio.Timeout) -> None:
        await self.bounds.down.wait()
        deadline.reschedule(asyncio.get_running_loop().time() + self.bounds.stalled_seconds)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.upstream.aclose()
            self.on_done(self.ok)
