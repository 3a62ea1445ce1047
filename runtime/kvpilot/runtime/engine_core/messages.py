"""What the HTTP process and the engine-core process say to each other: msgspec structs as MessagePack.

HTTP -> core (one PUSH/PULL socket): AddGroup (the prompt token ids and SamplingParams of one HTTP
request's engine requests, all-or-nothing), Abort (engine request ids), Shutdown.
core -> HTTP (one PUSH/PULL socket): Ready or LoadFailed once, then one StepOutputs per engine-loop
iteration: every request's new token ids (no text: the HTTP process detokenizes), the groups taken or
refused in that iteration, and a stats snapshot for /metrics.

Structs are `array_like` (encoded as arrays, not maps): a W1 step of 256 one-token outputs is ~13 kB and
takes ~50 µs to build and encode. Nothing here imports torch.
"""

from __future__ import annotations

from typing import Any

import msgspec
from kvpilot.runtime.sampling_params import SamplingParams


class CoreConfig(msgspec.Struct, kw_only=True):
    """Everything the engine-core process needs; sent as one JSON line on its stdin."""

    input_address: str  # the core PULLs requests from here (the HTTP process binds it)
    output_address: str  # the core PUSHes outputs here (the HTTP process binds it)
    engine_factory: str  # "module:function" returning an engine (kvpilot.runtime.engine_core.core.EngineLike)
    engine_kwargs: dict[str, Any] = {}
    log_level: str = "info"


# ---- HTTP process -> engine core
class EngineRequest(msgspec.Struct, array_like=True, gc=False):
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float  # time.monotonic() in the HTTP process (the same clock in every process on Linux)


class AddGroup(msgspec.Struct, tag=True, array_like=True):
    """One HTTP request's engine requests (prompts x n): the core takes all of them or none."""

    group_id: str
    requests: list[EngineRequest]


class Abort(msgspec.Struct, tag=True, array_like=True):
    request_ids: list[str]  # unknown or finished ids are ignored


class Shutdown(msgspec.Struct, tag=True, array_like=True):
    pass


CoreRequest = AddGroup | Abort | Shutdown


# ---- engine core -> HTTP process
class Stats(msgspec.Struct, array_like=True, frozen=True):
    num_running: int
    num_waiting: int
    kv_cache_usage: float  # 0..1
    prefix_cache_queries: int  # tokens, cumulative
    prefix_cache_hits: int  # tokens, cumulative
    num_preemptions: int  # cumulative
    num_kv_blocks: int
    block_size: int
    # speculative decoding, cumulative (vllm:spec_decode_*); zero / empty when it is off
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = []


class Logprob(msgspec.Struct, array_like=True, gc=False):
    token_id: int
    logprob: float
    top_logprobs: list[tuple[int, float]]
    rank: int | None = None  # set for prompt logprobs


class TokenOutput(msgspec.Struct, array_like=True, gc=False):
    """What one engine request produced in one step (ids only)."""

    request_id: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" (a stop token or EOS) | "length" | "abort"
    stop_reason: int | str | None  # the stop token id that matched (None for EOS)
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    logprobs: list[Logprob] | None = None
    error: str | None = None  # the request failed in the engine (finish_reason "abort")
    prompt_logprobs: list[Logprob | None] | None = (
        None  # SamplingParams.prompt_logprobs, with the first token
    )


class Rejected(msgspec.Struct, array_like=True):
    group_id: str
    message: str
    param: str | None
    invalid: bool  # True: the request is wrong (400); False: the engine failed (500)


class StepOutputs(msgspec.Struct, tag=True, array_like=True, gc=False):
    outputs: list[TokenOutput]
    accepted: list[str]  # group ids
    rejected: list[Rejected]
    stats: Stats
    step_start: float  # time.monotonic() when the step began (queue-time metric)


class Ready(msgspec.Struct, tag=True, array_like=True):
    pid: int
    max_model_len: int
    stats: Stats


class LoadFailed(msgspec.Struct, tag=True, array_like=True):
    reason: str


CoreMessage = StepOutputs | Ready | LoadFailed


def request_encoder() -> msgspec.msgpack.Encoder:
    return msgspec.msgpack.Encoder()


def request_decoder() -> msgspec.msgpack.Decoder[CoreRequest]:
    return msgspec.msgpack.Decoder(CoreRequest)


def message_encoder() -> msgspec.msgpack.Encoder:
    return msgspec.msgpack.Encoder()


def message_decoder() -> msgspec.msgpack.Decoder[CoreMessage]:
    return msgspec.msgpack.Decoder(CoreMessage)
