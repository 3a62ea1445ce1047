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
