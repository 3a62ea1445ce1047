"""Pipeline micro-batching's pure parts: the wavefront order of (stage, micro-batch) work, the split of a
step's sequences into micro-batches, and when a step is worth splitting."""

from __future__ import annotations

import pytest
from kvpilot.runtime.distributed.micro_batch import (
    ChunkShape,
    contiguous_split,
    micro_batch_cuts,
    plan_micro_batches,
    plan_step,
    stage_order,
    wavefront,
)
from kvpilot.runtime.engine.batch import PromptRows, SeqChunk, StepBatch


def test_wavefront_overlaps_the_stages() -> None:
    # stage 1 works on micro-batch m - 1 while stage 0 works on m: both busy at ticks 1 and 2
    assert wavefront(2, 3) == [[(0, 0)], [(0, 1), (1, 0)], [(0, 2), (1, 1)], [(1, 2)]]
    ticks = wavefront(4, 4)
    assert len(ticks) == 4 + 4 - 1  # instead of 4 stages x (the whole batch)
    assert ticks[3] == [(0, 3), (1, 2), (2, 1), (3, 0)]  # all four stages busy at once
    events = [e for tick in ticks for e in tick]
    assert sorted(events) == [(s, m) for s in range(4) for m in range(4)]  # each exactly once
    for s, m in events:  # a stage runs m only after the previous stage ran it
        if s:
            assert events.index((s - 1, m)) < events.index((s, m))


def test_each_stage_runs_micro_batches_in_order() -> None:
    assert [stage_order(s, 3, 4) for s in range(3)] == [[0, 1, 2, 3]] * 3
    assert stage_order(1, 2, 1) == [0]


@pytest.mark.parametrize(
    ("tokens", "parts", "cuts"),
    [
        ([4, 4, 4, 4], 2, [0, 2, 4]),
        ([16, 4, 4], 2, [0, 1, 3]),
        ([1, 1, 1, 100], 2, [0, 3, 4]),  # one long prefill chunk is one unit
        ([5, 5], 4, [0, 1, 2]),  # never more parts than chunks
        ([3, 3, 3, 3, 3, 3], 3, [0, 2, 4, 6]),
        ([100, 1, 1, 1], 3, [0, 1, 2, 4]),  # every part keeps at least one chunk
    ],
)
def test_contiguous_split_balances_tokens(tokens: list[int], parts: int, cuts: list[int]) -> None:
    assert contiguous_split(tokens, parts) == cuts


def test_small_steps_stay_whole_and_large_ones_split() -> None:
    ridge = 256
    assert micro_batch_cuts([1] * 64, 2, ridge) == [0, 64]  # a decode of 64 sequences: weight-bound
    assert micro_batch_cuts([512] * 4, 2, ridge) == [0, 2, 4]  # 2048 prefill tokens: compute-bound
    assert micro_batch_cuts([512] * 4, 4, ridge) == [0, 1, 2, 3, 4]
    assert micro_batch_cuts([2048], 2, ridge) == [0, 1]  # one chunk: nothing to split
    assert micro_batch_cuts([300, 300], 1, ridge) == [0, 2]  # one stage: nothing to overlap
    # 3 micro-batches of ~171 tokens would each cost a ridge: 2 of 256 are cheaper
    assert micro_batch_cuts([128] * 4, 3, ridge) == [0, 2, 4]


def test_plan_rows_and_lengths() -> None:
    chunks = [ChunkShape(10, 30, 1), ChunkShape(6, 6, 0), ChunkShape(1, 40, 1), ChunkShape(1, 9, 1)]
    plan = plan_micro_batches(chunks, 2, ridge_tokens=1)
    assert [(p.chunk_start, p.chunk_end) for p in plan] == [(0, 1), (1, 4)]
    assert [(p.token_start, p.token_end) for p in plan] == [(0, 10), (10, 18)]
    assert [(p.row_start, p.row_end) for p in plan] == [(0, 1), (1, 3)]
    assert [(p.max_q_len, p.max_context_len) for p in plan] == [(10, 30), (6, 40)]


def test_prompt_logprob_steps_stay_whole() -> None:
    chunks = [SeqChunk(i, [1] * 8, 0, [i, i + 4], True) for i in range(4)]
    assert len(plan_step(StepBatch(chunks), 2, ridge_tokens=1)) == 2
    with_prompt_rows = StepBatch(chunks, [PromptRows(0, 0, 3)])
    assert len(plan_step(with_prompt_rows, 2, ridge_tokens=1)) == 1


def test_the_memory_profile_runs_steps_whole() -> None:
    import torch
    from kvpilot.runtime.distributed.comm import Comm
    from kvpilot.runtime.distributed.pipeline import PipelineStage
    from torch import nn

    stage = PipelineStage(
        nn.Identity(),
        Comm.single(torch.device("cpu")),
        hidden_size=8,
        vocab_size=16,
        dtype=torch.float32,
        ridge_tokens=1,
    )
    batch = StepBatch([SeqChunk(i, [1] * 8, 0, [i, i + 4], True) for i in range(4)])
    assert len(plan_step(batch, 2, stage.ridge_tokens)) == 2
    with stage.whole_steps():
        assert len(plan_step(batch, 2, stage.ridge_tokens)) == 1
    assert stage.ridge_tokens == 1
