"""LLMEngine over the torch-free fake model: outputs, stops, limits, aborts, bad input, failures."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from kvpilot.runtime.engine.llm_engine import LLMEngine
from kvpilot.runtime.engine.output import RequestOutput
from kvpilot.runtime.errors import InvalidRequestError
from kvpilot.runtime.sampling_params import SamplingParams

from tests.runtime.fake_model import (
    EOS_TOKEN_ID,
    FakeRunner,
    FakeSampler,
    FakeTokenizer,
    hashed_logits,
    reference_greedy,
)

VOCAB = FakeTokenizer().vocab_size
(ST_TOKEN,) = FakeTokenizer().encode("ST")


def no_eos_logits(context: Sequence[int]) -> list[float]:
    logits = hashed_logits(VOCAB)(context)
    logits[EOS_TOKEN_ID] = -1.0
    return logits


def make_engine(
    num_kv_blocks: int = 64,
    block_size: int = 4,
    max_model_len: int = 128,
    logits_fn=no_eos_logits,
    tokenizer: FakeTokenizer | None = None,
    **kw,
) -> LLMEngine:
    runner = FakeRunner(
        num_kv_blocks=num_kv_blocks, block_size=block_size, max_model_len=max_model_len, logits_fn=logits_fn
    )
    kw.setdefault("max_num_seqs", 8)
    kw.setdefault("max_num_batched_tokens", 64)
    return LLMEngine(runner, tokenizer or FakeTokenizer(), FakeSampler(), **kw)


def run_all(engine: LLMEngine) -> dict[str, list[RequestOutput]]:
    outs: dict[str, list[RequestOutput]] = {}
    for _ in range(10_000):
        if not engine.has_unfinished_requests():
            return outs
        for o in engine.step():
            assert o.request_id not in outs or not outs[o.request_id][-1].finished, "output after finish"
            outs.setdefault(o.request_id, []).append(o)
    raise AssertionError("engine did not finish")


def tokens_of(deltas: list[RequestOutput]) -> list[int]:
    return [t for d in deltas for t in d.new_token_ids]


def text_of(deltas: list[RequestOutput]) -> str:
    return "".join(d.new_text for d in deltas)


def test_generates_reference_tokens_and_text_for_a_batch() -> None:
    engine, tok = make_engine(), FakeTokenizer()
    prompts = {f"r{i}": [random.Random(i).randrange(1, VOCAB) for _ in range(3 + 5 * i)] for i in range(5)}
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, SamplingParams(max_tokens=7, temperature=0))
    outs = run_all(engine)
    for rid, prompt in prompts.items():
        expected = reference_greedy(no_eos_logits, prompt, 7)
        assert tokens_of(outs[rid]) == expected
        assert text_of(outs[rid]) == tok.decode(expected)
        last = outs[rid][-1]
        assert (last.finished, last.finish_reason, last.stop_reason) == (True, "length", None)
        assert (last.num_prompt_tokens, last.num_output_tokens) == (len(prompt), 7)
    stats = engine.stats()
    assert (stats.num_running, stats.num_waiting, stats.kv_cache_usage) == (0, 0, 0.0)


@pytest.mark.parametrize("caching", [True, False])
def test_tiny_cache_and_tiny_budget_still_exact(caching: bool) -> None:
    engine = make_engine(
        num_kv_blocks=10, max_model_len=40, max_num_batched_tokens=5, enable_prefix_caching=caching
    )
    shared = [5, 6, 7, 8, 9, 10, 11, 12]
    prompts = {f"r{i}": shared + [20 + i] * (i + 1) for i in range(6)}
    for rid, prompt in prompts.items():
        engine.add_request(rid, prompt, SamplingParams(max_tokens=14))
    outs = run_all(engine)
    for rid, prompt in prompts.items():
        assert tokens_of(outs[rid]) == reference_greedy(no_eos_logits, prompt, 14)
    stats = engine.stats()
    assert stats.num_preemptions > 0
    assert (stats.prefix_cache_hits > 0) == caching
    assert stats.kv_cache_usage == 0 and (stats.num_kv_blocks, stats.block_size) == (10, 4)


def test_prefix_cache_counters_and_cached_tokens() -> None:
    engine = make_engine()
    prompt = list(range(1, 19))  # 18 tokens: 4 full blocks of 4
    engine.add_request("a", prompt, SamplingParams(max_tokens=2))
    run_all(engine)
    engine.add_request("b", prompt, SamplingParams(max_tokens=2))
    outs = run_all(engine)
    assert outs["b"][-1].num_cached_tokens == 16
    stats = engine.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (36, 16)


def eos_first_logits(context: Sequence[int]) -> list[float]:
    logits = hashed_logits(VOCAB)(context)
    logits[EOS_TOKEN_ID] = 2.0  # EOS always wins unless banned
    logits[ST_TOKEN] = 1.5  # the runner-up: a stop token id in some tests
    return logits


def test_eos_stops_unless_ignored_and_min_tokens_delays_it() -> None:
    engine = make_engine(logits_fn=eos_first_logits)
    engine.add_request("eos", [1, 2, 3], SamplingParams(max_tokens=10))
    engine.add_request("min", [1, 2, 3], SamplingParams(max_tokens=10, min_tokens=4))
    engine.add_request("ignore", [1, 2, 3], SamplingParams(max_tokens=6, ignore_eos=True))
    outs = run_all(engine)
    assert tokens_of(outs["eos"]) == [EOS_TOKEN_ID] and text_of(outs["eos"]) == ""
    assert (outs["eos"][-1].finish_reason, outs["eos"][-1].stop_reason) == ("stop", None)
    min_tokens = tokens_of(outs["min"])
    assert len(min_tokens) == 5 and min_tokens[-1] == EOS_TOKEN_ID and EOS_TOKEN_ID not in min_tokens[:4]
    assert tokens_of(outs["ignore"]) == [EOS_TOKEN_ID] * 6 and outs["ignore"][-1].finish_reason == "length"


def test_stop_token_ids_respect_min_tokens_and_hide_their_text() -> None:
    def st_first(context: Sequence[int]) -> list[float]:
        logits = eos_first_logits(context)
        logits[ST_TOKEN] = 3.0
        return logits

    engine = make_engine(logits_fn=st_first)
    engine.add_request("r", [1, 2, 3], SamplingParams(max_tokens=10, min_tokens=2, stop_token_ids=[ST_TOKEN]))
    engine.add_request(
        "keep",
        [1, 2, 3],
        SamplingParams(max_tokens=10, stop_token_ids=[ST_TOKEN], include_stop_str_in_output=True),
    )
    outs = run_all(engine)
    tokens = tokens_of(outs["r"])
    assert len(tokens) == 3 and tokens[-1] == ST_TOKEN and not {ST_TOKEN, EOS_TOKEN_ID} & set(tokens[:2])
    assert (outs["r"][-1].finish_reason, outs["r"][-1].stop_reason) == ("stop", ST_TOKEN)
    assert text_of(outs["r"]) == FakeTokenizer().decode(tokens[:2])  # the stop token's text is dropped
    assert tokens_of(outs["keep"]) == [ST_TOKEN] and text_of(outs["keep"]) == "ST"


def test_max_tokens_none_fills_the_context() -> None:
    engine = make_engine(max_model_len=20)
    engine.add_request("r", [1, 2, 3, 4, 5], SamplingParams(max_tokens=None))
    outs = run_all(engine)
    assert len(tokens_of(outs["r"])) == 15 and outs["r"][-1].finish_reason == "length"


def test_logprobs_are_passed_through() -> None:
    engine = make_engine()
    engine.add_request("lp", [1, 2, 3], SamplingParams(max_tokens=3, logprobs=2))
    engine.add_request("none", [1, 2, 3], SamplingParams(max_tokens=3))
    outs = run_all(engine)
    context = [1, 2, 3]
    for delta in outs["lp"]:
        (lp,) = delta.new_logprobs
        logits = no_eos_logits(context)
        assert lp.token_id == delta.new_token_ids[0] and lp.logprob == logits[lp.token_id]
        assert [t for t, _ in lp.top_logprobs] == sorted(range(VOCAB), key=lambda t: -logits[t])[:2]
        context.append(lp.token_id)
    assert all(d.new_logprobs is None for d in outs["none"])


def test_abort_in_every_state_frees_blocks_and_reports() -> None:
    engine = make_engine(max_num_seqs=2, max_num_batched_tokens=6)
    engine.add_request("decoding", [1, 2], SamplingParams(max_tokens=50))
    engine.add_request("prefilling", list(range(1, 30)), SamplingParams(max_tokens=50))
    engine.add_request("waiting", [3, 4], SamplingParams(max_tokens=50))
    engine.add_request("survivor", [5, 6], SamplingParams(max_tokens=4))
    engine.step()
    engine.step()
    assert engine.stats().num_running == 2 and engine.stats().kv_cache_usage > 0
    for rid in ("prefilling", "waiting", "decoding"):
        engine.abort_request(rid)
        engine.abort_request(rid)  # idempotent
    engine.abort_request("never-existed")
    outs = run_all(engine)
    for rid in ("prefilling", "waiting", "decoding"):
        assert [(d.finished, d.finish_reason) for d in outs[rid] if d.finished] == [(True, "abort")]
    assert tokens_of(outs["survivor"]) == reference_greedy(no_eos_logits, [5, 6], 4)
    assert engine.stats().kv_cache_usage == 0 and not engine.has_unfinished_requests()


def test_bad_input_is_refused_with_numbers() -> None:
    engine = make_engine(max_model_len=32)
    cases = [
        ("", "prompt is empty"),
        ([], "prompt is empty"),
        ([1, VOCAB], f"prompt token id {VOCAB} is not in the vocabulary"),
        ([1, -1], "prompt token id -1"),
        ([1, "x"], "prompt token id 'x'"),
        (list(range(1, 33)), "prompt has 32 tokens"),
    ]
    for prompt, message in cases:
        with pytest.raises(InvalidRequestError, match=message) as err:
            engine.add_request("x", prompt, SamplingParams())
        assert err.value.param == "prompt"
    with pytest.raises(InvalidRequestError, match=r"prompt \(30 tokens\) \+ max_tokens \(3\) = 33") as err:
        engine.add_request("x", list(range(1, 31)), SamplingParams(max_tokens=3))
    assert err.value.param == "max_tokens" and "max_model_len is 32" in err.value.message
    engine.add_request("x", [1], SamplingParams())
    with pytest.raises(InvalidRequestError, match="already in use"):
        engine.add_request("x", [1], SamplingParams())
    assert engine.stats().num_waiting == 1


def test_request_larger_than_the_kv_cache_is_refused() -> None:
    engine = make_engine(num_kv_blocks=4, max_model_len=100)
    with pytest.raises(InvalidRequestError, match="KV cache holds only 16 tokens"):
        engine.add_request("x", list(range(1, 11)), SamplingParams(max_tokens=7))


def test_a_failing_request_does_not_stop_the_others() -> None:
    engine = make_engine()
    engine.runner.fail_on_token = 99
    engine.add_request("ok1", [1, 2, 3], SamplingParams(max_tokens=5))
    engine.add_request("poisoned", [4, 99, 5], SamplingParams(max_tokens=5))
    engine.add_request("ok2", list(range(10, 20)), SamplingParams(max_tokens=5))
    outs = run_all(engine)
    bad = outs["poisoned"][-1]
    assert bad.finished and bad.finish_reason == "abort" and "poisoned token 99" in bad.error
    assert tokens_of(outs["ok1"]) == reference_greedy(no_eos_logits, [1, 2, 3], 5)
    assert tokens_of(outs["ok2"]) == reference_greedy(no_eos_logits, list(range(10, 20)), 5)
    assert engine.stats().kv_cache_usage == 0


class PickyTokenizer(FakeTokenizer):
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if 77 in ids:
            raise UnicodeError("cannot decode token 77")
        return super().decode(ids, skip_special_tokens)


def test_output_processing_failure_finishes_only_that_request() -> None:
    engine = make_engine(tokenizer=PickyTokenizer())
    engine.add_request("bad", [77, 1], SamplingParams(max_tokens=5))
    engine.add_request("good", [1, 2], SamplingParams(max_tokens=5))
    outs = run_all(engine)
    assert outs["bad"][-1].finish_reason == "abort" and "token 77" in outs["bad"][-1].error
    assert tokens_of(outs["good"]) == reference_greedy(no_eos_logits, [1, 2], 5)


def test_detokenize_false_returns_ids_only() -> None:
    engine = make_engine()
    engine.add_request("r", [1, 2], SamplingParams(max_tokens=4, detokenize=False, stop=["e"]))
    outs = run_all(engine)
    assert text_of(outs["r"]) == "" and len(tokens_of(outs["r"])) == 4


def test_invalid_engine_limits() -> None:
    with pytest.raises(ValueError, match="exceeds the runner"):
        LLMEngine(FakeRunner(max_model_len=16), FakeTokenizer(), FakeSampler(), max_model_len=17)
