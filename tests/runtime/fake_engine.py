"""A small fake engine with the LLMEngine interface, built inside the engine-core process by the server tests.

The server tests start the real engine-core process with `EngineCoreSpec(FACTORY, kwargs)`: this
module is imported there (keep it light: no server, no httpx). The fake produces token ids only, as
the real engine does for the server; the HTTP process turns them into text. Token i of a request is
ord('a') + (len(prompt) + i + seed) % 26, so texts are easy to predict (see expected_text). A prompt
containing EXPLODE makes the next step() raise.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvpilot.runtime.errors import InvalidRequestError
from kvpilot.runtime.sampling_params import SamplingParams

FACTORY = "tests.runtime.fake_engine:make_engine"
EOS = 3
FAIL_MARKER = "EXPLODE"  # in a prompt: the engine's step() raises


def expected_text(prompt_len: int, num_tokens: int, seed: int = 0) -> str:
    return "".join(chr(ord("a") + (prompt_len + i + seed) % 26) for i in range(num_tokens))


@dataclass
class FakeLogprob:
    token_id: int
    logprob: float
    top_logprobs: list[tuple[int, float]]


@dataclass
class FakeOutput:
    request_id: str
    new_token_ids: list[int]
    new_logprobs: list[FakeLogprob] | None
    finished: bool
    finish_reason: str | None
    stop_reason: int | str | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int = 0
    error: str | None = None


@dataclass
class FakeStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    num_kv_blocks: int
    block_size: int


@dataclass
class _Seq:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    output: list[int] = field(default_factory=list)


def hold_the_gil(seconds: float) -> None:
    """Runs one C call that never releases the GIL for about `seconds` (threads in this process stall)."""
    n = 1_000_000
    start = time.perf_counter()
    sum(range(n))
    per_item = max((time.perf_counter() - start) / n, 1e-10)
    sum(range(int(seconds / per_item)))


class FakeEngine:
    def __init__(
        self,
        *,
        max_model_len: int = 64,
        max_num_seqs: int = 8,
        step_delay: float = 0.0,
        gil_hold: float = 0.0,
        num_kv_blocks: int = 32,
        block_size: int = 4,
        abort_log: str | None = None,
    ) -> None:
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.step_delay = step_delay
        self.gil_hold = gil_hold
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.abort_log = Path(abort_log) if abort_log else None
        self.waiting: list[_Seq] = []
        self.running: list[_Seq] = []
        self._abort_outputs: list[FakeOutput] = []
        self._queries = 0
        self._known: set[str] = set()

    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None:
        if not isinstance(prompt, list):
            raise InvalidRequestError("the server sends token ids", "prompt")
        if not prompt:
            raise InvalidRequestError("prompt must not be empty", "prompt")
        if request_id in self._known:
            raise InvalidRequestError(f"duplicate request id {request_id}")
        max_tokens = params.max_tokens if params.max_tokens is not None else self.max_model_len - len(prompt)
        if len(prompt) + max_tokens > self.max_model_len:
            raise InvalidRequestError(
                f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds "
                f"max_model_len ({self.max_model_len})",
                "max_tokens",
            )
        self._known.add(request_id)
        self._queries += len(prompt)
        self.waiting.append(_Seq(request_id, list(prompt), params, max_tokens))

    def abort_request(self, request_id: str) -> None:
        for queue in (self.waiting, self.running):
            for seq in list(queue):
                if seq.request_id == request_id:
                    queue.remove(seq)
                    if self.abort_log is not None:
                        with self.abort_log.open("a") as log:
                            log.write(request_id + "\n")
                    self._abort_outputs.append(
                        FakeOutput(
                            request_id, [], None, True, "abort", None, len(seq.prompt), len(seq.output)
                        )
                    )

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running or self._abort_outputs)

    def step(self) -> list[FakeOutput]:
        if self.step_delay:
            time.sleep(self.step_delay)
        if self.gil_hold:
            hold_the_gil(self.gil_hold)
        while self.waiting and len(self.running) < self.max_num_seqs:
            self.running.append(self.waiting.pop(0))
        if any(FAIL_MARKER in "".join(map(chr, s.prompt)) for s in self.running):
            raise RuntimeError("fake engine step failed")
        outputs, self._abort_outputs = self._abort_outputs, []
        for seq in list(self.running):
            outputs.append(self._advance(seq))
        return outputs

    def _advance(self, seq: _Seq) -> FakeOutput:
        token = ord("a") + (len(seq.prompt) + len(seq.output) + (seq.params.seed or 0)) % 26
        seq.output.append(token)
        finish = "length" if len(seq.output) >= seq.max_tokens else None
        logprobs = None
        if seq.params.logprobs is not None:
            tops = [(token + k, -0.5 - k) for k in range(seq.params.logprobs)]
            logprobs = [FakeLogprob(token, -0.5, tops)]
        if finish:
            self.running.remove(seq)
        return FakeOutput(
            seq.request_id,
            [token],
            logprobs,
            finish is not None,
            finish,
            None,
            len(seq.prompt),
            len(seq.output),
        )

    def stats(self) -> FakeStats:
        used = sum(-(-(len(s.prompt) + len(s.output)) // self.block_size) for s in self.running)
        return FakeStats(
            len(self.running),
            len(self.waiting),
            used / self.num_kv_blocks,
            self._queries,
            0,
            0,
            self.num_kv_blocks,
            self.block_size,
        )


def make_engine(*, load_gate: str | None = None, load_error: str | None = None, **kwargs: Any) -> FakeEngine:
    """The factory the engine-core process calls. `load_gate`: loading lasts until that file exists;
    `load_error`: loading fails with that message."""
    if load_gate is not None:
        deadline = time.monotonic() + 30
        while not os.path.exists(load_gate) and time.monotonic() < deadline:
            time.sleep(0.01)
    if load_error is not None:
        raise FileNotFoundError(load_error)
    return FakeEngine(**kwargs)
