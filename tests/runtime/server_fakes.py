"""A small fake engine with the LLMEngine interface, and an in-process server around it.

The fake generates one character token per step per running request: token i of a request is
chr(ord('a') + (len(prompt) + i + seed) % 26), so results are easy to predict in tests. A prompt
containing EXPLODE makes the next step() raise.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from kvpilot.runtime.errors import InvalidRequestError
from kvpilot.runtime.sampling_params import SamplingParams
from kvpilot.runtime.server.app import build_app
from kvpilot.runtime.server.engine_client import EngineClient
from kvpilot.runtime.server.metrics import ServerMetrics
from kvpilot.runtime.server.serve import GracefulShutdown, _Server

EOS = 3
FAIL_MARKER = "EXPLODE"  # in a prompt: the engine's step() raises
CRASH_MARKER = "CRASH"  # as a chat message: the tokenizer raises an unexpected error


@dataclass
class FakeLogprob:
    token_id: int
    logprob: float
    top_logprobs: list[tuple[int, float]]


@dataclass
class FakeOutput:
    request_id: str
    new_token_ids: list[int]
    new_text: str
    new_logprobs: list[FakeLogprob] | None
    finished: bool
    finish_reason: str | None
    stop_reason: int | str | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int = 0


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


class FakeTokenizer:
    eos_token_ids = frozenset({EOS})
    bos_token_id = None
    vocab_size = 0x110000

    def __init__(self, chat_template: str | None = "<fake>") -> None:
        self.chat_template = chat_template

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        return "".join(chr(i) for i in ids if not (skip_special_tokens and i == EOS))

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if self.chat_template is None:
            raise InvalidRequestError("this model has no chat template", "messages")
        if any(m["content"] == CRASH_MARKER for m in messages):
            raise RuntimeError("a bug in the template code")
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")


def expected_text(prompt_len: int, num_tokens: int, seed: int = 0) -> str:
    return "".join(chr(ord("a") + (prompt_len + i + seed) % 26) for i in range(num_tokens))


@dataclass
class _Seq:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    output: list[int] = field(default_factory=list)
    text: str = ""


class FakeEngine:
    def __init__(
        self,
        *,
        max_model_len: int = 64,
        max_num_seqs: int = 8,
        step_delay: float = 0.0,
        tokenizer: FakeTokenizer | None = None,
        num_kv_blocks: int = 32,
        block_size: int = 4,
    ) -> None:
        self.tokenizer = tokenizer or FakeTokenizer()
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.step_delay = step_delay
        self.num_kv_blocks = num_kv_blocks
        self.block_size = block_size
        self.waiting: list[_Seq] = []
        self.running: list[_Seq] = []
        self.aborted: list[str] = []
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
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise InvalidRequestError("prompt must not be empty", "prompt")
        if request_id in self._known:
            raise InvalidRequestError(f"duplicate request id {request_id}")
        max_tokens = params.max_tokens if params.max_tokens is not None else self.max_model_len - len(ids)
        if len(ids) + max_tokens > self.max_model_len:
            raise InvalidRequestError(
                f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds "
                f"max_model_len ({self.max_model_len})",
                "max_tokens",
            )
        self._known.add(request_id)
        self._queries += len(ids)
        self.waiting.append(_Seq(request_id, ids, params, max_tokens))

    def abort_request(self, request_id: str) -> None:
        for queue in (self.waiting, self.running):
            for seq in list(queue):
                if seq.request_id == request_id:
                    queue.remove(seq)
                    self.aborted.append(request_id)
                    self._abort_outputs.append(
                        FakeOutput(
                            request_id, [], "", None, True, "abort", None, len(seq.prompt), len(seq.output)
                        )
                    )

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running or self._abort_outputs)

    def step(self) -> list[FakeOutput]:
        if self.step_delay:
            time.sleep(self.step_delay)
        while self.waiting and len(self.running) < self.max_num_seqs:
            self.running.append(self.waiting.pop(0))
        if any(FAIL_MARKER in self.tokenizer.decode(s.prompt) for s in self.running):
            raise RuntimeError("fake engine step failed")
        outputs, self._abort_outputs = self._abort_outputs, []
        for seq in list(self.running):
            outputs.append(self._advance(seq))
        return outputs

    def _advance(self, seq: _Seq) -> FakeOutput:
        token = ord("a") + (len(seq.prompt) + len(seq.output) + (seq.params.seed or 0)) % 26
        seq.output.append(token)
        new_text = chr(token)
        seq.text += new_text
        finish, stop_reason = None, None
        for stop in seq.params.stop:
            if seq.text.endswith(stop):
                finish, stop_reason = "stop", stop  # tests use one-character stop strings
                new_text = new_text if seq.params.include_stop_str_in_output else ""
        if finish is None and len(seq.output) >= seq.max_tokens:
            finish = "length"
        logprobs = None
        if seq.params.logprobs is not None:
            tops = [(token + k, -0.5 - k) for k in range(seq.params.logprobs)]
            logprobs = [FakeLogprob(token, -0.5, tops)]
        if finish:
            self.running.remove(seq)
        return FakeOutput(
            seq.request_id,
            [token],
            new_text,
            logprobs,
            finish is not None,
            finish,
            stop_reason,
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


class InProcessServer:
    """The real app + engine loop + uvicorn, in a background thread, on a free 127.0.0.1 port."""

    def __init__(
        self,
        engine_factory: Callable[[], Any],
        *,
        served_model_name: str = "fake-model",
        max_waiting_requests: int = 256,
        grace_seconds: float = 10.0,
    ) -> None:
        self._factory = engine_factory
        self.served_model_name = served_model_name
        self._max_waiting = max_waiting_requests
        self._grace = grace_seconds
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.client: EngineClient | None = None
        self.shutdown: GracefulShutdown | None = None
        self.load_error: BaseException | None = None

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        metrics = ServerMetrics(self.served_model_name, {"cache_dtype": "auto"})
        self.client = EngineClient(
            self._factory,
            metrics,
            served_model_name=self.served_model_name,
            max_waiting_requests=self._max_waiting,
        )
        app = build_app(self.client, metrics)
        self.server = _Server(_uvicorn_config(app))
        self.shutdown = GracefulShutdown(self.client, self.server, self._grace)
        self.client.start(self.loop, on_load_failed=self._load_failed)
        self._ready.set()
        try:
            await self.server.serve(sockets=[self._sock])
        finally:
            self.client.stop()

    def _load_failed(self, err: BaseException) -> None:
        self.load_error = err

    def start(self, wait_healthy: bool = True, timeout: float = 10.0) -> InProcessServer:
        self._thread.start()
        self._ready.wait(timeout)
        deadline = time.monotonic() + timeout
        while wait_healthy and time.monotonic() < deadline:
            try:
                if httpx.get(self.base_url + "/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.02)
        if wait_healthy:
            raise TimeoutError("in-process server did not become healthy")
        return self

    def call(self, fn: Callable[[], Any]) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(fn)

    def stop(self, timeout: float = 10.0) -> None:
        if self.loop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(setattr, self.server, "should_exit", True)
        self._thread.join(timeout)

    @property
    def stopped(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def _uvicorn_config(app: Any) -> Any:
    import uvicorn

    return uvicorn.Config(app, log_level="warning", lifespan="off", timeout_graceful_shutdown=2)
