"""SamplingParams.prompt_logprobs (vLLM semantics) on tiny checkpoints against transformers (CPU, float32):
for every prompt token after the first, its log_softmax under transformers' logits, its rank and the top
alternatives, whatever the engine does with the prompt (chunked over many steps, preempted and
recomputed, sharing the batch with requests that do not ask, or finding its prefix in the cache, which
such a request must not use)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from kvpilot.runtime.errors import InvalidRequestError
from kvpilot.runtime.llm import LLM
from kvpilot.runtime.sampling_params import SamplingParams

ATOL = 1e-4
SHARED = "The quick brown fox jumps over the lazy dog, and then "
PROMPTS = [SHARED * 3, "Hi", SHARED + "the dog wakes up", SHARED]
CONFIGS = {
    "default": {},
    "tiny-chunks": {"max_num_batched_tokens": 5, "max_num_seqs": 4},
    "preemption": {"num_kv_blocks": 20, "max_num_batched_tokens": 16},
}


def reference(hf_logits: Callable, path: Path, ids: list[int]) -> torch.Tensor:
    return torch.log_softmax(hf_logits(path, ids), dim=-1)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_prompt_logprobs_equal_transformers(
    config: str, llama3_checkpoint: Path, hf_logits: Callable[[Path, list[int]], torch.Tensor]
) -> None:
    llm = LLM(
        str(llama3_checkpoint),
        device="cpu",
        dtype="float32",
        max_model_len=128,
        block_size=4,
        **CONFIGS[config],
    )
    llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=4))  # the prefixes are now cached
    before = llm.engine.stats()
    plain = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    asking = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, prompt_logprobs=3)
    outs = llm.generate(PROMPTS + PROMPTS[:1], [asking] * len(PROMPTS) + [plain])
    after = llm.engine.stats()
    for out in outs[:-1]:
        ids = out.prompt_token_ids
        ref = reference(hf_logits, llama3_checkpoint, ids)
        assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(ids)
        assert out.prompt_logprobs[0] is None
        for i, entry in enumerate(out.prompt_logprobs[1:], 1):
            row = ref[i - 1]
            assert entry.token_id == ids[i]
            assert entry.logprob == pytest.approx(float(row[ids[i]]), abs=ATOL)
            assert entry.rank == int((row > row[ids[i]]).sum()) + 1
            top = torch.topk(row, 3)
            assert [t for t, _ in entry.top_logprobs] == top.indices.tolist()
            assert [v for _, v in entry.top_logprobs] == pytest.approx(top.values.tolist(), abs=ATOL)
    # asking changes nothing else: the same tokens as a request that does not ask
    assert outs[0].token_ids == outs[-1].token_ids
    assert outs[-1].prompt_logprobs is None
    if config == "preemption":
        assert after.num_preemptions > before.num_preemptions
    else:  # only the request that does not ask took its cached prefix (all full blocks but the last token's)
        cached = (len(outs[-1].prompt_token_ids) - 1) // 4 * 4
        assert after.prefix_cache_hits - before.prefix_cache_hits == cached


def test_a_one_token_prompt_has_only_the_leading_none(qwen3_checkpoint: Path) -> None:
    llm = LLM(str(qwen3_checkpoint), device="cpu", max_model_len=64)
    (out,) = llm.generate([[5]], SamplingParams(max_tokens=2, prompt_logprobs=0))
    assert out.prompt_logprobs == [None]


def test_prompt_logprobs_are_validated() -> None:
    with pytest.raises(InvalidRequestError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=21)
    with pytest.raises(InvalidRequestError, match="prompt_logprobs"):
        SamplingParams(prompt_logprobs=-1)
