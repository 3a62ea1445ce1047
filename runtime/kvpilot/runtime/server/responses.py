"""OpenAI response bodies and stream chunks, built from engine output deltas (pure functions).

A choice accumulates the deltas of one engine request. The two formats (text completions and chat)
differ only in how a delta, a whole choice and its logprobs are written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

SSE_DONE = b"data: [DONE]\n\n"
_json = msgspec.json.Encoder()  # compact UTF-8 JSON, as json.dumps(ensure_ascii=False, separators=(",", ":"))


def sse_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + _json.encode(payload) + b"\n\n"


class TokenText(Protocol):
    def __call__(self, token_id: int) -> str: ...


@dataclass(frozen=True)
class ResponseMeta:
    id: str
    created: int
    model: str


@dataclass
class Delta:
    text: str
    logprobs: list[Any] | None
    finish_reason: str | None
    stop_reason: int | str | None
    prompt_logprobs: list[Any] | None = None  # with the first delta of a request that asked for them


@dataclass
class ChoiceState:
    """One choice (= one engine request) of a response, accumulated from its deltas."""

    index: int
    first_of_prompt: bool  # counts the prompt's tokens in usage (n choices share one prompt)
    text: str = ""
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    num_prompt_tokens: int = 0
    num_output_tokens: int = 0
    num_cached_tokens: int = 0
    logprobs: list[Any] | None = None
    text_offsets: list[int] = field(default_factory=list)
    prompt_logprobs: list[Any] | None = None

    def apply(self, event: Any) -> Delta:
        """`event` is a ChoiceDelta (server/output_processor.py)."""
        self.text += event.new_text
        self.num_prompt_tokens = event.num_prompt_tokens
        self.num_output_tokens = event.num_output_tokens
        self.num_cached_tokens = event.num_cached_tokens
        if event.new_logprobs is not None:
            self.logprobs = (self.logprobs or []) + list(event.new_logprobs)
        if event.finished:
            self.finish_reason = event.finish_reason
            self.stop_reason = event.stop_reason
        prompt_logprobs = getattr(event, "prompt_logprobs", None)
        if prompt_logprobs is not None:
            self.prompt_logprobs = prompt_logprobs
        return Delta(
            event.new_text,
            event.new_logprobs,
            self.finish_reason if event.finished else None,
            self.stop_reason,
            prompt_logprobs,
        )


def new_choices(num_prompts: int, n: int) -> list[ChoiceState]:
    """Choice index = prompt index * n + choice number, as OpenAI and vLLM number them."""
    return [ChoiceState(index=i, first_of_prompt=i % n == 0) for i in range(num_prompts * n)]


def usage(choices: list[ChoiceState]) -> dict[str, Any]:
    prompt = sum(c.num_prompt_tokens for c in choices if c.first_of_prompt)
    completion = sum(c.num_output_tokens for c in choices)
    cached = sum(c.num_cached_tokens for c in choices if c.first_of_prompt)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


class CompletionFormat:
    """/v1/completions: `text` choices; logprobs as tokens / token_logprobs / top_logprobs / text_offset."""

    object = "text_completion"
    chunk_object = "text_completion"
    id_prefix = "cmpl-"

    def __init__(self, token_text: TokenText) -> None:
        self._token_text = token_text

    def logprobs(self, entries: list[Any], start_offset: int) -> dict[str, Any]:
        tokens = [self._token_text(e.token_id) for e in entries]
        offsets, offset = [], start_offset
        for token in tokens:
            offsets.append(offset)
            offset += len(token)
        tops = [
            {**{self._token_text(t): lp for t, lp in e.top_logprobs}, tok: e.logprob}
            for e, tok in zip(entries, tokens, strict=True)
        ]
        return {
            "tokens": tokens,
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": tops,
            "text_offset": offsets,
        }

    def prompt_logprobs(self, entries: list[Any]) -> list[dict[str, dict[str, Any]] | None]:
        """vLLM's shape: None for the first prompt token, then {token_id: {logprob, rank, decoded_token}}
        holding the prompt token and the top alternatives (ranks 1..k)."""
        shaped: list[dict[str, dict[str, Any]] | None] = []
        for e in entries:
            if e is None:
                shaped.append(None)
                continue
            row = {
                str(t): {"logprob": lp, "rank": rank, "decoded_token": self._token_text(t)}
                for rank, (t, lp) in enumerate(e.top_logprobs, 1)
            }
            row[str(e.token_id)] = {
                "logprob": e.logprob,
                "rank": e.rank,
                "decoded_token": self._token_text(e.token_id),
            }
            shaped.append(row)
        return shaped

    def opening_chunks(self, meta: ResponseMeta, choices: list[ChoiceState]) -> list[dict[str, Any]]:
        return []

    def delta_chunks(self, meta: ResponseMeta, choice: ChoiceState, delta: Delta) -> list[dict[str, Any]]:
        if not (delta.text or delta.logprobs or delta.finish_reason or delta.prompt_logprobs):
            return []
        logprobs = None
        if delta.logprobs:
            logprobs = self.logprobs(delta.logprobs, len(choice.text) - len(delta.text))
        entry = {
            "index": choice.index,
            "text": delta.text,
            "logprobs": logprobs,
            "finish_reason": delta.finish_reason,
            "stop_reason": delta.stop_reason,
        }
        if delta.prompt_logprobs is not None:
            entry["prompt_logprobs"] = self.prompt_logprobs(delta.prompt_logprobs)
        return [_chunk(meta, self.chunk_object, [entry])]

    def response(self, meta: ResponseMeta, choices: list[ChoiceState]) -> dict[str, Any]:
        entries: list[dict[str, Any]] = [
            {
                "index": c.index,
                "text": c.text,
                "logprobs": None if c.logprobs is None else self.logprobs(c.logprobs, 0),
                "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason,
            }
            for c in choices
        ]
        for entry, c in zip(entries, choices, strict=True):
            if c.prompt_logprobs is not None:  # only when asked: other responses keep OpenAI's shape
                entry["prompt_logprobs"] = self.prompt_logprobs(c.prompt_logprobs)
        return {
            "id": meta.id,
            "object": self.object,
            "created": meta.created,
            "model": meta.model,
            "choices": entries,
            "usage": usage(choices),
        }


class ChatFormat:
    """/v1/chat/completions: assistant messages; logprobs as content[{token, logprob, bytes, top_...}]."""

    object = "chat.completion"
    chunk_object = "chat.completion.chunk"
    id_prefix = "chatcmpl-"

    def __init__(self, token_text: TokenText) -> None:
        self._token_text = token_text

    def _token(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self._token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    def logprobs(self, entries: list[Any]) -> dict[str, Any]:
        return {
            "content": [
                {
                    **self._token(e.token_id, e.logprob),
                    "top_logprobs": [self._token(t, lp) for t, lp in e.top_logprobs],
                }
                for e in entries
            ]
        }

    def opening_chunks(self, meta: ResponseMeta, choices: list[ChoiceState]) -> list[dict[str, Any]]:
        role = {"role": "assistant", "content": ""}
        return [
            _chunk(
                meta,
                self.chunk_object,
                [{"index": c.index, "delta": role, "logprobs": None, "finish_reason": None}],
            )
            for c in choices
        ]

    def delta_chunks(self, meta: ResponseMeta, choice: ChoiceState, delta: Delta) -> list[dict[str, Any]]:
        chunks = []
        if delta.text or delta.logprobs:
            logprobs = self.logprobs(delta.logprobs) if delta.logprobs else None
            chunks.append(
                _chunk(
                    meta,
                    self.chunk_object,
                    [
                        {
                            "index": choice.index,
                            "delta": {"content": delta.text},
                            "logprobs": logprobs,
                            "finish_reason": None,
                        }
                    ],
                )
            )
        if delta.finish_reason:
            chunks.append(
                _chunk(
                    meta,
                    self.chunk_object,
                    [
                        {
                            "index": choice.index,
                            "delta": {},
                            "logprobs": None,
                            "finish_reason": delta.finish_reason,
                            "stop_reason": delta.stop_reason,
                        }
                    ],
                )
            )
        return chunks

    def response(self, meta: ResponseMeta, choices: list[ChoiceState]) -> dict[str, Any]:
        entries = [
            {
                "index": c.index,
                "message": {"role": "assistant", "content": c.text},
                "logprobs": None if c.logprobs is None else self.logprobs(c.logprobs),
                "finish_reason": c.finish_reason,
                "stop_reason": c.stop_reason,
            }
            for c in choices
        ]
        return {
            "id": meta.id,
            "object": self.object,
            "created": meta.created,
            "model": meta.model,
            "choices": entries,
            "usage": usage(choices),
        }


EndpointFormat = CompletionFormat | ChatFormat  # how one endpoint writes its bodies and chunks


def _chunk(meta: ResponseMeta, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": meta.id, "object": obj, "created": meta.created, "model": meta.model, "choices": choices}


def usage_chunk(meta: ResponseMeta, obj: str, choices: list[ChoiceState]) -> dict[str, Any]:
    return {**_chunk(meta, obj, []), "usage": usage(choices)}
