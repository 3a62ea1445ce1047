"""Handlers for /v1/completions and /v1/chat/completions: request -> engine requests -> response.

Prompts are tokenized here (the engine core receives token ids). A streaming response writes every
delta that arrived since its last write at once: one SSE event per engine step and choice, and one
transport write for however many of them piled up while the event loop was busy.

A streaming response closes its engine requests when the client goes away (the response task is
cancelled); a non-streaming one watches for the disconnect while it waits. Either way the engine
aborts the sequences and frees their blocks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from jinja2 import TemplateError
from kvpilot.runtime.errors import InvalidRequestError
from kvpilot.runtime.server.engine_client import EngineClient
from kvpilot.runtime.server.generation_stream import EngineFailure, GenerationInput, GenerationStream
from kvpilot.runtime.server.middleware import REQUEST_ID_KEY
from kvpilot.runtime.server.openai_errors import (
    from_invalid_request,
    internal_error,
    invalid_request,
    model_not_found,
)
from kvpilot.runtime.server.prompt_tokens import PromptWorker, encode_bounded, prompt_too_long
from kvpilot.runtime.server.protocol import ChatCompletionRequest, CompletionRequest, Prompt, parse_request
from kvpilot.runtime.server.request_body import BodyLimits, read_body
from kvpilot.runtime.server.responses import (
    SSE_DONE,
    ChatFormat,
    ChoiceState,
    CompletionFormat,
    EndpointFormat,
    ResponseMeta,
    new_choices,
    sse_event,
    usage_chunk,
)
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

logger = logging.getLogger(__name__)
CLIENT_CLOSED_STATUS = 499


def request_id(request: Request) -> str:
    return str(request.scope.get(REQUEST_ID_KEY, "unknown"))


class GuardedStreamingResponse(StreamingResponse):
    """Runs `on_close` however the response ends: finished, client gone, or cancelled before it began."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


class OpenAIServing:
    def __init__(self, client: EngineClient, limits: BodyLimits | None = None) -> None:
        self.client = client
        self.limits = limits or BodyLimits()
        self.worker = PromptWorker()

    async def completions(self, request: Request) -> Response:
        raw = await read_body(request, self.limits)
        body: CompletionRequest = parse_request(CompletionRequest, raw)
        self._check_model(body.model)
        prompts = body.prompts()
        params = body.sampling_params()
        self.client.check_available(len(prompts) * body.n)
        prompt_ids = await self.worker.run(self._tokenize_all, prompts)
        return await self._serve(request, body, prompt_ids, params, CompletionFormat(self._token_text))

    async def chat(self, request: Request) -> Response:
        raw = await read_body(request, self.limits)
        body: ChatCompletionRequest = parse_request(ChatCompletionRequest, raw)
        self._check_model(body.model)
        params = body.sampling_params()
        self.client.check_available(body.n)
        prompt = await self.worker.run(self._render_chat, body)
        return await self._serve(request, body, [prompt], params, ChatFormat(self._token_text))

    # ---- steps
    def _check_model(self, model: str) -> None:
        if model != self.client.served_model_name:
            raise model_not_found(model)

    def _tokenize_all(self, prompts: list[Prompt]) -> list[list[int]]:
        """(worker thread) Completion prompts as token ids; the engine encodes strings the same way."""
        limit = self.client.max_model_len
        out = []
        for prompt in prompts:
            if isinstance(prompt, str):
                out.append(encode_bounded(self.client.tokenizer, prompt, limit, "prompt") if prompt else [])
            elif limit is not None and len(prompt) > limit:
                raise prompt_too_long(len(prompt), limit, "prompt")
            else:
                out.append(list(prompt))
        return out

    def _token_text(self, token_id: int) -> str:
        return self.client.tokenizer.decode([token_id], skip_special_tokens=False)

    def _render_chat(self, body: ChatCompletionRequest) -> list[int]:
        """(worker thread) The chat template's text, tokenized."""
        tokenizer = self.client.tokenizer
        try:
            text = tokenizer.apply_chat_template(
                body.template_messages(), add_generation_prompt=body.add_generation_prompt
            )
        except InvalidRequestError as err:
            raise from_invalid_request(err) from err
        except TemplateError as err:
            message = f"The chat template cannot render these messages: {err}"
            raise invalid_request(message, "messages") from err
        limit = self.client.max_model_len
        return encode_bounded(tokenizer, text, limit, "messages", add_special_tokens=False)

    async def _serve(
        self, request: Request, body: Any, prompts: list[list[int]], params: list[Any], fmt: EndpointFormat
    ) -> Response:
        inputs = [GenerationInput(prompt, choice_params) for prompt in prompts for choice_params in params]
        stream = self.client.generate(inputs)
        try:
            await stream.accepted()
        except EngineFailure as err:
            stream.close()
            raise internal_error(request_id(request)) from err
        except BaseException:
            stream.close()
            raise
        meta = ResponseMeta(fmt.id_prefix + stream.group_id, int(time.time()), self.client.served_model_name)
        choices = new_choices(len(prompts), body.n)
        if body.stream:
            events = self._sse(stream, fmt, meta, choices, body.include_usage, request_id(request))
            return GuardedStreamingResponse(
                events, stream.close, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
            )
        try:
            finished = await _unless_disconnected(request, _collect(stream, choices))
        except EngineFailure as err:
            raise internal_error(request_id(request)) from err
        finally:
            stream.close()
        if not finished:
            return Response(status_code=CLIENT_CLOSED_STATUS)
        return JSONResponse(fmt.response(meta, choices))

    async def _sse(
        self,
        stream: GenerationStream,
        fmt: EndpointFormat,
        meta: ResponseMeta,
        choices: list[ChoiceState],
        include_usage: bool,
        rid: str,
    ) -> AsyncIterator[bytes]:
        def encode(chunk: dict[str, Any]) -> bytes:
            return sse_event({**chunk, "usage": None} if include_usage else chunk)

        try:
            opening = b"".join(encode(chunk) for chunk in fmt.opening_chunks(meta, choices))
            if opening:
                yield opening
            async for batch in stream.batches():
                events: list[bytes] = []
                for index, event in batch:
                    choice = choices[index]
                    events.extend(
                        encode(chunk) for chunk in fmt.delta_chunks(meta, choice, choice.apply(event))
                    )
                if events:
                    yield b"".join(events)
            if include_usage:
                yield sse_event(usage_chunk(meta, fmt.chunk_object, choices))
        except EngineFailure:
            logger.exception("engine failure while streaming request %s", rid)
            yield sse_event(internal_error(rid).body())
        finally:
            stream.close()
        yield SSE_DONE


async def _collect(stream: GenerationStream, choices: list[ChoiceState]) -> None:
    async for index, event in stream.events():
        choices[index].apply(event)


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, work: Any) -> bool:
    """Runs `work`; False (and `work` cancelled) when the client disconnects first."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if task.done() and not task.cancelled():
        task.result()
        return True
    return False
