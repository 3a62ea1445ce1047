"""What the engine hands back: per-step deltas for each request, engine stats, offline results."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top_logprobs: list[tuple[int, float]]
    rank: int | None = None  # 1 + tokens more likely than token_id (set for prompt logprobs)


@dataclass(slots=True)
class RequestOutput:
    """What changed for one request since the previous step (a delta, ready to stream)."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    new_logprobs: list[TokenLogprob] | None
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort"
    stop_reason: int | str | None  # the stop token id or stop string that matched
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    error: str | None = None  # set when the request failed (finish_reason "abort")
    # SamplingParams.prompt_logprobs: one entry per prompt token (None for the first), in the first
    # output that carries a generated token
    prompt_logprobs: list[TokenLogprob | None] | None = None


def merge_outputs(outputs: list[RequestOutput]) -> RequestOutput:
    """One delta for consecutive deltas of one request (a speculative step emits several tokens)."""
    if len(outputs) == 1:
        return outputs[0]
    last = outputs[-1]
    logprobs = (
        [e for o in outputs for e in (o.new_logprobs or [])] if outputs[0].new_logprobs is not None else None
    )
    prompt_logprobs = next((o.prompt_logprobs for o in outputs if o.prompt_logprobs is not None), None)
    return RequestOutput(
        request_id=last.request_id,
        new_token_ids=[t for o in outputs for t in o.new_token_ids],
        new_text="".join(o.new_text for o in outputs),
        new_logprobs=logprobs,
        finished=last.finished,
        finish_reason=last.finish_reason,
        stop_reason=last.stop_reason,
        num_prompt_tokens=last.num_prompt_tokens,
        num_output_tokens=last.num_output_tokens,
        num_cached_tokens=last.num_cached_tokens,
        error=last.error,
        prompt_logprobs=prompt_logprobs,
    )


@dataclass(frozen=True)
class SpecDecodeStats:
    """Cumulative speculative-decoding counters (vLLM's vllm:spec_decode_* metrics)."""

    num_drafts: int = 0  # sequence-steps that verified at least one draft token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: tuple[int, ...] = ()  # accepted tokens at draft position 0, 1, ...


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    kv_cache_usage: float  # 0..1, blocks held by sequences
    prefix_cache_queries: int  # tokens, cumulative
    prefix_cache_hits: int  # tokens, cumulative
    num_preemptions: int  # cumulative
    num_kv_blocks: int
    block_size: int
    spec_decode: SpecDecodeStats | None = None  # set when speculative decoding is on


@dataclass
class CompletionOutput:
    """One finished request of LLM.generate."""

    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: int | str | None
    logprobs: list[TokenLogprob] | None
    usage: dict[str, int] = field(default_factory=dict)  # prompt_tokens, completion_tokens, total_tokens
    error: str | None = None
    prompt_logprobs: list[TokenLogprob | None] | None = None  # SamplingParams.prompt_logprobs
