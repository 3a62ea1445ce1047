"""SamplingParams.prompt_logprobs (vLLM semantics) on tiny checkpoints against transformers (CPU, float32):
for every prompt token after the first, its log_softmax under transformers' logits, its rank and the top
alternatives, whatever the engine does with the prompt (chunked over many steps, preempted and
recomputed, sharing the batch with requests that do not ask, or finding its prefix in the cache, which
such a request must not use)."""

from __future__ import annotations

import json
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


def test_completions_api_returns_prompt_logprobs_in_vllm_shape(qwen3_checkpoint: Path) -> None:
    import httpx
    from kvpilot.runtime.engine.engine_args import EngineArgs
    from kvpilot.runtime.engine_core.client import EngineCoreSpec
    from kvpilot.runtime.tokenizer import Tokenizer

    from tests.runtime.server_fakes import InProcessServer

    engine = EngineCoreSpec(
        kwargs=EngineArgs(model=str(qwen3_checkpoint), device="cpu", max_model_len=64).to_dict()
    )

    offline = LLM(str(qwen3_checkpoint), device="cpu", max_model_len=64)
    prompt = "The quick brown fox"
    (want,) = offline.generate([prompt], SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=2))
    tokenizer = offline.get_tokenizer()
    server = InProcessServer(
        engine, tokenizer_factory=lambda: Tokenizer.from_dir(qwen3_checkpoint), served_model_name="tiny"
    ).start(timeout=60)
    try:
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 2, "temperature": 0, "prompt_logprobs": 2}
        reply = httpx.post(server.base_url + "/v1/completions", json=body, timeout=30).json()
        (choice,) = reply["choices"]
        got = choice["prompt_logprobs"]
        assert got[0] is None and len(got) == len(want.prompt_token_ids)
        for row, entry in zip(got[1:], want.prompt_logprobs[1:], strict=True):
            assert row[str(entry.token_id)]["logprob"] == pytest.approx(entry.logprob, abs=1e-5)
            assert row[str(entry.token_id)]["rank"] == entry.rank
            assert row[str(entry.token_id)]["decoded_token"] == tokenizer.decode([entry.token_id])
            for rank, (token, logprob) in enumerate(entry.top_logprobs, 1):
                if token != entry.token_id:
                    assert row[str(token)] == {
                        "logprob": pytest.approx(logprob, abs=1e-5),
                        "rank": rank,
                        "decoded_token": tokenizer.decode([token]),
                    }
        # streamed: the first chunk of the choice carries them
        with httpx.stream("POST", server.base_url + "/v1/completions", json={**body, "stream": True}) as r:
            lines = [line[6:] for line in r.iter_lines() if line.startswith("data: {")]
        chunks = [json.loads(line)["choices"][0] for line in lines]
        assert chunks[0]["prompt_logprobs"] == got
        assert all("prompt_logprobs" not in c for c in chunks[1:])
        # a request that does not ask keeps OpenAI's shape
        plain = httpx.post(
            server.base_url + "/v1/completions", json={**body, "prompt_logprobs": None}, timeout=30
        ).json()
        assert "prompt_logprobs" not in plain["choices"][0]
        bad = httpx.post(
            server.base_url + "/v1/completions", json={**body, "prompt_logprobs": 99}, timeout=30
        )
        assert bad.status_code == 400 and "prompt_logprobs" in bad.text
    finally:
        server.stop()
