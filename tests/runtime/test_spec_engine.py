"""Speculative decoding through the whole engine on tiny checkpoints is lossless.

Greedy requests give exactly the tokens (and logprobs, within float noise) of the same engine without
speculation, whatever the drafts: n-gram lookup, a draft model (the target itself: everything accepted;
another random model: mostly rejected), or a drafter that is right for a while and then wrong (rejections
in the middle of a run). Stops inside an accepted run (EOS/stop token, stop string, max_tokens,
min_tokens), penalties, prefix caching and preemption behave as without speculation, and every KV block
is back in the free pool at the end (rejected drafts' blocks were rolled back).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kvpilot.runtime.engine.spec_decode.config import SpeculativeConfig
from kvpilot.runtime.engine.spec_decode.speculator import Speculator
from kvpilot.runtime.llm import LLM
from kvpilot.runtime.sampling_params import SamplingParams

NGRAM = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}'
PROMPTS = [
    "the cat sat on the mat. the cat sat on the mat. the cat sat on",
    "def add(a, b): return a + b\ndef add(a, b): return a",
    "Hi",
]
BASE = {"block_size": 4, "max_model_len": 256}


def greedy(**kw: Any) -> SamplingParams:
    return SamplingParams(temperature=0, **{"max_tokens": 24, "ignore_eos": True, **kw})


def run(llm: LLM, params: SamplingParams | list[SamplingParams], prompts: list[str] = PROMPTS) -> list[Any]:
    return llm.generate(prompts, params)


def assert_same(plain: list[Any], spec: list[Any]) -> None:
    for a, b in zip(plain, spec, strict=True):
        assert b.token_ids == a.token_ids
        assert (b.text, b.finish_reason, b.stop_reason) == (a.text, a.finish_reason, a.stop_reason)
        if a.logprobs is not None:
            for x, y in zip(a.logprobs, b.logprobs, strict=True):
                assert x.token_id == y.token_id and y.logprob == pytest.approx(x.logprob, abs=1e-4)
                assert [t for t, _ in x.top_logprobs] == [t for t, _ in y.top_logprobs]


def assert_no_leak(llm: LLM) -> None:
    bm = llm.engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks


class NoisyOracle:
    """Drafts the plain run's continuation, but from every third step on it turns wrong at draft 2."""

    def __init__(self, continuations: dict[tuple[int, ...], list[int]], vocab: int) -> None:
        self.continuations, self.vocab, self.calls = continuations, vocab, 0

    def propose(self, seqs: list[Any], num_tokens: list[int]) -> list[list[int]]:
        self.calls += 1
        out = []
        for seq, k in zip(seqs, num_tokens, strict=True):
            known = self.continuations[tuple(seq.prompt_token_ids)]
            n = seq.num_output_tokens
            draft = list(known[n : n + k])
            if self.calls % 3 == 0 and len(draft) > 2:
                draft[2] = (draft[2] + 1) % self.vocab
            out.append(draft)
        return out

    def forget(self, seq_ids: set[int]) -> None:
        pass


def with_oracle(llm: LLM, plain: list[Any], k: int = 4) -> NoisyOracle:
    oracle = NoisyOracle({tuple(o.prompt_token_ids): o.token_ids for o in plain}, llm.engine._vocab_size)
    config = SpeculativeConfig("ngram", k)
    llm.engine.speculator = Speculator(config, oracle)
    return oracle


@pytest.mark.parametrize("family", ["llama3", "qwen2", "qwen3"])
def test_ngram_greedy_equals_plain(family: str, tiny_checkpoint_factory: Callable[..., Path]) -> None:
    path = tiny_checkpoint_factory(family)
    params = greedy(logprobs=2)
    plain = run(LLM(path, **BASE), params)
    llm = LLM(path, **BASE, speculative_config=NGRAM)
    assert_same(plain, run(llm, params))
    stats = llm.engine.stats().spec_decode
    assert stats is not None and stats.num_accepted_tokens > 0
    assert stats.num_draft_tokens >= stats.num_accepted_tokens
    assert sum(stats.accepted_per_pos) == stats.num_accepted_tokens
    assert llm.engine.num_overlapped_steps == 0  # speculative steps are never overlapped
    assert_no_leak(llm)


def test_partial_acceptance_rolls_back(qwen3_checkpoint: Path) -> None:
    params = greedy(logprobs=1, max_tokens=30)
    plain = run(LLM(qwen3_checkpoint, **BASE), params)
    llm = LLM(qwen3_checkpoint, **BASE)
    with_oracle(llm, plain)
    assert_same(plain, run(llm, params))
    stats = llm.engine.stats().spec_decode
    assert stats is not None
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens
    assert stats.accepted_per_pos[0] > stats.accepted_per_pos[2]  # draft 2 is the one made wrong
    assert_no_leak(llm)


def test_stops_inside_accepted_runs(llama3_checkpoint: Path) -> None:
    probe = run(LLM(llama3_checkpoint, **BASE), greedy(max_tokens=30))
    stop_token = probe[0].token_ids[5]
    stop_text = probe[1].text[len(probe[1].text) // 2 :][:3] or "x"
    cases = [
        greedy(stop_token_ids=[stop_token], max_tokens=30),
        greedy(stop=[stop_text], max_tokens=30),
        greedy(stop=[stop_text], include_stop_str_in_output=True, max_tokens=30),
        greedy(max_tokens=7),
        greedy(max_tokens=30, min_tokens=9, stop_token_ids=[stop_token]),
        greedy(max_tokens=1),
    ]
    for params in cases:
        plain = run(LLM(llama3_checkpoint, **BASE), params)
        llm = LLM(llama3_checkpoint, **BASE)
        with_oracle(llm, probe, k=6)
        spec = run(llm, params)
        assert_same(plain, spec)
        assert_no_leak(llm)
    assert plain[0].token_ids  # the last case still generated


def test_eos_inside_an_accepted_run(qwen2_checkpoint: Path) -> None:
    """A token the target emits is made the EOS (as if the model had learnt it): the run stops there,
    although the drafter proposed (and the target would have accepted) the tokens after it."""
    probe = run(LLM(qwen2_checkpoint, **BASE), greedy(max_tokens=20))
    eos = probe[0].token_ids[4]
    params = greedy(max_tokens=20, ignore_eos=False)
    plain_llm = LLM(qwen2_checkpoint, **BASE)
    plain_llm.engine._eos_token_ids = frozenset({eos})
    plain = run(plain_llm, params)
    assert plain[0].finish_reason == "stop" and plain[0].token_ids[-1] == eos
    llm = LLM(qwen2_checkpoint, **BASE)
    llm.engine._eos_token_ids = frozenset({eos})
    with_oracle(llm, probe, k=6)
    assert_same(plain, run(llm, params))
    assert_no_leak(llm)


def test_penalties_and_prefix_cache_and_preemption(qwen3_checkpoint: Path) -> None:
    prompts = PROMPTS * 2  # the repeats hit the prefix cache
    params = greedy(repetition_penalty=1.3, frequency_penalty=0.2, presence_penalty=0.1, logprobs=1)
    plain = run(LLM(qwen3_checkpoint, **BASE), params, prompts)
    for extra in ({"enable_prefix_caching": True}, {"num_kv_blocks": 24, "max_num_batched_tokens": 32}):
        llm = LLM(qwen3_checkpoint, **BASE, **extra, speculative_config=NGRAM)
        assert_same(plain, run(llm, params, prompts))
        assert_no_leak(llm)
        if "num_kv_blocks" in extra:
            assert llm.engine.scheduler.num_preemptions > 0


def test_draft_model(qwen3_checkpoint: Path, tiny_checkpoint_factory: Callable[..., Path]) -> None:
    params = greedy(logprobs=1)
    plain = run(LLM(qwen3_checkpoint, **BASE), params)
    itself = json.dumps({"model": str(qwen3_checkpoint), "num_speculative_tokens": 3})
    llm = LLM(qwen3_checkpoint, **BASE, speculative_config=itself)
    assert_same(plain, run(llm, params))
    stats = llm.engine.stats().spec_decode
    assert stats is not None and stats.num_accepted_tokens == stats.num_draft_tokens > 0
    other = tiny_checkpoint_factory("qwen3", seed=7, num_hidden_layers=1)
    llm = LLM(
        qwen3_checkpoint,
        **BASE,
        speculative_config=json.dumps({"model": str(other), "num_speculative_tokens": 3}),
    )
    assert_same(plain, run(llm, params))
    stats = llm.engine.stats().spec_decode
    assert stats is not None and stats.num_accepted_tokens < stats.num_draft_tokens
    assert_no_leak(llm)


def test_seeded_sampling_is_reproducible(qwen3_checkpoint: Path) -> None:
    """With a fixed cost ratio (measure_costs off) which steps speculate depends on the tokens only, so
    seeded sampling repeats exactly (measured step times would move the back-off's decisions)."""
    params = [
        SamplingParams(temperature=0.8, top_p=0.9, seed=s, max_tokens=16, ignore_eos=True) for s in (1, 2, 3)
    ]
    fixed = json.dumps({**json.loads(NGRAM), "measure_costs": False})
    first = run(LLM(qwen3_checkpoint, **BASE, speculative_config=fixed), params)
    second = run(LLM(qwen3_checkpoint, **BASE, speculative_config=fixed), params)
    assert [o.token_ids for o in first] == [o.token_ids for o in second]
    assert all(len(o.token_ids) == 16 for o in first)


def test_backs_off_when_nothing_is_accepted_and_keeps_probing(qwen3_checkpoint: Path) -> None:
    """An always-wrong drafter: the engine stops speculating after a few steps (its decode steps overlap
    again, as without speculation), probes now and then, ever more rarely as probes keep failing, and
    the output is still the plain greedy one."""
    from kvpilot.runtime.engine.spec_decode.oracle import OracleProposer
    from kvpilot.runtime.engine.spec_decode.policy import expected_tokens_per_step

    params = greedy(max_tokens=120)
    prompts = PROMPTS[:1]
    plain = run(LLM(qwen3_checkpoint, **BASE), params, prompts)
    llm = LLM(qwen3_checkpoint, **BASE)
    known = {tuple(o.prompt_token_ids): o.token_ids for o in plain}
    # a fixed cost ratio: with measured step times the probe spacing (and so the count) follows the load
    config = SpeculativeConfig("wrong", 4, backoff_probe_interval=8, measure_costs=False)
    wrong = OracleProposer(known, wrong=True, vocab_size=llm.engine._vocab_size)
    llm.engine.speculator = Speculator(config, wrong)
    assert_same(plain, run(llm, params, prompts))
    stats = llm.engine.stats().spec_decode
    assert stats is not None and stats.num_accepted_tokens == 0
    # 3 steps to back off (acceptance 0.7 -> 0.3), then probes after >= 8, 16, 32, 64 plain steps
    assert 4 <= stats.num_drafts <= 8
    assert llm.engine.num_overlapped_steps > 80
    state = llm.engine.speculator.state
    # backed off because speculating no longer pays at the configured cost ratio, and a probe failed
    assert expected_tokens_per_step(state.acceptance_rate, 4) < config.verify_cost_ratio
    assert state.failed_probes >= 1


def test_a_proposer_without_drafts_lets_steps_overlap(qwen3_checkpoint: Path) -> None:
    """Asking for drafts holds a step back from overlapping; when the proposer keeps finding none (an
    n-gram lookup on text that never repeats), the engine asks ever more rarely and overlaps the rest."""

    class Empty:
        calls = 0

        def propose(self, seqs: list[Any], num_tokens: list[int]) -> list[list[int]]:
            Empty.calls += 1
            return [[] for _ in seqs]

        def forget(self, seq_ids: set[int]) -> None:
            pass

    params = greedy(max_tokens=120)
    plain = run(LLM(qwen3_checkpoint, **BASE), params, PROMPTS[:1])
    llm = LLM(qwen3_checkpoint, **BASE)
    llm.engine.speculator = Speculator(SpeculativeConfig("ngram", 4), Empty())
    assert_same(plain, run(llm, params, PROMPTS[:1]))
    assert 5 <= Empty.calls <= 20  # asks after waits of 1, 2, 4, 8, 8, ... steps
    assert llm.engine.num_overlapped_steps > 90


def test_draft_model_must_share_the_vocabulary(
    qwen3_checkpoint: Path, tiny_checkpoint_factory: Callable[..., Path]
) -> None:
    from kvpilot.runtime.engine.engine_args import EngineArgsError

    other = tiny_checkpoint_factory("qwen3", vocab_size=2048)
    config = json.dumps({"model": str(other), "num_speculative_tokens": 2})
    with pytest.raises(EngineArgsError, match=r"vocabulary .* differs from the target's"):
        LLM(qwen3_checkpoint, **BASE, speculative_config=config)
