"""A small fake OpenAI-compatible runtime for the gateway's proxy tests (not a model: canned chunks).

Tests steer it through the `FakeState` object: hold streams between chunks (`release`), fail with a status,
abort mid-stream, report health, and count active/cancelled requests (what a real runtime's
`vllm:num_requests_running` shows).
"""

from __future__ import annotations

import asyncio
import json
import threading
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse


@dataclass
class FakeState:
    name: str = "fake"
    healthy: bool = True
    fail_status: int | None = None  # answer completions with this status
    abort_after_chunks: int | None = None  # drop the connection mid-stream
    chunks: int = 3
    hold: bool = False  # wait for `release` after the first chunk (streaming) or before answering
    silent: bool = False  # streaming: wait for `release` before the first byte (a wedged replica)
    release: threading.Event = field(default_factory=threading.Event)
    active: int = 0
    cancelled: int = 0
    served: int = 0
    waiting: int = 0  # reported as vllm:num_requests_waiting
    last_headers: dict[str, str] = field(default_factory=dict)
    last_body: dict[str, Any] = field(default_factory=dict)


async def _released(state: FakeState, request: Request) -> bool:
    """Wait for the test's release; False if the client went away first."""
    while not state.release.is_set():
        if await request.is_disconnected():
            return False
        await asyncio.sleep(0.01)
    return True


def _chunk(state: FakeState, i: int) -> bytes:
    body = {
        "id": f"cmpl-{state.name}",
        "object": "text_completion",
        "model": "m",
        "choices": [{"index": 0, "text": f"t{i} ", "finish_reason": None}],
    }
    return f"data: {json.dumps(body)}\n\n".encode()


def create_fake_app(state: FakeState) -> FastAPI:
    app = FastAPI()

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if state.healthy else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        text = (
            f'vllm:num_requests_running{{model_name="m"}} {state.active}\n'
            f'vllm:num_requests_waiting{{model_name="m"}} {state.waiting}\n'
        )
        return PlainTextResponse(text)

    async def completions(request: Request) -> Response:
        state.last_headers = dict(request.headers)
        state.last_body = await request.json()
        if state.fail_status is not None:
            return JSONResponse({"error": {"message": "injected"}}, status_code=state.fail_status)
        if state.last_body.get("stream"):
            return StreamingResponse(_stream(request), media_type="text/event-stream")
        state.active += 1
        try:
            if state.hold and not await _released(state, request):
                state.cancelled += 1
                return Response(status_code=499)
            state.served += 1
            return JSONResponse(
                {
                    "id": f"cmpl-{state.name}",
                    "object": "text_completion",
                    "model": "m",
                    "choices": [{"index": 0, "text": state.name, "finish_reason": "length"}],
                }
            )
        finally:
            state.active -= 1

    async def _stream(request: Request):
        state.active += 1
        try:
            if state.silent and not await _released(state, request):
                state.cancelled += 1
                return
            for i in range(state.chunks):
                if state.abort_after_chunks is not None and i == state.abort_after_chunks:
                    raise RuntimeError("injected mid-stream failure")
                yield _chunk(state, i)
                if i == 0 and state.hold and not await _released(state, request):
                    state.cancelled += 1
                    return
            yield b"data: [DONE]\n\n"
            state.served += 1
        except asyncio.CancelledError:
            state.cancelled += 1
            raise
        finally:
            state.active -= 1

    app.add_api_route("/v1/completions", completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", completions, methods=["POST"])
    return app
