"""The whole engine on real tiny checkpoints equals transformers (CPU, float32).

For each family: greedy generation through LLM is token-identical to transformers' `generate` for a
batch of prompts of different lengths sharing a prefix, whatever the engine does with them: prefix
caching on or off, prefill chopped into tiny chunks, or a KV cache so small that sequences are
preempted and recomputed. Seeded sampling does not depend on the batch; logprobs are log_softmax of
transformers' logits (tolerance 1e-4 absolute, the models' logits tolerance).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from kvpilot.runtime.fixtures import FAMILIES
from kvpilot.runtime.llm import LLM
from kvpilot.runtime.sampling_params import SamplingParams

MAX_NEW = 12
ATOL = 1e-4
SHARED = "The quick brown fox jumps over the lazy dog, and then "
PROMPTS = [SHARED + "it sleeps.", "Hi", SHARED + "the dog wakes up and barks at the moon " * 2, SHARED]

# name -> engine arguments; every configuration must give the reference tokens
CONFIGS = {
    "prefix-cache": {"enable_prefix_caching": True},
    "no-prefix-cache": {"enable_prefix_caching": False},
    "tiny-chunks": {"max_num_batched_tokens": 5, "max_num_seqs": 4},
    "preemption": {"num_kv_blocks": 20, "max_num_batched_tokens": 16},
}
_hf_cache: dict[tuple[Path, tuple[int, ...]], list[int]] = {}
_hf_models: dict[Path, torch.nn.Module] = {}


def hf_model(path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    if path not in _hf_models:
        _hf_models[path] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return _hf_models[path]


def hf_greedy(path: Path, prompt: list[int]) -> list[int]:
    key = (path, tuple(prompt))
    if key not in _hf_cache:
        with torch.no_grad():
            out = hf_model(path).generate(torch.tensor([prompt]), max_new_tokens=MAX_NEW, do_sample=False)
        _hf_cache[key] = out[0, len(prompt) :].tolist()
    return _hf_cache[key]


@functools.cache
def hf_logprobs(path: Path, prompt: tuple[int, ...], output: tuple[int, ...]) -> list[float]:
    """log_softmax of transformers' logits for each output token, given everything before it."""
    with torch.no_grad():
        logits = hf_model(path)(torch.tensor([prompt + output])).logits[0].float()
    rows = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    return rows.gather(1, torch.tensor(output)[:, None])[:, 0].tolist()


def make_llm(path: Path, **kw) -> LLM:
    kw.setdefault("block_size", 4)
    return LLM(str(path), device="cpu", dtype="float32", max_model_len=128, **kw)


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_greedy_equals_transformers_generate(
    family: str, config: str, tiny_checkpoint_factory: Callable[..., Path]
) -> None:
    path = tiny_checkpoint_factory(family)
    llm = make_llm(path, **CONFIGS[config])
    # the second round finds the first round's blocks in the prefix cache; without logprobs its decode
    # steps are scheduled asynchronously (launched before the previous step's tokens are read back)
    for logprobs in (0, None):
        params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, logprobs=logprobs)
        for out in llm.generate(PROMPTS, params):
            assert out.token_ids == hf_greedy(path, out.prompt_token_ids)
            assert out.finish_reason in ("stop", "length")
            if logprobs is None:
                continue
            # tiny random models repeat themselves; the logprobs expose any context that went wrong
            got = [lp.logprob for lp in out.logprobs]
            want = hf_logprobs(path, tuple(out.prompt_token_ids), tuple(out.token_ids))
            assert got == pytest.approx(want, abs=ATOL)
    assert llm.engine.num_overlapped_steps > 0
    stats = llm.engine.stats()
    if config == "preemption":
        assert stats.num_preemptions > 0
    assert (stats.prefix_cache_hits > 0) == (config != "no-prefix-cache")
    assert stats.kv_cache_usage == 0 and stats.num_running == stats.num_waiting == 0


def test_seeded_sampling_is_independent_of_the_batch(tiny_checkpoint_factory: Callable[..., Path]) -> None:
    path = tiny_checkpoint_factory("qwen3")
    seeded = SamplingParams(
        temperature=0.9, top_k=40, top_p=0.95, seed=1234, max_tokens=MAX_NEW, ignore_eos=True
    )
    other = SamplingParams(temperature=1.0, max_tokens=MAX_NEW, ignore_eos=True)
    (alone,) = make_llm(path).generate([PROMPTS[0]], seeded)
    crowded = make_llm(path, **CONFIGS["preemption"])
    batch = crowded.generate([PROMPTS[2], PROMPTS[0], PROMPTS[1], PROMPTS[0]], [other, seeded, other, seeded])
    assert crowded.engine.stats().num_preemptions > 0
    assert batch[1].token_ids == alone.token_ids == batch[3].token_ids
    reseeded = SamplingParams(
        temperature=0.9, top_k=40, top_p=0.95, seed=99, max_tokens=MAX_NEW, ignore_eos=True
    )
    (different,) = make_llm(path).generate([PROMPTS[0]], reseeded)
    assert different.token_ids != alone.token_ids  # it really samples: the seed matters


def test_logprobs_equal_log_softmax_of_transformers(tiny_checkpoint_factory: Callable[..., Path]) -> None:
    path = tiny_checkpoint_factory("llama3")
    llm = make_llm(path)
    (out,) = llm.generate([PROMPTS[0]], SamplingParams(temperature=0.0, max_tokens=6, logprobs=3))
    sequence = out.prompt_token_ids + out.token_ids
    with torch.no_grad():
        logits = hf_model(path)(torch.tensor([sequence])).logits[0].float()
    reference = torch.log_softmax(logits, dim=-1)
    for i, lp in enumerate(out.logprobs):
        row = reference[len(out.prompt_token_ids) - 1 + i]
        assert lp.token_id == out.token_ids[i] == int(row.argmax())
        assert lp.logprob == pytest.approx(float(row[lp.token_id]), abs=ATOL)
        top = torch.topk(row, 3)
        assert [t for t, _ in lp.top_logprobs] == top.indices.tolist()
        assert [v for _, v in lp.top_logprobs] == pytest.approx(top.values.tolist(), abs=ATOL)


def test_text_is_the_decoded_tokens(tiny_checkpoint_factory: Callable[..., Path]) -> None:
    path = tiny_checkpoint_factory("qwen2")
    llm = make_llm(path)
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_NEW))
    tokenizer = llm.get_tokenizer()
    for out in outs:
        assert out.text == tokenizer.decode(out.token_ids)
