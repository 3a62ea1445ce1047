"""Flattening a StepBatch into the tensors one model step reads (built on the host, then copied once)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from kvpilot.runtime.engine.batch import StepBatch
from kvpilot.runtime.layers.attention import AttentionMetadata


@dataclass
class ModelInputs:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    meta: AttentionMetadata
    sample_indices: torch.Tensor  # [num_sampled] int64: the rows whose logits are returned, in chunk order


def prepare_inputs(batch: StepBatch, block_size: int, device: torch.device) -> ModelInputs:
    """Flatten a StepBatch: token ids, positions, cache slots, per-sequence lengths, padded block tables."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    cu_seqlens, context_lens, sample_indices = [0], [], []
    for chunk in batch.chunks:
        if len(chunk.block_table) * block_size < chunk.context_len:
            raise ValueError(f"sequence {chunk.seq_id}: block table of {len(chunk.block_table)} blocks "
                             f"cannot hold {chunk.context_len} tokens at block size {block_size}")
        chunk_positions = range(chunk.start_pos, chunk.context_len)
        input_ids.extend(chunk.token_ids)
        positions.extend(chunk_positions)
        slots.extend(chunk.block_table[p // block_size] * block_size + p % block_size
                     for p in chunk_positions)
        cu_seqlens.append(len(input_ids))
        context_lens.append(chunk.context_len)
        if chunk.sample:
            sample_indices.append(len(input_ids) - 1)
    max_blocks = max((len(c.block_table) for c in batch.chunks), default=0)
    tables = [c.block_table + [0] * (max_blocks - len(c.block_table)) for c in batch.chunks]

    pin = device.type == "cuda"

    def tensor(values: list, dtype: torch.dtype) -> torch.Tensor:
        # Built on the host, pinned, then copied without a sync: one small H2D copy per tensor.
        host = torch.tensor(values, dtype=dtype)
        return host.pin_memory().to(device, non_blocking=True) if pin else host

    meta = AttentionMetadata(
        slot_mapping=tensor(slots, torch.int64),
        cu_seqlens_q=tensor(cu_seqlens, torch.int32),
        context_lens=tensor(context_lens, torch.int32),
        block_tables=tensor(tables, torch.int32).reshape(len(tables), max_blocks),
        max_q_len=max((len(c.token_ids) for c in batch.chunks), default=0),
        max_context_len=max(context_lens, default=0),
    )
    return ModelInputs(tensor(input_ids, torch.int64), tensor(positions, torch.int64), meta,
                       tensor(sample_indices, torch.int64))
