"""The host-side caches of the engine's hot path give exactly what the uncached computation gives."""

from __future__ import annotations

import random
import struct
from typing import Any

import torch
from kvpilot.runtime.engine.batch import SeqChunk, StepBatch
from kvpilot.runtime.engine.llm_engine import LLMEngine
from kvpilot.runtime.engine.model_inputs import prepare_inputs
from kvpilot.runtime.engine.request_state import RequestState
from kvpilot.runtime.engine.sequence import Sequence
from kvpilot.runtime.sampling_params import SamplingParams

from tests.runtime.fake_model import FakeRunner, FakeSampledToken, FakeSampler, FakeTokenizer


def _reference_summary(chunks: list[SeqChunk]) -> tuple[int, int, bool]:
    return (
        sum(len(c.token_ids) for c in chunks),
        sum(1 for c in chunks if c.sample),
        all(len(c.token_ids) == 1 for c in chunks),
    )


def _summary(batch: StepBatch) -> tuple[int, int, bool]:
    return batch.num_tokens, batch.num_sampled, batch.is_decode_only


def test_step_batch_properties_match_the_uncached_sums_while_the_batch_grows() -> None:
    rng = random.Random(0)
    batch = StepBatch([])
    assert _summary(batch) == (0, 0, True)
    for i in range(60):
        n = rng.choice([1, 1, 1, 0, 2, 7])
        batch.chunks.append(SeqChunk(i, [5] * n, rng.randrange(50), [1, 2, 3, 4], rng.random() < 0.8))
        if rng.random() < 0.5:  # read part-way through building: the summary must follow the growth
            assert _summary(batch) == _reference_summary(batch.chunks)
    assert _summary(batch) == _reference_summary(batch.chunks)


def test_decode_only_needs_exactly_one_token_per_chunk() -> None:
    """Zero- and two-token chunks that sum to one token per chunk are not a decode-only batch."""
    batch = StepBatch([SeqChunk(0, [], 3, [0], False), SeqChunk(1, [4, 5], 3, [1], True)])
    assert _summary(batch) == (2, 1, False) == _reference_summary(batch.chunks)
    assert StepBatch([SeqChunk(0, [9], 3, [0], True)]).is_decode_only


# ---- the engine's counters and the request's short path ---------------------------------------
def _random_params(rng: random.Random) -> SamplingParams:
    kind = rng.randrange(5)
    return SamplingParams(
        temperature=0.0,
        max_tokens=rng.randrange(1, 12),
        detokenize=rng.random() < 0.5,
        logprobs=2 if kind == 1 else None,
        repetition_penalty=1.2 if kind == 2 else 1.0,
        stop=["at"] if kind == 3 else [],
        stop_token_ids=[rng.randrange(1, 60)] if kind == 4 else [],
        min_tokens=rng.randrange(3),
        ignore_eos=rng.random() < 0.5,
    )


def test_engine_counts_match_its_requests_through_adds_aborts_and_finishes() -> None:
    """_num_no_overlap / _num_logprobs (kept on add and forget) equal a count over the requests, and
    the overlap decision equals the per-sequence check."""
    rng = random.Random(3)
    engine = LLMEngine(
        FakeRunner(num_kv_blocks=48, block_size=4, max_model_len=64),
        FakeTokenizer(),
        FakeSampler(),
        max_num_seqs=6,
        max_num_batched_tokens=32,
    )
    ids = iter(range(10**6))
    for _ in range(120):
        if rng.random() < 0.4:
            prompt = [rng.randrange(1, 200) for _ in range(rng.randrange(1, 20))]
            engine.add_request(str(next(ids)), prompt, _random_params(rng))
        if engine._requests and rng.random() < 0.1:
            engine.abort_request(rng.choice(list(engine._requests)))
        engine.step()
        reqs = engine._requests.values()
        assert engine._num_no_overlap == sum(not r.can_overlap for r in reqs)
        assert engine._num_logprobs == sum(r.seq.params.logprobs is not None for r in reqs)
        uncached = engine.scheduler.can_schedule_decodes_only() and all(
            engine._by_seq[s.seq_id].can_overlap for s in engine.scheduler.running
        )
        assert engine._can_overlap() == uncached
    assert engine.num_overlapped_steps > 0


def test_process_token_short_path_gives_the_general_paths_output() -> None:
    rng = random.Random(5)
    tokenizer = FakeTokenizer()
    for _ in range(200):
        params = _random_params(rng)
        prompt = [rng.randrange(1, 200) for _ in range(5)]
        seqs = [Sequence(0, prompt, params, max_tokens=params.max_tokens) for _ in range(2)]
        fast, slow = (RequestState("r", s, tokenizer, frozenset({0})) for s in seqs)
        slow._simple = False
        limit = rng.randrange(7, 20)
        for _ in range(params.max_tokens):
            token = rng.choice([0, rng.randrange(1, 60), 97, 116])  # EOS, stop ids, "a", "t"
            for s in seqs:
                s.append_token(token)
            sampled = FakeSampledToken(token, -1.0, [(token, -1.0)])
            a, b = fast.process_token(sampled, limit), slow.process_token(sampled, limit)
            assert a == b
            if a.finished:
                break


# ---- packed block tables ------------------------------------------------------------------------
class CheckingRunner(FakeRunner):
    """Checks each batch's packed tables when it runs (the live tables grow after the step)."""

    num_checked = 0

    def execute(self, batch: StepBatch, prev_sampled: Any = None) -> list[list[float]]:
        for chunk in batch.chunks:
            table = chunk.block_table
            assert chunk.block_table_bytes == struct.pack(f"={len(table)}i", *table)
            self.num_checked += 1
        plain = StepBatch([c._replace(block_table_bytes=None) for c in batch.chunks])
        cached, uncached = (prepare_inputs(b, self.block_size, torch.device("cpu")) for b in (batch, plain))
        assert torch.equal(cached.meta.block_tables, uncached.meta.block_tables)
        assert torch.equal(cached.meta.slot_mapping, uncached.meta.slot_mapping)
        return super().execute(batch, prev_sampled)


def test_packed_block_tables_follow_growth_preemption_and_prefix_hits() -> None:
    """Every chunk's cached int32 table equals its live block table packed afresh, on a workload small
    enough to preempt and with shared prefixes (prefix-cache hits); prepare_inputs gives the same
    tensors with and without the packed tables."""
    rng = random.Random(11)
    engine = LLMEngine(
        CheckingRunner(num_kv_blocks=24, block_size=4, max_model_len=64),
        FakeTokenizer(),
        FakeSampler(),
        max_num_seqs=8,
        max_num_batched_tokens=24,
    )
    shared = [rng.randrange(1, 200) for _ in range(9)]
    for i in range(30):
        prompt = shared + [rng.randrange(1, 200) for _ in range(rng.randrange(1, 8))]
        engine.add_request(
            str(i),
            prompt,
            SamplingParams(
                temperature=0.0, max_tokens=rng.randrange(4, 20), ignore_eos=True, detokenize=False
            ),
        )
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.runner.num_checked > 100
    assert engine.scheduler.num_preemptions > 0 and engine.block_manager.prefix_cache_hits > 0


def test_packed_block_table_repacks_a_replaced_or_shrunk_table() -> None:
    seq = Sequence(0, [1, 2, 3], SamplingParams(), max_tokens=4)
    assert seq.packed_block_table() == b""
    seq.block_table.extend([7, 8])
    assert seq.packed_block_table() == struct.pack("=2i", 7, 8)
    seq.block_table.append(9)
    assert seq.packed_block_table() == struct.pack("=3i", 7, 8, 9)
    seq.block_table = [4, 5, 6]  # same length, new list: repacked
    assert seq.packed_block_table() == struct.pack("=3i", 4, 5, 6)
    seq.block_table.pop()
    assert seq.packed_block_table() == struct.pack("=2i", 4, 5)
    seq.reset_for_recompute()
    assert seq.packed_block_table() == b""


def test_row_plan_fast_path_matches_the_full_pass() -> None:
    from kvpilot.runtime.engine.sample_row import SampleRow
    from kvpilot.runtime.engine.sampler import _RowPlan

    plain = SampleRow(SamplingParams(temperature=0.0), [1], [])
    others = [
        SampleRow(SamplingParams(temperature=0.0), [1], [], frozenset({0})),
        SampleRow(SamplingParams(temperature=0.0, logprobs=1), [1], []),
        SampleRow(SamplingParams(temperature=0.0, presence_penalty=0.5), [1], []),
        SampleRow(SamplingParams(temperature=0.7), [1], []),
    ]
    assert plain.plain_greedy and not any(r.plain_greedy for r in others)
    for rows in ([plain] * 5, [plain, others[0]], [others[1], plain], [*others, plain], []):
        fast = _RowPlan.of(rows)
        # one random row more forces the full pass over the same rows
        slow = _RowPlan.of(
            [SampleRow(r.params, r.prompt_token_ids, r.output_token_ids, r.banned_token_ids) for r in rows]
            + [others[3]]
        )
        assert (fast.plain_greedy, fast.processed, fast.any_logprobs) == (
            slow.plain_greedy,
            slow.processed,
            slow.any_logprobs,
        )
        assert fast.random == slow.random[:-1]
