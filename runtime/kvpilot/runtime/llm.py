"""Offline generation: `LLM(model_dir).generate(prompts, SamplingParams(...))`."""

from __future__ import annotations

import itertools
from typing import Any

from kvpilot.runtime.engine.output import CompletionOutput, RequestOutput, TokenLogprob
from kvpilot.runtime.errors import InvalidRequestError
from kvpilot.runtime.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    """Loads a Hugging Face model directory and generates for a batch of prompts, continuously batched.

    `engine_args` are EngineArgs fields (max_model_len, max_num_seqs, enable_prefix_caching, ...)."""

    def __init__(self, model: str, **engine_args: Any) -> None:
        from kvpilot.runtime.engine.engine_args import EngineArgs
        from kvpilot.runtime.engine.llm_engine import LLMEngine

        self.engine = LLMEngine.from_args(EngineArgs(model=str(model), **engine_args))
        self._ids = itertools.count()

    @classmethod
    def from_engine(cls, engine: Any) -> LLM:
        llm = cls.__new__(cls)
        llm.engine = engine
        llm._ids = itertools.count()
        return llm

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: str | list[str] | list[int] | list[list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[CompletionOutput]:
        """One CompletionOutput per prompt, in order. A single string or a single list of token ids
        counts as one prompt."""
        batch = _normalize_prompts(prompts)
        all_params = _normalize_params(params, len(batch))
        # an empty string stays "" and is refused per request by the engine
        prompt_ids: list[Any] = [
            self.engine.tokenizer.encode(p) if isinstance(p, str) and p else p for p in batch
        ]
        request_ids = [f"llm-{next(self._ids)}" for _ in batch]
        self._add_all(request_ids, prompt_ids, all_params)
        deltas: dict[str, list[RequestOutput]] = {rid: [] for rid in request_ids}
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                if out.request_id in deltas:
                    deltas[out.request_id].append(out)
        return [
            _completion(ids, deltas[rid], p)
            for rid, ids, p in zip(request_ids, prompt_ids, all_params, strict=True)
        ]

    def _add_all(self, request_ids: list[str], prompt_ids: list[Any], params: list[SamplingParams]) -> None:
        added: list[str] = []
        try:
            for rid, ids, p in zip(request_ids, prompt_ids, params, strict=True):
                self.engine.add_request(rid, ids, p)
                added.append(rid)
        except Exception:
            for rid in added:
                self.engine.abort_request(rid)
            while self.engine.has_unfinished_requests():
                self.engine.step()
            raise


def _normalize_prompts(prompts: Any) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if not isinstance(prompts, (list, tuple)):
        raise InvalidRequestError(
            "prompts must be a string, a list of strings or token id lists", param="prompt"
        )
    if prompts and all(isinstance(t, int) and not isinstance(t, bool) for t in prompts):
        return [list(prompts)]
    for p in prompts:
        if not isinstance(p, (str, list, tuple)):
            raise InvalidRequestError(f"prompt {p!r} is neither text nor a list of token ids", param="prompt")
    return [p if isinstance(p, str) else list(p) for p in prompts]


def _normalize_params(params: SamplingParams | list[SamplingParams] | None, n: int) -> list[SamplingParams]:
    if params is None:
        return [SamplingParams() for _ in range(n)]
    if isinstance(params, SamplingParams):
        return [params] * n
    if len(params) != n:
        raise InvalidRequestError(f"got {len(params)} SamplingParams for {n} prompts", param="params")
    return list(params)


def _completion(
    prompt_ids: list[int], deltas: list[RequestOutput], params: SamplingParams
) -> CompletionOutput:
    token_ids = [t for d in deltas for t in d.new_token_ids]
    logprobs: list[TokenLogprob] | None = None
    if params.logprobs is not None:
        logprobs = [lp for d in deltas for lp in (d.new_logprobs or [])]
    last = deltas[-1]
    return CompletionOutput(
        prompt_token_ids=list(prompt_ids),
        text="".join(d.new_text for d in deltas),
        token_ids=token_ids,
        finish_reason=last.finish_reason,
        stop_reason=last.stop_reason,
        logprobs=logprobs,
        usage={
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(token_ids),
            "total_tokens": len(prompt_ids) + len(token_ids),
        },
        error=last.error,
        prompt_logprobs=next((d.prompt_logprobs for d in deltas if d.prompt_logprobs is not None), None),
    )
