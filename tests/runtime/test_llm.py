"""Offline API over the fake model; lazy package exports."""

from __future__ import annotations

import subprocess
import sys

import pytest
from kvpilot.runtime.engine.llm_engine import LLMEngine
from kvpilot.runtime.errors import InvalidRequestError
from kvpilot.runtime.llm import LLM
from kvpilot.runtime.sampling_params import SamplingParams

from tests.runtime.fake_model import FakeRunner, FakeSampler, FakeTokenizer, reference_greedy

TOK = FakeTokenizer()


def make_llm(**kw) -> LLM:
    runner = FakeRunner(num_kv_blocks=32, block_size=4, max_model_len=64)
    kw.setdefault("max_num_batched_tokens", 16)
    return LLM.from_engine(LLMEngine(runner, TOK, FakeSampler(), max_num_seqs=4, **kw))


def test_generate_text_and_token_prompts_in_order() -> None:
    llm = make_llm()
    prompts = ["the cat", " sat on the mat and more", "a"]
    outs = llm.generate(prompts, SamplingParams(max_tokens=5, ignore_eos=True))
    assert len(outs) == 3
    logits_fn = llm.engine.runner.logits_fn
    for prompt, out in zip(prompts, outs, strict=True):
        ids = TOK.encode(prompt)
        assert out.prompt_token_ids == ids
        assert out.token_ids == reference_greedy(logits_fn, ids, 5)
        assert out.text == TOK.decode(out.token_ids)
        assert out.finish_reason == "length" and out.stop_reason is None and out.logprobs is None
        assert out.usage == {"prompt_tokens": len(ids), "completion_tokens": 5, "total_tokens": len(ids) + 5}
    (single,) = llm.generate("the cat", SamplingParams(max_tokens=5, ignore_eos=True))
    assert single.token_ids == outs[0].token_ids
    (by_ids,) = llm.generate(TOK.encode("the cat"), SamplingParams(max_tokens=5, ignore_eos=True))
    assert by_ids.token_ids == outs[0].token_ids
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    both = llm.generate([TOK.encode("a"), TOK.encode("the cat")], params)
    assert [o.token_ids for o in both] == [outs[2].token_ids, outs[0].token_ids]


def test_per_prompt_params_and_logprobs() -> None:
    llm = make_llm()
    outs = llm.generate(
        ["a", "b"],
        [
            SamplingParams(max_tokens=2, ignore_eos=True, logprobs=1),
            SamplingParams(max_tokens=3, ignore_eos=True),
        ],
    )
    assert [len(o.token_ids) for o in outs] == [2, 3]
    assert [lp.token_id for lp in outs[0].logprobs] == outs[0].token_ids and outs[1].logprobs is None
    assert llm.generate([]) == []


def test_bad_prompt_raises_and_leaves_the_engine_clean() -> None:
    llm = make_llm()
    with pytest.raises(InvalidRequestError, match="prompt is empty"):
        llm.generate(["fine", "", "also fine"])
    assert not llm.engine.has_unfinished_requests() and llm.engine.stats().kv_cache_usage == 0
    with pytest.raises(InvalidRequestError, match="2 SamplingParams for 1 prompts"):
        llm.generate(["a"], [SamplingParams(), SamplingParams()])
    with pytest.raises(InvalidRequestError, match="neither text nor"):
        llm.generate(["a", 3.5])
    assert llm.generate("x", SamplingParams(max_tokens=1, ignore_eos=True))[0].usage["completion_tokens"] == 1


def test_package_exports_are_lazy_and_torch_free() -> None:
    code = (
        "import sys, kvpilot.runtime as r; assert 'torch' not in sys.modules; "
        "from kvpilot.runtime import LLM, SamplingParams; assert 'torch' not in sys.modules; "
        "assert LLM.__name__ == 'LLM' and SamplingParams().max_tokens == 16; "
        "import kvpilot.runtime.engine.scheduler, kvpilot.runtime.engine.block_manager; "
        "assert 'torch' not in sys.modules; print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr
    import kvpilot.runtime as runtime

    with pytest.raises(AttributeError):
        runtime.NoSuchThing  # noqa: B018
