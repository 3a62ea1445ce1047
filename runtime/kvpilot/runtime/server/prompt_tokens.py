"""Prompt tokenization off the event loop, with over-long prompts refused before all of them is tokenized.

Tokenizing (and rendering a chat template) is CPU work; on the event loop it stalls every other request,
/health included. Here it runs on one worker thread (the event loop keeps serving streams and probes while
it runs), and a prompt far longer than max_model_len is refused after tokenizing only a bounded prefix.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any, TypeVar

from kvpilot.runtime.server.openai_errors import invalid_request

T = TypeVar("T")
# Real text averages ~4 characters per token: a prefix of 8 characters per allowed token that already
# needs more tokens than the model takes proves the whole prompt too long without tokenizing the rest.
PREFIX_CHARS_PER_TOKEN = 8
BOUNDARY_SLACK_TOKENS = 16  # a cut prefix can tokenize slightly differently at its end


def prompt_too_long(num_tokens: int, max_model_len: int, param: str) -> Exception:
    return invalid_request(
        f"The prompt is too long: at least {num_tokens} tokens, and this model's context length "
        f"(max_model_len) is {max_model_len} tokens.",
        param,
    )


def encode_bounded(
    tokenizer: Any, text: str, max_model_len: int | None, param: str, **kwargs: Any
) -> list[int]:
    """`tokenizer.encode(text)`, but a text that cannot fit max_model_len tokens is refused early."""
    if max_model_len is not None:
        cut = max_model_len * PREFIX_CHARS_PER_TOKEN
        if len(text) > cut:
            head = tokenizer.encode(text[:cut], **kwargs)
            if len(head) > max_model_len + BOUNDARY_SLACK_TOKENS:
                raise prompt_too_long(len(head) - BOUNDARY_SLACK_TOKENS, max_model_len, param)
    return list(tokenizer.encode(text, **kwargs))


class PromptWorker:
    """One thread for tokenization and chat templates (so they never run on the event loop)."""

    def __init__(self) -> None:
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kvpilot-tokenize")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
