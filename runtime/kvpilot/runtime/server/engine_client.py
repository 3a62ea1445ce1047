"""The asyncio side of the engine loop: lifecycle state, admission, and one stream per HTTP request.

Everything here runs on the event loop thread; the engine thread only reaches it through
`loop.call_soon_threadsafe` (one call per engine iteration, carrying all of that iteration's events).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from kvpilot.runtime.errors import InvalidRequestError
from kvpilot.runtime.server.engine_loop import (
    AbortGroup,
    AddGroup,
    Delivery,
    EngineLike,
    EngineLoop,
    GenerationInput,
    GroupAccepted,
    GroupRejected,
    LoopObserver,
    RequestAborted,
    RequestFailed,
)
from kvpilot.runtime.server.openai_errors import RETRY_AFTER_SECONDS, from_invalid_request, unavailable

logger = logging.getLogger(__name__)


class ServerState(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    FAILED = "failed"


class EngineFailure(Exception):
    """The engine failed while serving this request (becomes a 500 carrying the request id)."""


class GenerationStream:
    """The events of one HTTP request's engine requests (one per prompt x choice), in arrival order."""

    def __init__(self, group_id: str, size: int, on_close: Callable[[GenerationStream], None]) -> None:
        self.group_id = group_id
        self.size = size
        self._queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self._on_close = on_close
        self._finished: set[int] = set()
        self.closed = False

    @property
    def done(self) -> bool:
        return len(self._finished) == self.size

    def push(self, index: int, event: Any) -> None:
        self._queue.put_nowait((index, event))

    async def accepted(self) -> None:
        """Waits until the engine took every request of the group, or raises why it refused."""
        _, event = await self._queue.get()
        if isinstance(event, GroupRejected):
            self._finished = set(range(self.size))
            if isinstance(event.error, InvalidRequestError):
                raise from_invalid_request(event.error)
            raise EngineFailure(str(event.error)) from event.error
        if not isinstance(event, GroupAccepted):
            raise RuntimeError(f"unexpected first event {event!r}")

    async def events(self) -> AsyncIterator[tuple[int, Any]]:
        """Yields (index, RequestOutput | RequestAborted) until every request of the group finished."""
        while not self.done:
            index, event = await self._queue.get()
            if isinstance(event, RequestFailed):
                self._finished = set(range(self.size))
                raise EngineFailure(str(event.error)) from event.error
            if getattr(event, "error", None):  # the engine finished this request because it failed
                self._finished.add(index)
                raise EngineFailure(event.error)
            if isinstance(event, RequestAborted) or event.finished:
                self._finished.add(index)
            yield index, event

    def close(self) -> None:
        """Idempotent; aborts the engine requests that are still running (client gone, error, ...)."""
        if not self.closed:
            self.closed = True
            self._on_close(self)


class EngineClient:
    def __init__(
        self,
        engine_factory: Callable[[], EngineLike],
        observer: LoopObserver,
        *,
        served_model_name: str,
        max_waiting_requests: int,
    ) -> None:
        self.served_model_name = served_model_name
        self.max_waiting_requests = max_waiting_requests
        self.state = ServerState.LOADING
        self.tokenizer: Any = None
        self.max_model_len: int | None = None
        self._factory = engine_factory
        self._observer = observer
        self._streams: dict[str, GenerationStream] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._engine_loop: EngineLoop | None = None
        self._idle: asyncio.Event | None = None

    # ---- lifecycle
    def start(
        self, loop: asyncio.AbstractEventLoop, on_load_failed: Callable[[BaseException], None] | None = None
    ) -> None:
        """Starts the engine thread, which loads the engine; state turns READY once it is loaded."""
        self._loop = loop
        self._idle = asyncio.Event()
        self._idle.set()

        def failed(err: BaseException) -> None:
            self._call_soon(self._mark_failed, err, on_load_failed)

        self._engine_loop = EngineLoop(
            self._factory,
            self._dispatch_threadsafe,
            self._observer,
            on_loaded=lambda engine: self._call_soon(self._mark_loaded, engine),
            on_load_failed=failed,
        )
        self._engine_loop.start()

    def stop(self) -> None:
        if self._engine_loop is not None:
            self._engine_loop.stop()

    def begin_drain(self) -> None:
        if self.state in (ServerState.LOADING, ServerState.READY):
            self.state = ServerState.DRAINING

    async def wait_idle(self, timeout: float) -> bool:
        """True when every stream finished within `timeout` seconds."""
        assert self._idle is not None, "start() first"
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def abort_all(self) -> None:
        for stream in list(self._streams.values()):
            self._submit(AbortGroup(stream.group_id))

    @property
    def num_streams(self) -> int:
        return len(self._streams)

    # ---- requests
    def check_available(self, num_requests: int) -> None:
        """Raises the 503 a new request gets while loading, draining, or with a full waiting queue."""
        if self.state is ServerState.LOADING:
            raise unavailable("The model is still loading.", "model_loading", RETRY_AFTER_SECONDS)
        if self.state is not ServerState.READY:
            raise unavailable("The server is shutting down.", "shutting_down")
        assert self._engine_loop is not None
        depth = self._engine_loop.queue_depth()
        if depth > 0 and depth + num_requests > self.max_waiting_requests:
            raise unavailable(
                f"Too many requests waiting ({depth}; bound {self.max_waiting_requests}); retry later.",
                "server_overloaded",
                RETRY_AFTER_SECONDS,
            )

    def generate(self, inputs: Sequence[GenerationInput]) -> GenerationStream:
        group_id = uuid.uuid4().hex
        stream = GenerationStream(group_id, len(inputs), self._closed)
        self._streams[group_id] = stream
        assert self._idle is not None
        self._idle.clear()
        self._submit(AddGroup(group_id, list(inputs), stream.push))
        return stream

    def _closed(self, stream: GenerationStream) -> None:
        if not stream.done:
            self._submit(AbortGroup(stream.group_id))
        self._streams.pop(stream.group_id, None)
        if not self._streams and self._idle is not None:
            self._idle.set()

    def _submit(self, command: AddGroup | AbortGroup) -> None:
        assert self._engine_loop is not None, "start() first"
        self._engine_loop.submit(command)

    # ---- called on the event loop from the engine thread
    def _call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        with contextlib.suppress(RuntimeError):  # the event loop is closed: the server is gone
            self._loop.call_soon_threadsafe(fn, *args)

    def _dispatch_threadsafe(self, deliveries: list[Delivery]) -> None:
        self._call_soon(_deliver, deliveries)

    def _mark_loaded(self, engine: EngineLike) -> None:
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        if self.state is ServerState.LOADING:
            self.state = ServerState.READY
        logger.info("model loaded: %s (max_model_len %d)", self.served_model_name, self.max_model_len)

    def _mark_failed(self, err: BaseException, callback: Callable[[BaseException], None] | None) -> None:
        self.state = ServerState.FAILED
        if callback is not None:
            callback(err)


def _deliver(deliveries: list[Delivery]) -> None:
    for sink, index, event in deliveries:
        sink(index, event)
