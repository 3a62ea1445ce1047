"""What the sampler needs to know about one row of a step's logits (pure Python, no torch)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kvpilot.runtime.sampling_params import SamplingParams


def needs_penalties(params: SamplingParams) -> bool:
    return (
        params.repetition_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0
    )


@dataclass(frozen=True)
class SampleRow:
    params: SamplingParams
    prompt_token_ids: Sequence[int]
    output_token_ids: Sequence[int]
    banned_token_ids: frozenset[int] = frozenset()  # e.g. EOS while len(output) < min_tokens
    # greedy, nothing to process, no logprobs: the argmax of the raw logits (rows are reused per request)
    plain_greedy: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        params = self.params
        plain = not self.banned_token_ids and params.logprobs is None and not needs_penalties(params)
        object.__setattr__(self, "plain_greedy", plain and params.greedy)
