"""prepare_inputs (numpy, one staging buffer) gives exactly what the plain list-building path gives."""

from __future__ import annotations

import random

import pytest
import torch
from kvpilot.runtime.engine.batch import SeqChunk, StepBatch
from kvpilot.runtime.engine.model_inputs import prepare_inputs

CPU = torch.device("cpu")


def reference_inputs(batch: StepBatch, block_size: int) -> dict[str, object]:
    """The straightforward per-token Python construction (the implementation before numpy)."""
    input_ids, positions, slots, cu_seqlens, context_lens, sample_indices = [], [], [], [0], [], []
    for c in batch.chunks:
        input_ids.extend(c.token_ids)
        positions.extend(range(c.start_pos, c.context_len))
        slots.extend(
            c.block_table[p // block_size] * block_size + p % block_size
            for p in range(c.start_pos, c.context_len)
        )
        cu_seqlens.append(len(input_ids))
        context_lens.append(c.context_len)
        if c.sample:
            sample_indices.append(len(input_ids) - 1)
    width = max((len(c.block_table) for c in batch.chunks), default=0)
    return {
        "input_ids": input_ids,
        "positions": positions,
        "slot_mapping": slots,
        "cu_seqlens_q": cu_seqlens,
        "context_lens": context_lens,
        "sample_indices": sample_indices,
        "block_tables": [c.block_table + [0] * (width - len(c.block_table)) for c in batch.chunks],
        "max_q_len": max((len(c.token_ids) for c in batch.chunks), default=0),
        "max_context_len": max(context_lens, default=0),
        "prefix_free": bool(batch.chunks) and all(c.start_pos == 0 for c in batch.chunks),
    }


def actual_inputs(batch: StepBatch, block_size: int) -> dict[str, object]:
    inputs = prepare_inputs(batch, block_size, CPU)
    m = inputs.meta
    assert inputs.input_ids.dtype == inputs.positions.dtype == m.slot_mapping.dtype == torch.int64
    assert inputs.sample_indices.dtype == torch.int64
    assert m.cu_seqlens_q.dtype == m.context_lens.dtype == m.block_tables.dtype == torch.int32
    assert m.block_tables.dim() == 2 and m.block_tables.shape[0] == len(batch.chunks)
    assert m.block_tables.is_contiguous()
    return {
        "input_ids": inputs.input_ids.tolist(),
        "positions": inputs.positions.tolist(),
        "slot_mapping": m.slot_mapping.tolist(),
        "cu_seqlens_q": m.cu_seqlens_q.tolist(),
        "context_lens": m.context_lens.tolist(),
        "sample_indices": inputs.sample_indices.tolist(),
        "block_tables": m.block_tables.tolist(),
        "max_q_len": m.max_q_len,
        "max_context_len": m.max_context_len,
        "prefix_free": m.prefix_free,
    }


def random_batch(rng: random.Random, block_size: int, *, decode_only: bool) -> StepBatch:
    chunks = []
    for seq_id in range(rng.randrange(1, 40)):
        start = rng.randrange(0, 300)
        n = 1 if decode_only or rng.random() < 0.5 else rng.randrange(1, 70)
        needed = -(-(start + n) // block_size)
        table = rng.sample(range(5000), needed + rng.choice([0, 0, 0, 2]))  # sometimes longer than needed
        chunks.append(
            SeqChunk(seq_id, [rng.randrange(150_000) for _ in range(n)], start, table, rng.random() < 0.8)
        )
    return StepBatch(chunks)


@pytest.mark.parametrize("decode_only", [True, False])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_matches_the_list_path_on_random_batches(decode_only: bool, block_size: int) -> None:
    rng = random.Random(block_size * 2 + decode_only)
    for _ in range(25):
        batch = random_batch(rng, block_size, decode_only=decode_only)
        assert actual_inputs(batch, block_size) == reference_inputs(batch, block_size)


def test_equal_length_tables_and_an_empty_batch() -> None:
    batch = StepBatch([SeqChunk(i, [i + 1], 4 * i + 3, [i, i + 10, 9], True) for i in range(2)])
    assert actual_inputs(batch, 4) == reference_inputs(batch, 4)
    assert actual_inputs(StepBatch([]), 4) == reference_inputs(StepBatch([]), 4)


def test_tensors_do_not_overlap() -> None:
    batch = StepBatch([SeqChunk(0, [5, 6, 7], 0, [3], True), SeqChunk(1, [8], 5, [1, 2], True)])
    inputs = prepare_inputs(batch, 4, CPU)
    inputs.input_ids.fill_(-1)
    inputs.meta.cu_seqlens_q.fill_(-1)
    assert inputs.positions.tolist() == [0, 1, 2, 5]
    assert inputs.meta.context_lens.tolist() == [3, 6]
    assert inputs.meta.block_tables.tolist() == [[3, 0], [1, 2]]
    assert inputs.sample_indices.tolist() == [2, 3]


def test_a_short_table_is_reported_for_the_right_sequence() -> None:
    batch = StepBatch([SeqChunk(0, [1], 3, [0], True), SeqChunk(7, [1, 2], 3, [0], False)])
    with pytest.raises(ValueError, match="sequence 7: block table of 1 blocks cannot hold 5 tokens"):
        prepare_inputs(batch, 4, CPU)


@pytest.mark.parametrize("prompt_lens", [[1], [3], [5, 1, 1], [17, 2, 1, 1, 1], [7] * 9])
def test_every_staged_tensor_starts_16_byte_aligned(prompt_lens: list[int]) -> None:
    """Triton specialises kernels on 16-byte pointer alignment: views at odd offsets of the staging buffer
    would compile new kernel variants as batch sizes change (a 0.5-1.5 s stall mid-serving on the GPU)."""
    chunks = [
        SeqChunk(i, list(range(n)), 3 * i, list(range(i, i + 1 + (3 * i + n) // 4)), True)
        for i, n in enumerate(prompt_lens)
    ]
    inputs = prepare_inputs(StepBatch(chunks), 4, CPU)
    meta = inputs.meta
    tensors = {
        "input_ids": inputs.input_ids,
        "positions": inputs.positions,
        "sample_indices": inputs.sample_indices,
        "slot_mapping": meta.slot_mapping,
        "cu_seqlens_q": meta.cu_seqlens_q,
        "context_lens": meta.context_lens,
        "block_tables": meta.block_tables,
    }
    base = inputs.input_ids.data_ptr()
    misaligned = {k: (t.data_ptr() - base) % 16 for k, t in tensors.items() if (t.data_ptr() - base) % 16}
    assert not misaligned, misaligned
    assert inputs.positions.tolist() == [
        p for i, n in enumerate(prompt_lens) for p in range(3 * i, 3 * i + n)
    ]


def test_prefix_free_only_when_no_sequence_has_cached_tokens() -> None:
    prompts = [SeqChunk(i, list(range(1, 6 + i)), 0, [i, 10 + i], True) for i in range(3)]
    assert prepare_inputs(StepBatch(prompts), 4, CPU).meta.prefix_free
    extend = SeqChunk(9, [7, 8], 3, [20, 21], True)  # a chunk after 3 cached tokens
    assert not prepare_inputs(StepBatch([*prompts, extend]), 4, CPU).meta.prefix_free
    assert not prepare_inputs(StepBatch([]), 4, CPU).meta.prefix_free
