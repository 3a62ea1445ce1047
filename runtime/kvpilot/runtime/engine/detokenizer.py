"""Incremental detokenization: the text each new token adds, without re-decoding the whole output.

Decodes a short window of tokens twice (with and without the newest ones) and emits the difference.
The window starts with a few prompt tokens, so a token's leading space is rendered as it is in context.
Text that ends in an incomplete UTF-8 character (U+FFFD) is held until the next token completes it;
flush() releases whatever is held when the request ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

PROMPT_CONTEXT_TOKENS = 5
REPLACEMENT_CHAR = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Decoder, prompt_token_ids: Sequence[int], skip_special_tokens: bool = True):
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._tokens: list[int] = list(prompt_token_ids[-PROMPT_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._tokens)

    def _decode(self, start: int, stop: int | None = None) -> str:
        return self._tokenizer.decode(self._tokens[start:stop], skip_special_tokens=self._skip_special)

    def add(self, token_id: int) -> str:
        """Append one token and return the new, complete text it (and any held tokens) produce."""
        self._tokens.append(token_id)
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        full_text = self._decode(self._prefix_offset)
        if len(full_text) <= len(prefix_text) or full_text.endswith(REPLACEMENT_CHAR):
            return ""  # nothing visible yet, or a multi-byte character is still incomplete
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._tokens)
        return full_text[len(prefix_text) :]

    def flush(self) -> str:
        """Text of held tokens (an incomplete character renders as U+FFFD, as a full decode would)."""
        if self._read_offset == len(self._tokens):
            return ""
        prefix_text = self._decode(self._prefix_offset, self._read_offset)
        full_text = self._decode(self._prefix_offset)
        self._prefix_offset = self._read_offset = len(self._tokens)
        return full_text[len(prefix_text) :]
