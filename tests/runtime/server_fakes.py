"""The real server around a fake engine: the HTTP side in a thread of the test process, the engine core a
real child process that builds the fake engine of fake_engine.py (the production process topology).

The fake tokenizer maps characters to their code points, so the fake engine's tokens ('a'..'z') read
back as predictable text (fake_engine.expected_text).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
from kvpilot.runtime.engine_core.client import EngineCoreSpec
from kvpilot.runtime.errors import InvalidRequestError
from kvpilot.runtime.server.request_body import BodyLimits
from kvpilot.runtime.server.serve import RuntimeServer

from tests.runtime.fake_engine import EOS, FACTORY, FAIL_MARKER, expected_text

CRASH_MARKER = "CRASH"  # as a chat message: the tokenizer raises an unexpected error

__all__ = ["CRASH_MARKER", "FAIL_MARKER", "FakeTokenizer", "InProcessServer", "expected_text", "fake_engine"]


def fake_engine(**kwargs: Any) -> EngineCoreSpec:
    """The engine core builds fake_engine.make_engine(**kwargs)."""
    return EngineCoreSpec(FACTORY, kwargs)


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


class InProcessServer:
    """The real app, engine client and uvicorn in a background thread, on a free 127.0.0.1 port; the
    engine core runs in its own process."""

    def __init__(
        self,
        core: EngineCoreSpec | None = None,
        *,
        tokenizer_factory: Callable[[], Any] = FakeTokenizer,
        served_model_name: str = "fake-model",
        max_waiting_requests: int = 256,
        grace_seconds: float = 10.0,
        body_limits: BodyLimits | None = None,
    ) -> None:
        self.runtime = RuntimeServer(
            core or fake_engine(),
            tokenizer_factory,
            served_model_name=served_model_name,
            model_root=None,
            max_waiting_requests=max_waiting_requests,
            grace_seconds=grace_seconds,
            cache_config={"cache_dtype": "auto"},
            log_level="warning",
            body_limits=body_limits,
        )
        self.served_model_name = served_model_name
        self.client = self.runtime.client
        self.shutdown = self.runtime.shutdown
        self.server = self.runtime.server
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.exit_code: int | None = None

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.exit_code = await self.runtime.run(sockets=[self._sock], handle_signals=False)

    def start(self, wait_healthy: bool = True, timeout: float = 30.0) -> InProcessServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while wait_healthy and time.monotonic() < deadline and self._thread.is_alive():
            try:
                if httpx.get(self.base_url + "/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.02)
        if wait_healthy:
            raise TimeoutError(f"in-process server did not become healthy (exit code {self.exit_code})")
        return self

    @property
    def core_pid(self) -> int | None:
        return self.client.core_pid

    def call(self, fn: Callable[[], Any]) -> None:
        assert self.loop is not None
        self.loop.call_soon_threadsafe(fn)

    def stop(self, timeout: float = 15.0) -> None:
        if self.loop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(setattr, self.server, "should_exit", True)
        self._thread.join(timeout)

    @property
    def stopped(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)
