"""Asynchronous scheduling: a decode step is launched before the previous step's tokens are read back.

The overlapped engine must give exactly what the synchronous engine gives (same tokens, text, finish and
stop reasons, logprobs) on random workloads where requests stop on EOS, stop tokens, stop strings and
max_tokens mid-stream, are aborted between steps, arrive late, are preempted, with the prefix cache on
or off; the overlapped path must really be taken, and no request emits anything after it finished.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from kvpilot.runtime.engine.block_manager import BlockManager
from kvpilot.runtime.engine.llm_engine import LLMEngine
from kvpilot.runtime.engine.model_runner import fill_placeholders
from kvpilot.runtime.engine.output import RequestOutput
from kvpilot.runtime.engine.sequence import Sequence as Seq
from kvpilot.runtime.sampling_params import SamplingParams

from tests.runtime.fake_model import (
    EOS_TOKEN_ID,
    FakeRunner,
    FakeSampledIds,
    FakeSampler,
    FakeTokenizer,
    hashed_logits,
)

TOK = FakeTokenizer()
VOCAB = TOK.vocab_size
STOP_STRINGS = [" the", "STOP", "\n\n", "at"]


def eos_sometimes(context: Sequence[int]) -> list[float]:
    """Hashed logits, with EOS winning after about one context in twelve."""
    logits = hashed_logits(VOCAB)(context)
    if hash(tuple(context)) % 12 == 0:
        logits[EOS_TOKEN_ID] = 2.0
    return logits


class RecordingRunner(FakeRunner):
    """Notes, for each step launched with placeholders, whether the previous step's ids were still
    unread: the host had not waited for that step when it launched this one."""

    launched_unread: list[bool]

    def execute(self, batch: Any, prev_sampled: FakeSampledIds | None = None) -> list[list[float]]:
        if not hasattr(self, "launched_unread"):
            self.launched_unread = []
        if prev_sampled is not None:
            self.launched_unread.append(not prev_sampled.read_back)
        return super().execute(batch, prev_sampled)


def make_engine(
    async_scheduling: bool,
    *,
    num_kv_blocks: int = 64,
    prefix: bool = True,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 32,
) -> LLMEngine:
    runner = RecordingRunner(
        num_kv_blocks=num_kv_blocks, block_size=4, max_model_len=128, logits_fn=eos_sometimes
    )
    return LLMEngine(
        runner,
        TOK,
        FakeSampler(),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_prefix_caching=prefix,
        async_scheduling=async_scheduling,
    )


@dataclass
class Request:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    abort_after: int | None = None  # abort once this many tokens were received
    after: str | None = None  # added once this request has finished


def random_params(rng: random.Random) -> SamplingParams:
    kind = rng.choice(
        ["plain", "plain", "stop-string", "stop-token", "ignore-eos", "min-tokens", "logprobs", "penalty"]
    )
    kw: dict[str, Any] = {"max_tokens": rng.randint(1, 24), "temperature": 0.0}
    if kind == "stop-string":
        kw["stop"] = rng.sample(STOP_STRINGS, 2) + [chr(c) for c in rng.sample(range(97, 123), 10)]
        kw["include_stop_str_in_output"] = rng.random() < 0.5
    elif kind == "stop-token":
        kw["stop_token_ids"] = rng.sample(range(1, VOCAB), 40)
    elif kind == "ignore-eos":
        kw["ignore_eos"] = True
    elif kind == "min-tokens":
        kw["min_tokens"] = min(kw["max_tokens"], 4)
    elif kind == "logprobs":
        kw["logprobs"] = 2  # these rows keep their step synchronous
    elif kind == "penalty":
        kw["repetition_penalty"] = 1.2
    return SamplingParams(**kw)


def random_workload(seed: int) -> list[Request]:
    rng = random.Random(seed)
    shared = [rng.randrange(1, 257) for _ in range(9)]
    requests = []
    for i in range(rng.randint(4, 10)):
        own = [rng.randrange(1, 257) for _ in range(rng.randint(1, 14))]
        prompt = (shared if rng.random() < 0.5 else []) + own
        abort_after = rng.randint(0, 6) if rng.random() < 0.2 else None
        after = f"r{rng.randrange(i)}" if i and rng.random() < 0.3 else None
        requests.append(Request(f"r{i}", prompt, random_params(rng), abort_after, after))
    return requests


@dataclass
class Result:
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    logprobs: list[Any] = field(default_factory=list)
    finish: tuple | None = None


def run(engine: LLMEngine, requests: list[Request]) -> dict[str, Result]:
    """Drive the engine; events depend only on outputs, so both engines see them at the same tokens."""
    results: dict[str, Result] = {}
    by_id = {r.request_id: r for r in requests}

    def add(req: Request) -> None:
        engine.add_request(req.request_id, req.prompt, req.params)
        results[req.request_id] = Result()

    for req in requests:
        if req.after is None:
            add(req)
    while engine.has_unfinished_requests():
        outputs: list[RequestOutput] = engine.step()
        for out in outputs:
            res = results[out.request_id]
            assert res.finish is None, f"{out.request_id} got an output after it finished"
            res.token_ids += out.new_token_ids
            res.text += out.new_text
            res.logprobs += out.new_logprobs or []
            assert out.num_output_tokens == len(res.token_ids)
            if out.finished:
                res.finish = (out.finish_reason, out.stop_reason)
                for later in requests:
                    if later.after == out.request_id:
                        add(later)
        for req_id, res in results.items():
            limit = by_id[req_id].abort_after
            if res.finish is None and limit is not None and len(res.token_ids) >= limit:
                engine.abort_request(req_id)
    assert set(results) == set(by_id) and all(r.finish for r in results.values())
    return results


@pytest.mark.parametrize("prefix", [True, False], ids=["prefix-cache", "no-prefix-cache"])
@pytest.mark.parametrize("num_kv_blocks", [64, 14], ids=["roomy", "preempting"])
@pytest.mark.parametrize("seed", range(6))
def test_overlapped_engine_equals_synchronous_engine(seed: int, num_kv_blocks: int, prefix: bool) -> None:
    requests = random_workload(seed)
    sync = make_engine(False, num_kv_blocks=num_kv_blocks, prefix=prefix)
    overlapped = make_engine(True, num_kv_blocks=num_kv_blocks, prefix=prefix)
    assert run(overlapped, requests) == run(sync, requests)
    assert sync.num_overlapped_steps == 0 and not sync.runner.launched_unread
    assert len(overlapped.runner.launched_unread) == overlapped.num_overlapped_steps
    assert all(overlapped.runner.launched_unread)  # launched before the previous tokens were read
    for engine in (sync, overlapped):
        stats = engine.stats()
        assert stats.num_running == stats.num_waiting == 0 and stats.kv_cache_usage == 0


@pytest.mark.parametrize("prefix", [True, False], ids=["prefix-cache", "no-prefix-cache"])
@pytest.mark.parametrize("num_kv_blocks", [64, 14], ids=["roomy", "preempting"])
def test_workloads_cover_every_finish_and_overlap(num_kv_blocks: int, prefix: bool) -> None:
    """The random workloads really cover what the equality test claims."""
    finishes: set[Any] = set()
    preemptions = overlapped = 0
    for seed in range(6):
        engine = make_engine(True, num_kv_blocks=num_kv_blocks, prefix=prefix)
        results = run(engine, random_workload(seed))
        preemptions += engine.stats().num_preemptions
        overlapped += engine.num_overlapped_steps
        for res in results.values():
            reason, stop = res.finish  # type: ignore[misc]
            finishes.add((reason, type(stop).__name__))
    assert {("stop", "int"), ("stop", "str"), ("length", "NoneType"), ("abort", "NoneType")} <= finishes
    assert overlapped > 10 and (preemptions > 0) == (num_kv_blocks == 14)


def test_steady_decode_overlaps_every_step_and_never_overshoots() -> None:
    engine = make_engine(True)
    lengths = {"a": 3, "b": 7, "c": 12, "d": 20}
    for req_id, n in lengths.items():
        engine.add_request(req_id, [10 + len(req_id), 20, 30], SamplingParams(max_tokens=n, ignore_eos=True))
    tokens: dict[str, list[int]] = {k: [] for k in lengths}
    steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
            assert len(tokens[out.request_id]) <= lengths[out.request_id]
        steps += 1
    assert {k: len(v) for k, v in tokens.items()} == lengths
    # one prefill step, read back at once (its first tokens are not held for the next launch); then every
    # decode step launched while the previous one was unread (the last one too: nobody knew yet that "d"
    # had its 20th token)
    assert steps == 20 and engine.num_overlapped_steps == 19
    assert engine.runner.launched_unread == [True] * 19
    assert engine.stats().kv_cache_usage == 0


def test_a_request_stopping_mid_stream_emits_nothing_more() -> None:
    """The step in flight computed one more token for a request that stopped: it is dropped."""
    engine = make_engine(True)
    stop_at_eos = SamplingParams(max_tokens=50)  # eos_sometimes makes EOS win now and then
    engine.add_request("eos", [5, 6, 7], stop_at_eos)
    engine.add_request("long", [8, 9], SamplingParams(max_tokens=30, ignore_eos=True))
    outputs: dict[str, list[RequestOutput]] = {"eos": [], "long": []}
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id].append(out)
    eos = outputs["eos"]
    assert eos[-1].finished and eos[-1].finish_reason == "stop" and eos[-1].new_token_ids == [EOS_TOKEN_ID]
    assert sum(len(o.new_token_ids) for o in eos) < 50 and not any(o.finished for o in eos[:-1])
    assert sum(len(o.new_token_ids) for o in outputs["long"]) == 30
    assert engine.num_overlapped_steps > 0


def test_abort_while_a_step_is_in_flight() -> None:
    engine = make_engine(True)
    engine.add_request("a", [1, 2, 3], SamplingParams(max_tokens=20, ignore_eos=True))
    engine.add_request("b", [4, 5, 6], SamplingParams(max_tokens=20, ignore_eos=True))
    received = {"a": 0, "b": 0}
    for _ in range(4):
        for out in engine.step():
            received[out.request_id] += len(out.new_token_ids)
    assert engine.num_overlapped_steps > 0  # a step is in flight now, with "a" in it
    engine.abort_request("a")
    assert engine.stats().num_running == 1
    outputs = engine.step()
    finals = [(o.finished, o.finish_reason, o.new_token_ids) for o in outputs if o.request_id == "a"]
    assert finals == [(True, "abort", [])]
    received["b"] += sum(len(o.new_token_ids) for o in outputs if o.request_id == "b")
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id == "b"
            received["b"] += len(out.new_token_ids)
    assert received == {"a": 4, "b": 20} and engine.stats().kv_cache_usage == 0


def test_scheduler_plans_ahead_only_plain_decodes() -> None:
    engine = make_engine(True, num_kv_blocks=64)
    engine.add_request("a", [1, 2, 3], SamplingParams(max_tokens=8, ignore_eos=True))
    engine.step()  # prefill: read back at once, nothing launched ahead (time to first token)
    assert engine.num_overlapped_steps == 0
    engine.step()  # a plain decode: the next decode is launched before this one is read back
    assert engine.num_overlapped_steps == 1
    engine.add_request("late", [4, 5], SamplingParams(max_tokens=2, ignore_eos=True))
    engine.step()  # "late" waits: the in-flight step is read back and nothing is launched ahead
    assert engine.num_overlapped_steps == 1 and engine.scheduler.num_waiting == 1
    engine.step()  # admits "late" with its prefill: a mixed step is not overlapped
    assert engine.num_overlapped_steps == 1
    engine.step()  # both decode: overlapped again
    assert engine.num_overlapped_steps == 2


def test_fill_placeholders_reads_rows_of_the_previous_samples() -> None:
    sampled = torch.tensor([7, 8, 9])
    ids = torch.tensor([-3, 5, -1, -2])
    assert fill_placeholders(ids, sampled).tolist() == [9, 5, 7, 8]


def test_prefix_cache_commits_only_resolved_tokens() -> None:
    bm = BlockManager(8, 4)
    seq = Seq(0, [1, 2, 3], SamplingParams(max_tokens=4), max_tokens=4)
    assert bm.admit(seq, 16) == 3
    seq.num_computed_tokens = 3
    seq.append_token(-1)  # a placeholder: the sampled id is still on the device
    seq.num_computed_tokens = 4
    bm.commit_computed(seq)
    assert len(bm._cache) == 0 and seq.num_resolved_tokens == 3
    seq.output_token_ids.__setitem__(-1, 9)
    bm.commit_computed(seq)
    assert len(bm._cache) == 1 and seq.block_tokens == [(1, 2, 3, 9)]


def test_real_runner_and_sampler_overlapped_equal_synchronous(tiny_checkpoint_factory: Any) -> None:
    """A tiny qwen3 checkpoint through the real runner and sampler (placeholders filled with torch):
    greedy, seeded and penalised requests that stop on strings and max_tokens mid-stream."""
    from kvpilot.runtime.llm import LLM

    path = str(tiny_checkpoint_factory("qwen3"))
    prompts = ["The quick brown fox", "Hi", "jumps over the lazy dog " * 3, "and then"]
    params = [
        SamplingParams(temperature=0.0, max_tokens=9),
        SamplingParams(temperature=0.8, seed=5, max_tokens=14, stop=["e", "a"]),
        SamplingParams(temperature=0.0, max_tokens=3, repetition_penalty=1.3),
        SamplingParams(temperature=0.9, top_k=20, seed=11, max_tokens=5, ignore_eos=True),
    ]
    results = []
    for async_scheduling in (False, True):
        llm = LLM(
            path,
            device="cpu",
            dtype="float32",
            max_model_len=128,
            block_size=4,
            async_scheduling=async_scheduling,
        )
        outs = llm.generate(prompts, params)
        results.append([(o.token_ids, o.text, o.finish_reason, o.stop_reason) for o in outs])
        assert (llm.engine.num_overlapped_steps > 0) == async_scheduling
    assert results[0] == results[1]
