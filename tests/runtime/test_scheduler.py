"""Scheduler: budget, no starvation, chunked prefill, preemption by recompute, abort, max_num_seqs.

A fake model that reads every token back through the block tables (tests/runtime/fake_model.py) checks
that whatever the scheduler does, each sequence generates exactly what greedy decoding of its true
context gives.
"""

from __future__ import annotations

import random

import pytest
from kvpilot.runtime.engine.block_manager import BlockManager
from kvpilot.runtime.engine.scheduler import Scheduler, SchedulerOutput
from kvpilot.runtime.engine.sequence import Sequence, SequenceStatus
from kvpilot.runtime.sampling_params import SamplingParams

from tests.runtime.fake_model import FakeRunner, greedy_token, reference_greedy

BS = 4


def make_seq(seq_id: int, prompt_len: int, max_tokens: int = 6, seed: int = 0) -> Sequence:
    rng = random.Random(seq_id * 1000 + seed)
    prompt = [rng.randrange(1, 200) for _ in range(prompt_len)]
    return Sequence(seq_id, prompt, SamplingParams(max_tokens=max_tokens), max_tokens=max_tokens)


def make_scheduler(
    num_blocks: int = 64,
    max_num_seqs: int = 8,
    budget: int = 32,
    prefix_caching: bool = True,
    max_model_len: int = 256,
) -> Scheduler:
    return Scheduler(
        BlockManager(num_blocks, BS, prefix_caching),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
    )


def check_step(sched: Scheduler, out: SchedulerOutput) -> None:
    """Invariants that must hold after every schedule()."""
    assert out.batch.num_tokens <= sched.max_num_batched_tokens
    assert len(sched.running) <= sched.max_num_seqs
    ids = [c.seq_id for c in out.batch.chunks]
    assert len(ids) == len(set(ids))
    for chunk, sc in zip(out.batch.chunks, out.scheduled, strict=True):
        assert sc.seq.status is SequenceStatus.RUNNING and len(chunk.token_ids) == sc.num_tokens >= 1
        assert len(chunk.block_table) == -(-chunk.context_len // BS)
        assert (
            chunk.token_ids == sc.seq.token_slice(0, sc.seq.num_tokens)[chunk.start_pos : chunk.context_len]
        )
        assert chunk.sample == (chunk.context_len == sc.seq.num_tokens)
    held = [b for s in sched.running for b in s.block_table]
    assert all(not s.block_table for s in sched.waiting)
    assert sched.block_manager.num_used_blocks == len(set(held))


def run(sched: Scheduler, runner: FakeRunner, seqs: list[Sequence], on_step=None) -> list[SchedulerOutput]:
    for s in seqs:
        sched.add(s)
    steps: list[SchedulerOutput] = []
    while sched.waiting or sched.running:
        out = sched.schedule()
        check_step(sched, out)
        assert not out.is_empty, "no progress"
        logits = runner.execute(out.batch)
        sampled_chunks = [c for c in out.scheduled if c.sample]
        sampled = {c.seq.seq_id: greedy_token(row) for c, row in zip(sampled_chunks, logits, strict=True)}
        sched.update(out, sampled)
        for c in sampled_chunks:
            if c.seq.num_output_tokens >= c.seq.max_tokens:
                sched.finish(c.seq)
        steps.append(out)
        if on_step:
            on_step(len(steps), out)
        assert len(steps) < 10_000
    return steps


def assert_outputs_correct(runner: FakeRunner, seqs: list[Sequence]) -> None:
    for s in seqs:
        assert s.output_token_ids == reference_greedy(runner.logits_fn, s.prompt_token_ids, s.max_tokens)


def test_budget_respected_and_outputs_correct() -> None:
    sched, runner = make_scheduler(budget=16), FakeRunner(block_size=BS)
    seqs = [make_seq(i, n) for i, n in enumerate([3, 17, 40, 5, 9, 33])]
    steps = run(sched, runner, seqs)
    assert max(s.batch.num_tokens for s in steps) == 16
    assert_outputs_correct(runner, seqs)
    assert sched.block_manager.num_used_blocks == 0


def test_chunked_prefill_progression() -> None:
    sched, runner = make_scheduler(budget=8), FakeRunner(block_size=BS)
    seq = make_seq(0, 30, max_tokens=3)
    steps = run(sched, runner, [seq])
    chunks = [(s.batch.chunks[0].start_pos, len(s.batch.chunks[0].token_ids)) for s in steps]
    assert chunks == [(0, 8), (8, 8), (16, 8), (24, 6), (30, 1), (31, 1)]
    assert [s.batch.chunks[0].sample for s in steps] == [False, False, False, True, True, True]
    assert_outputs_correct(runner, [seq])


def test_decodes_never_starved_by_long_prompts() -> None:
    sched = make_scheduler(num_blocks=256, budget=8, max_num_seqs=4)
    runner = FakeRunner(block_size=BS, num_kv_blocks=256)
    first = make_seq(0, 2, max_tokens=30)
    flood = [make_seq(i, 60, max_tokens=2) for i in range(1, 7)]
    decoded_steps = []

    def on_step(i: int, out: SchedulerOutput) -> None:
        if first.status is SequenceStatus.RUNNING and (first.num_uncomputed_tokens <= 1):
            decoded_steps.append(any(c.seq_id == 0 for c in out.batch.chunks))

    sched.add(first)
    run(sched, runner, flood, on_step)
    assert first.num_output_tokens == 30
    assert all(decoded_steps[:-1])  # every step while it ran included its decode
    assert_outputs_correct(runner, [first, *flood])


def test_max_num_seqs_respected() -> None:
    sched, runner = make_scheduler(max_num_seqs=3, budget=64), FakeRunner(block_size=BS)
    seqs = [make_seq(i, 5, max_tokens=4) for i in range(8)]
    peak = []
    run(sched, runner, seqs, lambda i, out: peak.append(len(out.batch.chunks)))
    assert max(peak) == 3
    assert_outputs_correct(runner, seqs)


def test_fcfs_admission_order() -> None:
    sched, runner = make_scheduler(max_num_seqs=1, budget=64), FakeRunner(block_size=BS)
    seqs = [make_seq(i, 5, max_tokens=2) for i in range(4)]
    order = []
    run(
        sched,
        runner,
        seqs,
        lambda i, out: order.extend(c.seq_id for c in out.batch.chunks if c.seq_id not in order),
    )
    assert order == [0, 1, 2, 3]


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_preemption_when_blocks_run_out_and_resume_identical(prefix_caching: bool) -> None:
    # 12 blocks of 4 = 48 slots; 4 sequences that each grow to 6 + 16 = 22 tokens (6 blocks)
    sched = make_scheduler(num_blocks=12, budget=32, prefix_caching=prefix_caching)
    runner = FakeRunner(block_size=BS, num_kv_blocks=12)
    seqs = [make_seq(i, 6, max_tokens=16) for i in range(4)]
    preempted_ids = []
    run(sched, runner, seqs, lambda i, out: preempted_ids.extend(s.seq_id for s in out.preempted))
    assert sched.num_preemptions > 0 and preempted_ids
    assert 0 not in preempted_ids  # the oldest sequence is never the victim while newer ones run
    assert_outputs_correct(runner, seqs)
    assert sched.block_manager.num_used_blocks == 0


def test_preempted_sequence_recomputes_prompt_and_output() -> None:
    sched = make_scheduler(num_blocks=6, budget=32, prefix_caching=False)
    runner = FakeRunner(block_size=BS, num_kv_blocks=6)
    a, b = make_seq(0, 7, max_tokens=14), make_seq(1, 7, max_tokens=14)
    recomputes = []

    def on_step(i: int, out: SchedulerOutput) -> None:
        recomputes.extend(
            (c.seq_id, c.start_pos, len(c.token_ids))
            for c in out.batch.chunks
            if c.start_pos == 0 and len(c.token_ids) > 7
        )

    run(sched, runner, [a, b], on_step)
    assert b.num_preemptions >= 1
    assert any(seq_id == 1 for seq_id, _, _ in recomputes)  # prompt + generated tokens re-prefilled
    assert_outputs_correct(runner, [a, b])


def test_abort_frees_every_block_in_every_state() -> None:
    sched, runner = make_scheduler(num_blocks=32, budget=8, max_num_seqs=2), FakeRunner(block_size=BS)
    decoding, prefilling, waiting = make_seq(0, 3, 50), make_seq(1, 30, 50), make_seq(2, 5, 50)
    for s in (decoding, prefilling, waiting):
        sched.add(s)
    for _ in range(2):
        out = sched.schedule()
        runner.execute(out.batch)
        sched.update(out, {c.seq.seq_id: 1 for c in out.scheduled if c.sample})
    assert (
        (decoding.num_uncomputed_tokens <= 1)
        and not (prefilling.num_uncomputed_tokens <= 1)
        and prefilling.block_table
    )
    assert waiting.status is SequenceStatus.WAITING
    for s in (prefilling, waiting, decoding):
        assert sched.abort(s)
        assert s.status is SequenceStatus.FINISHED and s.block_table == []
        assert not sched.abort(s)  # idempotent
    assert sched.block_manager.num_used_blocks == 0 and not (sched.waiting or sched.running)


def test_abort_between_schedule_and_update_is_skipped() -> None:
    sched = make_scheduler()
    a, b = make_seq(0, 5), make_seq(1, 5)
    sched.add(a)
    sched.add(b)
    out = sched.schedule()
    sched.abort(a)
    sched.update(out, {0: 7, 1: 8})
    assert a.output_token_ids == [] and b.output_token_ids == [8]
    assert sched.block_manager.num_used_blocks == len(b.block_table)


def test_prefix_cache_shortens_prefill_of_a_repeated_prompt() -> None:
    sched, runner = make_scheduler(budget=64), FakeRunner(block_size=BS)
    first = make_seq(0, 21, max_tokens=3)
    run(sched, runner, [first])
    again = Sequence(1, list(first.prompt_token_ids), SamplingParams(max_tokens=3), max_tokens=3)
    steps = run(sched, runner, [again])
    assert steps[0].batch.chunks[0].start_pos == 20 and again.num_cached_tokens == 20
    assert again.output_token_ids == first.output_token_ids


def test_add_rejects_sequences_that_cannot_fit() -> None:
    sched = make_scheduler(num_blocks=4, max_model_len=100)
    with pytest.raises(ValueError, match="more than the 16"):
        sched.add(make_seq(0, 10, max_tokens=7))
    with pytest.raises(ValueError):
        make_scheduler(budget=0)


def test_running_never_exceeds_budget_so_decodes_fit() -> None:
    sched, runner = make_scheduler(max_num_seqs=16, budget=3), FakeRunner(block_size=BS)
    seqs = [make_seq(i, 2, max_tokens=5) for i in range(6)]
    run(sched, runner, seqs)
    assert_outputs_correct(runner, seqs)


@pytest.mark.parametrize("seed", range(6))
def test_random_workloads_stay_correct(seed: int) -> None:
    rng = random.Random(seed)
    num_blocks = rng.choice([10, 16, 40])
    sched = make_scheduler(
        num_blocks=num_blocks,
        max_num_seqs=rng.choice([2, 4, 8]),
        budget=rng.choice([4, 7, 16, 64]),
        prefix_caching=rng.random() < 0.7,
    )
    runner = FakeRunner(block_size=BS, num_kv_blocks=num_blocks)
    shared = [rng.randrange(1, 200) for _ in range(9)]
    seqs = []
    for i in range(10):
        own = [rng.randrange(1, 200) for _ in range(rng.randrange(1, 12))]
        prompt = (shared if rng.random() < 0.5 else []) + own
        seqs.append(Sequence(i, prompt, SamplingParams(), max_tokens=rng.randrange(1, 12)))
    run(sched, runner, seqs)
    assert_outputs_correct(runner, seqs)
    assert sched.block_manager.num_used_blocks == 0
