"""What the prefix-aware policy hashes: chained hashes over fixed-size blocks of the prompt's prefix.

The gateway has no tokenizer, so it hashes *characters*, not tokens: the prompt text of /v1/completions,
or a canonical serialization of /v1/chat/completions' tools + messages (role and content, in order, with
separators that cannot appear by accident). The runtime applies the chat template to exactly that
sequence, so two requests whose serialized messages share their first N characters also share (roughly)
their first N/4 tokens, which is what the runtime's prefix cache matches on. A block of 64 characters is
~16 tokens, the runtime's KV block size; only full blocks are hashed (a partial block is never cached).

Each block's hash covers the whole prefix up to and including it (``h_i = H(h_{i-1} || block_i)``), so a
match on block i implies a match on every block before it, as in the runtime's own prefix cache.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

_ROLE_SEP = "\x1e"  # record separator between messages
_FIELD_SEP = "\x1f"  # unit separator between role and content
_TOKENS_PER_BLOCK = 16


def prompt_text(body: dict[str, Any]) -> str:
    """The text whose prefix decides where a request is likely cached ('' when there is none)."""
    if "messages" in body:
        return _chat_text(body.get("messages"), body.get("tools"))
    return _completion_text(body.get("prompt"))


def _completion_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        first = prompt[0]
        if isinstance(first, int):  # token ids: blocks of ids, rendered as text
            return _token_text(prompt)
        if isinstance(first, str):  # a batch: route on its first prompt
            return first
        if isinstance(first, list):
            return _token_text(first)
    return ""


def _token_text(ids: Sequence[Any]) -> str:
    # 4 characters per id keeps the block arithmetic the same as for text (~16 ids per 64-char block).
    return "".join(f"{int(i) % 65536:04x}" for i in ids if isinstance(i, int))


def _chat_text(messages: Any, tools: Any) -> str:
    parts = [json.dumps(tools, sort_keys=True)] if tools else []
    if isinstance(messages, list):
        for message in messages:
            if isinstance(message, dict):
                parts.append(f"{message.get('role', '')}{_FIELD_SEP}{_content_text(message.get('content'))}")
    return _ROLE_SEP.join(parts)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "")
            if isinstance(part, dict) and part.get("type") == "text"
            else json.dumps(part, sort_keys=True)
            for part in content
        )
    return "" if content is None else json.dumps(content, sort_keys=True)


def block_hashes(text: str, block_chars: int, max_blocks: int) -> tuple[int, ...]:
    """Chained 64-bit hashes of the full `block_chars`-sized blocks of `text` (at most `max_blocks`)."""
    hashes: list[int] = []
    previous = b""
    n_blocks = min(len(text) // block_chars, max_blocks)
    for i in range(n_blocks):
        block = text[i * block_chars : (i + 1) * block_chars].encode("utf-8", "surrogatepass")
        digest = hashlib.blake2b(previous + block, digest_size=8).digest()
        hashes.append(int.from_bytes(digest, "big"))
        previous = digest
    return tuple(hashes)


_MAX_TOKENS = 2**31 - 1


def estimate_tokens(body: dict[str, Any], text: str) -> int:
    """Prompt tokens (~4 characters each) plus the requested output budget: the load a request adds."""
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or _TOKENS_PER_BLOCK
    if not isinstance(max_tokens, int) or not 0 <= max_tokens <= _MAX_TOKENS:
        max_tokens = _TOKENS_PER_BLOCK  # the runtime refuses it; the estimate stays a small number
    return len(text) // 4 + max_tokens
