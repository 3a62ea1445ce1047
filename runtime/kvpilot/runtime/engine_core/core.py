"""The engine-core loop: owns the engine (scheduler, block manager, model runner) and steps it.

Each iteration drains every request message that arrived (blocking on the socket only while the engine
has nothing to do: no busy spin), runs one engine.step(), and sends ONE StepOutputs message carrying all
outputs of that step, the groups taken or refused, and a stats snapshot. An exception in step() fails
the requests in flight (each gets an output with `error`) and the loop keeps serving.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any, Protocol

import msgspec
import zmq
from kvpilot.runtime.engine_core.messages import (
    Abort,
    AddGroup,
    Logprob,
    Ready,
    Rejected,
    Shutdown,
    Stats,
    StepOutputs,
    TokenOutput,
    message_encoder,
    request_decoder,
)
from kvpilot.runtime.errors import InvalidRequestError
from kvpilot.runtime.sampling_params import SamplingParams

logger = logging.getLogger(__name__)
MAX_FAILURE_BACKOFF_S = 1.0


class EngineLike(Protocol):
    """What the loop needs from kvpilot.runtime.engine.llm_engine.LLMEngine."""

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


def build_llm_engine(**engine_kwargs: Any) -> EngineLike:
    """The production factory: LLMEngine.from_args(EngineArgs(**kwargs)) (torch is imported here)."""
    from kvpilot.runtime.engine.engine_args import EngineArgs
    from kvpilot.runtime.engine.llm_engine import LLMEngine

    return LLMEngine.from_args(EngineArgs(**engine_kwargs))


def resolve_factory(spec: str) -> Callable[..., EngineLike]:
    """The function a "package.module:function" spec names."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"engine factory {spec!r} is not of the form 'module:function'")
    return getattr(importlib.import_module(module_name), attr)


def stats_message(stats: Any) -> Stats:
    spec = getattr(stats, "spec_decode", None)
    counters = (
        ()
        if spec is None
        else (spec.num_drafts, spec.num_draft_tokens, spec.num_accepted_tokens, list(spec.accepted_per_pos))
    )
    return Stats(
        stats.num_running,
        stats.num_waiting,
        float(stats.kv_cache_usage),
        stats.prefix_cache_queries,
        stats.prefix_cache_hits,
        stats.num_preemptions,
        stats.num_kv_blocks,
        stats.block_size,
        *counters,
    )


def ready_message(engine: EngineLike) -> Ready:
    return Ready(os.getpid(), int(engine.max_model_len), stats_message(engine.stats()))


def _logprob(e: Any) -> Logprob:
    """An engine TokenLogprob as it travels (rank is set for prompt logprobs only)."""
    return Logprob(
        e.token_id, float(e.logprob), [(t, float(lp)) for t, lp in e.top_logprobs], getattr(e, "rank", None)
    )


def _logprobs(entries: list[Any] | None) -> list[Logprob] | None:
    return None if entries is None else [_logprob(e) for e in entries]


def _prompt_logprobs(entries: list[Any] | None) -> list[Logprob | None] | None:
    return None if entries is None else [None if e is None else _logprob(e) for e in entries]


def token_output(o: Any) -> TokenOutput:
    """An engine RequestOutput as it travels (its text, empty with detokenize=False, stays behind)."""
    return TokenOutput(
        o.request_id,
        o.new_token_ids,
        o.finish_reason,
        o.stop_reason,
        o.num_prompt_tokens,
        o.num_output_tokens,
        o.num_cached_tokens,
        _logprobs(o.new_logprobs),
        getattr(o, "error", None),
        _prompt_logprobs(getattr(o, "prompt_logprobs", None)),
    )


class EngineCore:
    def __init__(self, engine: EngineLike, requests: zmq.Socket, outputs: zmq.Socket) -> None:
        self.engine = engine
        self._requests = requests
        self._outputs = outputs
        self._decoder = request_decoder()
        self._encoder = message_encoder()
        self._live: set[str] = set()  # engine requests added and not finished (failed together on errors)
        self._accepted: list[str] = []
        self._rejected: list[Rejected] = []
        self._last_stats: Stats | None = None
        self._failures = 0

    def run(self) -> None:
        """Serves until Shutdown arrives."""
        engine, requests = self.engine, self._requests
        while True:
            if not engine.has_unfinished_requests():
                requests.poll()  # nothing to step: sleep until a message arrives
            if not self._drain():
                return
            try:
                self._iterate()
            except Exception as err:  # e.g. stats() broke: fail what is in flight, keep serving
                logger.exception("engine loop iteration failed")
                self._send(self._fail_all(str(err)), time.monotonic())

    # ---- requests
    def _drain(self) -> bool:
        """Applies every message waiting on the socket; False once Shutdown arrived."""
        while True:
            try:
                data = self._requests.recv(zmq.NOBLOCK)
            except zmq.Again:
                return True
            try:
                message = self._decoder.decode(data)
            except msgspec.DecodeError:
                logger.exception("dropping a request message that does not decode")
                continue
            if isinstance(message, AddGroup):
                self._add(message)
            elif isinstance(message, Abort):
                self._abort(message.request_ids)
            elif isinstance(message, Shutdown):
                return False

    def _add(self, group: AddGroup) -> None:
        added: list[str] = []
        try:
            for request in group.requests:
                self.engine.add_request(
                    request.request_id, request.prompt_token_ids, request.params, request.arrival_time
                )
                added.append(request.request_id)
        except Exception as err:  # InvalidRequestError -> 400, anything else -> 500
            invalid = isinstance(err, InvalidRequestError)
            if not invalid:
                logger.exception("add_request failed for group %s", group.group_id)
            self._abort(added)
            message = err.message if isinstance(err, InvalidRequestError) else str(err)
            param = err.param if isinstance(err, InvalidRequestError) else None
            self._rejected.append(Rejected(group.group_id, message, param, invalid))
            return
        self._live.update(added)
        self._accepted.append(group.group_id)

    def _abort(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            self._safe_abort(request_id)

    def _safe_abort(self, request_id: str) -> None:
        try:
            self.engine.abort_request(request_id)
        except Exception:
            logger.exception("abort_request(%s) failed", request_id)

    # ---- the step
    def _iterate(self) -> None:
        step_start = time.monotonic()
        outputs: list[TokenOutput] = []
        if self.engine.has_unfinished_requests():
            outputs = self._step()
        self._send(outputs, step_start)

    def _step(self) -> list[TokenOutput]:
        try:
            results = self.engine.step()
        except Exception as err:
            logger.exception("engine step failed; failing %d requests in flight", len(self._live))
            return self._fail_all(str(err))
        self._failures = 0
        live = self._live
        for o in results:
            if o.finished:
                live.discard(o.request_id)
        return [token_output(o) for o in results]

    def _fail_all(self, message: str) -> list[TokenOutput]:
        outputs = []
        for request_id in sorted(self._live):
            self._safe_abort(request_id)
            outputs.append(TokenOutput(request_id, [], "abort", None, 0, 0, 0, None, message))
        self._live.clear()
        self._failures += 1
        if self._failures > 1:  # the engine keeps failing with nothing in flight: do not spin
            time.sleep(min(MAX_FAILURE_BACKOFF_S, 0.01 * 2**self._failures))
        return outputs

    def _snapshot(self) -> Stats:
        try:
            return stats_message(self.engine.stats())
        except Exception:
            logger.exception("engine stats failed")
            return self._last_stats or Stats(0, 0, 0.0, 0, 0, 0, 0, 0)

    def _send(self, outputs: list[TokenOutput], step_start: float) -> None:
        stats = self._snapshot()
        if not (outputs or self._accepted or self._rejected or stats != self._last_stats):
            return
        message = StepOutputs(outputs, self._accepted, self._rejected, stats, step_start)
        self._accepted, self._rejected, self._last_stats = [], [], stats
        self._outputs.send(self._encoder.encode(message))
