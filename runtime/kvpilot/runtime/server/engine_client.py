"""The HTTP process's engine: lifecycle state, admission, and one stream per HTTP request.

The engine itself runs in the engine-core process (kvpilot.runtime.engine_core); this side starts it,
loads the tokenizer (prompts are tokenized here, token ids go to the core), turns each step's token ids
into text deltas (output_processor.py) and hands them to the streams. Everything here runs on the event
loop thread. The core's death fails every stream at once (an OpenAI error / SSE error event) and is
reported to the server, which exits non-zero.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvpilot.runtime.engine_core.client import EngineCoreProcess, EngineCoreSpec
from kvpilot.runtime.engine_core.messages import (
    Abort,
    AddGroup,
    CoreMessage,
    EngineRequest,
    LoadFailed,
    Ready,
    StepOutputs,
)
from kvpilot.runtime.errors import InvalidRequestError
from kvpilot.runtime.server.generation_stream import (
    EngineFailure,
    GenerationInput,
    GenerationStream,
    GroupAccepted,
    GroupRejected,
    StreamFailed,
)
from kvpilot.runtime.server.metrics import ServerMetrics
from kvpilot.runtime.server.openai_errors import (
    RETRY_AFTER_SECONDS,
    APIError,
    from_invalid_request,
    unavailable,
)
from kvpilot.runtime.server.output_processor import ChoiceDelta, RequestText

logger = logging.getLogger(__name__)


class ServerState(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    FAILED = "failed"  # the model could not be loaded, or the engine core died


@dataclass(slots=True)
class Route:
    """Where one engine request's deltas go, its text state, and its timing for the latency metrics."""

    stream: GenerationStream
    index: int
    text: RequestText
    arrival_time: float
    first_token_time: float | None = None
    last_token_time: float | None = None


def engine_request_id(group_id: str, index: int) -> str:
    return f"{group_id}-{index}"


class EngineClient:
    def __init__(
        self,
        core: EngineCoreSpec,
        tokenizer_factory: Callable[[], Any],
        metrics: ServerMetrics,
        *,
        served_model_name: str,
        max_waiting_requests: int,
        log_level: str = "info",
    ) -> None:
        self.served_model_name = served_model_name
        self.max_waiting_requests = max_waiting_requests
        self.state = ServerState.LOADING
        self.tokenizer: Any = None
        self.max_model_len: int | None = None
        self.core_pid: int | None = None
        self.process = EngineCoreProcess(core, log_level=log_level)
        self._tokenizer_factory = tokenizer_factory
        self._metrics = metrics
        self._ready: Ready | None = None
        self._streams: dict[str, GenerationStream] = {}
        self._routes: dict[str, Route] = {}
        self._unanswered: dict[str, int] = {}  # group id -> size, sent and not yet taken or refused
        self._pending_requests = 0  # their engine requests (not in a stats snapshot yet)
        self._engine_waiting = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._on_load_failed: Callable[[str], None] = lambda _: None
        self._on_core_died: Callable[[int], None] = lambda _: None
        self._tokenizer_task: asyncio.Task[None] | None = None

    # ---- lifecycle
    def start(
        self,
        on_load_failed: Callable[[str], None] | None = None,
        on_core_died: Callable[[int], None] | None = None,
    ) -> None:
        """Starts the engine-core process and loads the tokenizer; READY once both are done (on the loop)."""
        if on_load_failed is not None:
            self._on_load_failed = on_load_failed
        if on_core_died is not None:
            self._on_core_died = on_core_died
        self.process.start(self._on_message, self._on_exit)
        self.core_pid = self.process.pid
        self._tokenizer_task = asyncio.ensure_future(self._load_tokenizer())

    async def stop(self) -> None:
        """Shuts the engine core down (a core still loading is not waited for: it reads no messages)."""
        if self._tokenizer_task is not None and not self._tokenizer_task.done():
            self._tokenizer_task.cancel()
        code = await self.process.stop(timeout=5.0 if self._ready is not None else 0.5)
        logger.info("engine core stopped (exit code %s)", code)

    def begin_drain(self) -> None:
        if self.state in (ServerState.LOADING, ServerState.READY):
            self.state = ServerState.DRAINING

    async def wait_idle(self, timeout: float) -> bool:
        """True when every stream finished within `timeout` seconds."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def abort_all(self) -> None:
        """Aborts every running request; each stream ends with finish_reason "abort"."""
        live = list(self._routes)
        if live:
            self.process.send(Abort(live))

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    # ---- requests
    def check_available(self, num_requests: int) -> None:
        """Raises the 503 a new request gets while loading, draining, or with a full waiting queue."""
        if self.state is ServerState.LOADING:
            raise unavailable("The model is still loading.", "model_loading", RETRY_AFTER_SECONDS)
        if self.state is ServerState.FAILED:
            raise unavailable("The engine is not running; the server is exiting.", "engine_dead")
        if self.state is not ServerState.READY:
            raise unavailable("The server is shutting down.", "shutting_down")
        depth = self._pending_requests + self._engine_waiting
        if depth > 0 and depth + num_requests > self.max_waiting_requests:
            raise unavailable(
                f"Too many requests waiting ({depth}; bound {self.max_waiting_requests}); retry later.",
                "server_overloaded",
                RETRY_AFTER_SECONDS,
            )

    def generate(self, inputs: Sequence[GenerationInput]) -> GenerationStream:
        group_id = uuid.uuid4().hex
        request_ids = [engine_request_id(group_id, i) for i in range(len(inputs))]
        stream = GenerationStream(group_id, request_ids, self._closed)
        now = time.monotonic()
        requests = []
        for index, (request_id, item) in enumerate(zip(request_ids, inputs, strict=True)):
            text = RequestText(self.tokenizer, item.prompt_token_ids, item.params)
            self._routes[request_id] = Route(stream, index, text, now)
            core_params = replace(item.params, stop=[], include_stop_str_in_output=False, detokenize=False)
            requests.append(EngineRequest(request_id, item.prompt_token_ids, core_params, now))
        self._streams[group_id] = stream
        self._unanswered[group_id] = len(inputs)
        self._pending_requests += len(inputs)
        self._idle.clear()
        self.process.send(AddGroup(group_id, requests))
        return stream

    def _closed(self, stream: GenerationStream) -> None:
        live = [rid for rid in stream.request_ids if self._routes.pop(rid, None) is not None]
        if live:
            self.process.send(Abort(live))
        self._streams.pop(stream.group_id, None)
        if not self._streams:
            self._idle.set()

    # ---- the engine core's messages (event loop)
    def _on_message(self, message: CoreMessage) -> None:
        if isinstance(message, StepOutputs):
            self._dispatch(message)
        elif isinstance(message, Ready):
            self._ready = message
            self.max_model_len = message.max_model_len
            self._metrics.on_loaded(message.stats)
            self._maybe_ready()
        elif isinstance(message, LoadFailed):
            self._load_failed(message.reason)

    def _dispatch(self, message: StepOutputs) -> None:
        now = time.monotonic()
        streams, routes = self._streams, self._routes
        for group_id in message.accepted:
            self._answered(group_id)
            stream = streams.get(group_id)
            if stream is not None:
                stream.push(-1, GroupAccepted())
        for rejected in message.rejected:
            self._answered(rejected.group_id)
            stream = streams.get(rejected.group_id)
            if stream is None:
                continue
            for request_id in stream.request_ids:
                routes.pop(request_id, None)
            error: Exception = (
                from_invalid_request(InvalidRequestError(rejected.message, rejected.param))
                if rejected.invalid
                else EngineFailure(rejected.message)
            )
            stream.push(-1, GroupRejected(error))
        stopped: list[str] = []
        on_delta = self._metrics.on_delta
        step_start = message.step_start
        for out in message.outputs:
            route = routes.get(out.request_id)
            if route is None:
                continue  # closed, or finished here (a stop string) and aborted in the core
            try:
                delta = route.text.process(out)
            except Exception as err:  # the request's own text broke it: fail it, keep the others
                logger.exception("output processing failed for %s", out.request_id)
                delta = ChoiceDelta([], "", None, True, "abort", None, 0, 0, 0, f"output processing: {err}")
                stopped.append(out.request_id)
            if delta is None:
                continue
            on_delta(route, delta, now, step_start)
            route.stream.push(route.index, delta)
            if delta.finished:
                del routes[out.request_id]
                if delta.stopped_by_string:
                    stopped.append(out.request_id)
        if stopped:
            self.process.send(Abort(stopped))
        self._engine_waiting = message.stats.num_waiting
        self._metrics.on_stats(message.stats)

    def _answered(self, group_id: str) -> None:
        self._pending_requests -= self._unanswered.pop(group_id, 0)

    async def _load_tokenizer(self) -> None:
        try:
            tokenizer = await asyncio.to_thread(self._tokenizer_factory)
        except Exception as err:
            logger.exception("the tokenizer could not be loaded")
            self._load_failed(f"tokenizer: {type(err).__name__}: {err}")
            return
        self.tokenizer = tokenizer
        self._maybe_ready()

    def _maybe_ready(self) -> None:
        if self._ready is None or self.tokenizer is None or self.state is ServerState.FAILED:
            return
        if self.state is ServerState.LOADING:
            self.state = ServerState.READY
        logger.info(
            "model loaded: %s (max_model_len %d, engine core pid %d)",
            self.served_model_name,
            self._ready.max_model_len,
            self._ready.pid,
        )

    def _load_failed(self, reason: str) -> None:
        if self.state is ServerState.FAILED:
            return
        self.state = ServerState.FAILED
        self._on_load_failed(reason)

    def _on_exit(self, code: int) -> None:
        if self.state is ServerState.FAILED:
            return  # already failed (LoadFailed came first)
        if self._ready is None:
            self._load_failed(f"the engine core exited with code {code} while loading")
            return
        self.state = ServerState.FAILED
        message = f"the engine core process died (exit code {code})"
        logger.error("%s; failing %d request(s)", message, len(self._streams))
        for stream in list(self._streams.values()):
            stream.push(-1, StreamFailed(message))
        self._routes.clear()
        self._unanswered.clear()
        self._pending_requests = 0
        self._on_core_died(code)


__all__ = ["APIError", "EngineClient", "EngineFailure", "GenerationInput", "GenerationStream", "ServerState"]
