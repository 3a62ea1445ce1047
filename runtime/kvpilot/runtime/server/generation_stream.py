"""One HTTP request's stream of engine events: the group's acceptance (or why not), then the deltas of its
engine requests (one per prompt x choice) in arrival order, batched per wake-up. Runs on the event loop."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from kvpilot.runtime.sampling_params import SamplingParams
from kvpilot.runtime.server.output_processor import ChoiceDelta


class EngineFailure(Exception):
    """The engine failed while serving this request (becomes a 500 carrying the request id)."""


@dataclass(frozen=True)
class GenerationInput:
    prompt_token_ids: list[int]
    params: SamplingParams


# Group-level events (index -1) a stream receives before its deltas.
@dataclass(frozen=True)
class GroupAccepted:
    pass


@dataclass(frozen=True)
class GroupRejected:
    error: Exception  # APIError (400) or EngineFailure (500)


@dataclass(frozen=True)
class StreamFailed:
    message: str  # the engine core died


class GenerationStream:
    """The deltas of one HTTP request's engine requests (one per prompt x choice), in arrival order."""

    def __init__(self, group_id: str, request_ids: list[str], on_close: Callable[[GenerationStream], None]):
        self.group_id = group_id
        self.request_ids = request_ids
        self.size = len(request_ids)
        self.closed = False
        self._items: deque[tuple[int, Any]] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._on_close = on_close
        self._finished: set[int] = set()

    @property
    def done(self) -> bool:
        return len(self._finished) == self.size

    def push(self, index: int, event: Any) -> None:
        self._items.append((index, event))
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def accepted(self) -> None:
        """Waits until the engine took every request of the group, or raises why it did not."""
        await self._wait()
        _, event = self._items.popleft()
        if isinstance(event, GroupAccepted):
            return
        self._finished = set(range(self.size))
        if isinstance(event, GroupRejected):
            raise event.error
        if isinstance(event, StreamFailed):
            raise EngineFailure(event.message)
        raise RuntimeError(f"unexpected first event {event!r}")

    async def batches(self) -> AsyncIterator[list[tuple[int, ChoiceDelta]]]:
        """Yields every delta that arrived since the last batch (index, delta), until all requests ended.
        Raises EngineFailure after the deltas that came before the failure."""
        while not self.done:
            await self._wait()
            batch: list[tuple[int, ChoiceDelta]] = []
            error: str | None = None
            while self._items:
                index, event = self._items.popleft()
                if isinstance(event, StreamFailed):
                    error = event.message
                    break
                if event.error is not None:
                    error = event.error
                    break
                if event.finished:
                    self._finished.add(index)
                batch.append((index, event))
            if batch:
                yield batch
            if error is not None:
                self._finished = set(range(self.size))
                raise EngineFailure(error)

    async def events(self) -> AsyncIterator[tuple[int, ChoiceDelta]]:
        async for batch in self.batches():
            for item in batch:
                yield item

    def close(self) -> None:
        """Idempotent; aborts the engine requests that are still running (client gone, error, ...)."""
        if not self.closed:
            self.closed = True
            self._on_close(self)
