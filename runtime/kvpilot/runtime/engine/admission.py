"""What a request may ask for, checked before it enters the engine (no torch): its prompt as token ids in
the vocabulary, and how many tokens it may generate within max_model_len and the KV cache."""

from __future__ import annotations

from typing import Any

from kvpilot.runtime.errors import InvalidRequestError


def prompt_token_ids(prompt: str | list[int], tokenizer: Any, vocab_size: int) -> list[int]:
    """A text prompt tokenized, or a list of token ids checked against [0, vocab_size)."""
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt) if prompt else []
    elif isinstance(prompt, (list, tuple)):
        ids = list(prompt)
        bad = next(
            (t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size),
            None,
        )
        if bad is not None:
            raise InvalidRequestError(
                f"prompt token id {bad!r} is not in the vocabulary [0, {vocab_size})", param="prompt"
            )
    else:
        raise InvalidRequestError("prompt must be a string or a list of token ids", param="prompt")
    if not ids:
        raise InvalidRequestError("prompt is empty", param="prompt")
    return ids


def max_tokens_for(prompt_len: int, requested: int | None, max_model_len: int, kv_capacity: int) -> int:
    """The tokens a request may generate: `requested`, or all the room left when None."""
    limit = min(max_model_len, kv_capacity)
    what = (
        f"max_model_len is {max_model_len}"
        if limit == max_model_len
        else f"the KV cache holds only {kv_capacity} tokens"
    )
    if prompt_len >= limit:
        raise InvalidRequestError(
            f"prompt has {prompt_len} tokens, leaving no room to generate: {what}", param="prompt"
        )
    if requested is None:
        return limit - prompt_len
    if prompt_len + requested > limit:
        raise InvalidRequestError(
            f"prompt ({prompt_len} tokens) + max_tokens ({requested}) = {prompt_len + requested} "
            f"tokens exceeds the limit of {limit}: {what}",
            param="max_tokens",
        )
    return requested
