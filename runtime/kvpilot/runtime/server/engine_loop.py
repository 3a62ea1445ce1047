"""The engine loop: ONE thread owns the LLMEngine (it is not thread-safe) and steps it.

Requests and aborts enter through a command list guarded by a condition; the thread sleeps on the
condition while there is nothing to do (no busy spin). Each iteration applies the pending commands,
runs one engine step, and hands every event produced to `dispatch` in ONE call (the async side turns
that into a single `loop.call_soon_threadsafe`). An exception in step() fails the requests in flight
and the loop keeps serving.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvpilot.runtime.errors import InvalidRequestError
from kvpilot.runtime.sampling_params import SamplingParams

logger = logging.getLogger(__name__)
MAX_FAILURE_BACKOFF_S = 1.0


class EngineLike(Protocol):
    """What the loop needs from kvpilot.runtime.engine.llm_engine.LLMEngine."""

    tokenizer: Any
    max_model_len: int

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None: ...
    def abort_request(self, request_id: str) -> None: ...
    def step(self) -> list[Any]: ...
    def has_unfinished_requests(self) -> bool: ...
    def stats(self) -> Any: ...


@dataclass(frozen=True)
class GenerationInput:
    prompt: str | list[int]
    params: SamplingParams


# Events handed to a group's sink as (index, event); index -1 is about the whole group.
@dataclass(frozen=True)
class GroupAccepted:
    pass


@dataclass(frozen=True)
class GroupRejected:
    error: Exception


@dataclass(frozen=True)
class RequestFailed:
    error: Exception


@dataclass(frozen=True)
class RequestAborted:
    pass


Sink = Callable[[int, Any], None]
Delivery = tuple[Sink, int, Any]


@dataclass
class AddGroup:
    group_id: str
    inputs: Sequence[GenerationInput]
    sink: Sink
    arrival_time: float = field(default_factory=time.monotonic)


@dataclass
class AbortGroup:
    group_id: str


@dataclass
class Route:
    """Where one engine request's outputs go, plus its timing for the latency metrics."""

    sink: Sink
    group_id: str
    index: int
    arrival_time: float
    first_token_time: float | None = None
    last_token_time: float | None = None


class LoopObserver(Protocol):
    """Metrics hooks, called from the engine thread."""

    def on_loaded(self, engine: Any) -> None: ...
    def on_output(self, route: Route, output: Any, now: float, step_start: float) -> None: ...
    def on_stats(self, stats: Any) -> None: ...


def engine_request_id(group_id: str, index: int) -> str:
    return f"{group_id}-{index}"


class EngineLoop:
    def __init__(
        self,
        engine_factory: Callable[[], EngineLike],
        dispatch: Callable[[list[Delivery]], None],
        observer: LoopObserver,
        *,
        on_loaded: Callable[[EngineLike], None],
        on_load_failed: Callable[[BaseException], None],
    ) -> None:
        self._factory = engine_factory
        self._dispatch = dispatch
        self._observer = observer
        self._on_loaded = on_loaded
        self._on_load_failed = on_load_failed
        self._cond = threading.Condition()
        self._pending: list[AddGroup | AbortGroup] = []
        self._pending_requests = 0  # engine requests submitted but not yet in a stats snapshot
        self._engine_waiting = 0
        self._stopping = False
        self._routes: dict[str, Route] = {}
        self._groups: dict[str, list[str]] = {}
        self._outbox: list[Delivery] = []
        self._failures = 0
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    # ---- called from any thread
    def start(self) -> None:
        self._thread.start()

    def submit(self, command: AddGroup | AbortGroup) -> None:
        with self._cond:
            self._pending.append(command)
            if isinstance(command, AddGroup):
                self._pending_requests += len(command.inputs)
            self._cond.notify()

    def queue_depth(self) -> int:
        """Requests waiting: the engine's waiting queue plus those submitted since its last snapshot.

        Both numbers change together under the lock, so a request is never missed in between (it may be
        counted as waiting for one iteration after it started running).
        """
        with self._cond:
            return self._pending_requests + self._engine_waiting

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # ---- engine thread
    def _run(self) -> None:
        try:
            engine = self._factory()
        except BaseException as err:
            logger.exception("engine failed to load")
            self._on_load_failed(err)
            return
        self._observer.on_loaded(engine)
        self._on_loaded(engine)
        while (commands := self._next_commands(engine)) is not None:
            try:
                self._iterate(engine, commands)
            except Exception as err:  # e.g. stats() broke: fail what is in flight, keep serving
                logger.exception("engine loop iteration failed")
                self._fail_all(engine, err)
                self._flush()
        for route in self._routes.values():
            self._outbox.append((route.sink, route.index, RequestAborted()))
        self._flush()

    def _next_commands(self, engine: EngineLike) -> list[AddGroup | AbortGroup] | None:
        with self._cond:
            while not (self._pending or self._stopping or engine.has_unfinished_requests()):
                self._cond.wait()
            if self._stopping:
                return None
            commands, self._pending = self._pending, []
            return commands

    def _iterate(self, engine: EngineLike, commands: list[AddGroup | AbortGroup]) -> None:
        for command in commands:
            if isinstance(command, AddGroup):
                self._add(engine, command)
            else:
                self._abort(engine, command.group_id)
        if engine.has_unfinished_requests():
            self._step(engine)
        stats = engine.stats()
        self._observer.on_stats(stats)
        taken = sum(len(c.inputs) for c in commands if isinstance(c, AddGroup))
        with self._cond:
            self._pending_requests -= taken
            self._engine_waiting = stats.num_waiting
        self._flush()

    def _flush(self) -> None:
        if self._outbox:
            outbox, self._outbox = self._outbox, []
            self._dispatch(outbox)

    def _add(self, engine: EngineLike, command: AddGroup) -> None:
        added: list[str] = []
        try:
            for index, item in enumerate(command.inputs):
                request_id = engine_request_id(command.group_id, index)
                engine.add_request(request_id, item.prompt, item.params)
                added.append(request_id)
                self._routes[request_id] = Route(command.sink, command.group_id, index, command.arrival_time)
        except Exception as err:  # InvalidRequestError -> 400, anything else -> 500
            if not isinstance(err, InvalidRequestError):
                logger.exception("add_request failed for %s", command.group_id)
            for request_id in added:
                self._routes.pop(request_id, None)
                self._safe_abort(engine, request_id)
            self._outbox.append((command.sink, -1, GroupRejected(err)))
            return
        self._groups[command.group_id] = added
        self._outbox.append((command.sink, -1, GroupAccepted()))

    def _abort(self, engine: EngineLike, group_id: str) -> None:
        for request_id in self._groups.pop(group_id, []):
            route = self._routes.pop(request_id, None)
            if route is not None:
                self._safe_abort(engine, request_id)
                self._outbox.append((route.sink, route.index, RequestAborted()))

    def _safe_abort(self, engine: EngineLike, request_id: str) -> None:
        try:
            engine.abort_request(request_id)
        except Exception:
            logger.exception("abort_request(%s) failed", request_id)

    def _step(self, engine: EngineLike) -> None:
        step_start = time.monotonic()
        try:
            outputs = engine.step()
        except Exception as err:
            logger.exception("engine step failed; failing %d requests in flight", len(self._routes))
            self._fail_all(engine, err)
            return
        self._failures = 0
        now = time.monotonic()
        for output in outputs:
            route = self._routes.get(output.request_id)
            if route is None:
                continue  # aborted or failed earlier: its late "abort" output has nowhere to go
            self._observer.on_output(route, output, now, step_start)
            self._outbox.append((route.sink, route.index, output))
            if output.finished:
                self._finish(output.request_id, route.group_id)

    def _finish(self, request_id: str, group_id: str) -> None:
        self._routes.pop(request_id, None)
        members = self._groups.get(group_id)
        if members is not None:
            members.remove(request_id)
            if not members:
                del self._groups[group_id]

    def _fail_all(self, engine: EngineLike, err: Exception) -> None:
        for request_id, route in list(self._routes.items()):
            self._safe_abort(engine, request_id)
            self._outbox.append((route.sink, route.index, RequestFailed(err)))
        self._routes.clear()
        self._groups.clear()
        self._failures += 1
        if self._failures > 1:  # the engine keeps failing with nothing routed: do not spin
            time.sleep(min(MAX_FAILURE_BACKOFF_S, 0.01 * 2**self._failures))
