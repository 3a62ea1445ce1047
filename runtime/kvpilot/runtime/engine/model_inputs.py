"""Flattening a StepBatch into the tensors one model step reads (built on the host, then copied once).

The host side is numpy: a few list comprehensions over the chunks gather the per-sequence numbers,
every per-token array (positions, slots) is computed vectorised, and everything is written into ONE
int64 staging buffer (pinned when the device is CUDA) whose tail holds the int32 arrays. One host to
device copy moves it all; the tensors handed to the model are views into the device copy.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from itertools import chain

import numpy as np
import torch
from kvpilot.runtime.engine.batch import SeqChunk, StepBatch
from kvpilot.runtime.layers.attention import AttentionMetadata, MixedSplit, PromptPart


@dataclass
class ModelInputs:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    meta: AttentionMetadata
    sample_indices: torch.Tensor  # [num_sampled] int64: the rows whose logits are returned, in chunk order


@dataclass
class _HostArrays:
    """The step's arrays on the host, before staging."""

    input_ids: np.ndarray  # int64 [T]
    positions: np.ndarray  # int64 [T]
    slots: np.ndarray  # int64 [T]
    sample_indices: np.ndarray  # int64 [S]
    cu_seqlens: np.ndarray  # int32 [n + 1]
    context_lens: np.ndarray  # int32 [n]
    block_tables: np.ndarray  # int32 [n, max_blocks]
    max_q_len: int


def prepare_inputs(batch: StepBatch, block_size: int, device: torch.device) -> ModelInputs:
    """Flatten a StepBatch: token ids, positions, cache slots, per-sequence lengths, padded block tables."""
    host = _host_arrays(batch.chunks, block_size)
    return _stage(host, device)


def prepare_padded_inputs(
    batch: StepBatch, block_size: int, device: torch.device, query_len: int
) -> ModelInputs:
    """prepare_inputs for a step graph of `query_len` rows per sequence: each chunk (at most query_len
    tokens, its context at least query_len) is front-padded with rows that store nothing (slot -1) and sit
    at the positions just before the chunk's, so the chunk's own rows keep their positions and causal
    limits. Sample indices point into the padded layout."""
    pads = [query_len - len(c.token_ids) for c in batch.chunks]
    padded = [
        c._replace(token_ids=[0] * pad + c.token_ids, start_pos=c.start_pos - pad)
        for c, pad in zip(batch.chunks, pads, strict=True)
    ]
    host = _host_arrays(padded, block_size)
    pad_rows = np.arange(query_len)[None, :] < np.asarray(pads)[:, None]  # [n, query_len]
    host.slots[pad_rows.reshape(-1)] = -1
    return _stage(host, device)


def prepare_prefill_graph_inputs(
    chunk: SeqChunk, bucket: int, block_size: int, device: torch.device
) -> ModelInputs:
    """A lone prefill chunk (start_pos 0) laid out for a prefill graph of `bucket` rows
    (engine/prefill_graphs.py): a padding sequence of bucket - len(chunk) rows first (slot -1: stores
    nothing; block 0; attends only to itself), then the chunk at its own positions; one sampled row."""
    pad = bucket - len(chunk.token_ids)
    if pad < 0 or chunk.start_pos != 0:
        raise ValueError(
            f"a prefill graph of {bucket} rows cannot run {len(chunk.token_ids)} tokens "
            f"from position {chunk.start_pos}"
        )
    padding = SeqChunk(-1, [0] * pad, 0, [0] * -(-pad // block_size), False)
    host = _host_arrays([padding, chunk], block_size)
    host.slots[:pad] = -1
    return _stage(host, device)


def _block_tables(chunks: list[SeqChunk], table_lens: np.ndarray) -> np.ndarray:
    """[n, max_blocks] int32, each row a chunk's block table padded with 0."""
    n = len(chunks)
    width = int(table_lens.max()) if n else 0
    total = int(table_lens.sum())
    packed_tables = [c.block_table_bytes for c in chunks]
    if None in packed_tables:  # struct packs Python ints into int32 faster than np.fromiter does
        packed = struct.pack(f"={total}i", *chain.from_iterable(c.block_table for c in chunks))
    else:  # each sequence's table packed once per new block (Sequence.packed_block_table)
        packed = b"".join(packed_tables)  # type: ignore[arg-type]
    flat = np.frombuffer(packed, dtype=np.int32)
    if total == n * width:
        return flat.reshape(n, width)
    tables = np.zeros((n, width), dtype=np.int32)
    tables[np.arange(width)[None, :] < table_lens[:, None]] = flat
    return tables


def _check_tables(
    chunks: list[SeqChunk], table_lens: np.ndarray, context_lens: np.ndarray, block_size: int
) -> None:
    short = np.flatnonzero(table_lens * block_size < context_lens)
    if short.size:
        chunk = chunks[int(short[0])]
        raise ValueError(
            f"sequence {chunk.seq_id}: block table of {len(chunk.block_table)} blocks "
            f"cannot hold {chunk.context_len} tokens at block size {block_size}"
        )


def _host_arrays(chunks: list[SeqChunk], block_size: int) -> _HostArrays:
    n = len(chunks)
    starts = np.fromiter([c.start_pos for c in chunks], dtype=np.int64, count=n)
    q_lens = np.fromiter([len(c.token_ids) for c in chunks], dtype=np.int64, count=n)
    table_lens = np.fromiter([len(c.block_table) for c in chunks], dtype=np.int64, count=n)
    sample = np.fromiter([c.sample for c in chunks], dtype=bool, count=n)
    context_lens = starts + q_lens
    _check_tables(chunks, table_lens, context_lens, block_size)
    cu_seqlens = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(q_lens, out=cu_seqlens[1:])
    num_tokens = int(cu_seqlens[-1])
    tables = _block_tables(chunks, table_lens)
    if num_tokens == n:  # decode only: one token per chunk
        input_ids = np.fromiter([c.token_ids[0] for c in chunks], dtype=np.int64, count=n)
        positions, rows = starts, np.arange(n)
    else:
        packed = struct.pack(f"{num_tokens}q", *chain.from_iterable(c.token_ids for c in chunks))
        input_ids = np.frombuffer(packed, dtype=np.int64)
        rows = np.repeat(np.arange(n), q_lens)
        positions = np.arange(num_tokens, dtype=np.int64) + np.repeat(starts - cu_seqlens[:-1], q_lens)
    slots = tables[rows, positions // block_size].astype(np.int64) * block_size + positions % block_size
    return _HostArrays(
        input_ids=input_ids,
        positions=positions,
        slots=slots,
        sample_indices=_sample_indices(chunks, cu_seqlens, sample),
        cu_seqlens=cu_seqlens.astype(np.int32),
        context_lens=context_lens.astype(np.int32),
        block_tables=tables,
        max_q_len=int(q_lens.max()) if n else 0,
    )


def _sample_indices(chunks: list[SeqChunk], cu_seqlens: np.ndarray, sample: np.ndarray) -> np.ndarray:
    """The last row of each sampled chunk; a speculative chunk's last num_spec + 1 rows."""
    ends = cu_seqlens[1:][sample]
    spec = [c.num_spec for c in chunks if c.sample]
    if not any(spec):
        return ends - 1
    counts = np.asarray(spec, dtype=np.int64) + 1
    starts = np.repeat(ends - counts, counts)
    within = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return starts + within


def _stage(host: _HostArrays, device: torch.device) -> ModelInputs:
    """One int64 buffer: the int64 arrays, then the int32 arrays packed two per element; one copy.
    Every array starts on a 16-byte boundary: Triton specialises a kernel on whether each pointer is
    16-byte aligned, so views at offsets that move with the batch would compile new variants mid-serving."""
    int64_parts = [host.input_ids, host.positions, host.slots, host.sample_indices]
    int32_parts = [host.cu_seqlens, host.context_lens, host.block_tables.reshape(-1)]
    num_decodes = _leading_decodes(host.cu_seqlens)
    mixed = 0 < num_decodes < host.context_lens.shape[0]
    prompts = 0
    if mixed:  # the sequences after the decodes, staged aligned of their own (MixedSplit)
        n = num_decodes
        rest_cu = (host.cu_seqlens[n:] - host.cu_seqlens[n]).astype(np.int32)
        int32_parts += [rest_cu, host.context_lens[n:], host.block_tables[n:].reshape(-1)]
        prompts = _trailing_prompts(host.cu_seqlens[n:], host.context_lens[n:])
    if prompts:  # and the prompts among them, after the chunks with cached tokens (PromptPart)
        first = host.context_lens.shape[0] - prompts
        prompt_cu = (host.cu_seqlens[first:] - host.cu_seqlens[first]).astype(np.int32)
        int32_parts += [prompt_cu, host.context_lens[first:], host.block_tables[first:].reshape(-1)]
    offsets64, n64 = _aligned_offsets([p.size for p in int64_parts], _ALIGN_BYTES // 8)
    offsets32, n32 = _aligned_offsets([p.size for p in int32_parts], _ALIGN_BYTES // 4)
    pin = device.type == "cuda"
    buffer = torch.empty(n64 + (n32 + 1) // 2, dtype=torch.int64, pin_memory=pin)
    view64 = buffer.numpy()
    view32 = view64[n64:].view(np.int32)
    _fill(view64, int64_parts, offsets64)
    _fill(view32, int32_parts, offsets32)
    if device.type != "cpu":
        buffer = buffer.to(device, non_blocking=pin)
    i64 = _split(buffer[:n64], int64_parts, offsets64)
    i32 = _split(buffer[n64:].view(torch.int32), int32_parts, offsets32)
    num_seqs, width = host.block_tables.shape
    meta = AttentionMetadata(
        slot_mapping=i64[2],
        cu_seqlens_q=i32[0],
        context_lens=i32[1],
        block_tables=i32[2].view(num_seqs, width),
        max_q_len=host.max_q_len,
        max_context_len=int(host.context_lens.max()) if num_seqs else 0,
        # context >= chunk for each sequence, so equal sums mean no sequence has cached tokens
        prefix_free=bool(num_seqs) and int(host.context_lens.sum()) == int(host.cu_seqlens[-1]),
    )
    if mixed:
        rest_ctx = host.context_lens[num_decodes:]
        part = None
        if prompts:
            first = num_seqs - prompts
            part = PromptPart(
                num_prefix_seqs=first - num_decodes,
                num_prefix_tokens=int(host.cu_seqlens[first] - host.cu_seqlens[num_decodes]),
                cu_seqlens_q=i32[6],
                context_lens=i32[7],
                block_tables=i32[8].view(prompts, width),
            )
        meta.mixed = MixedSplit(
            num_decode_seqs=num_decodes,
            cu_seqlens_q=i32[3],
            context_lens=i32[4],
            block_tables=i32[5].view(num_seqs - num_decodes, width),
            prefix_free=int(rest_ctx.sum()) == int(host.cu_seqlens[-1] - host.cu_seqlens[num_decodes]),
            prompts=part,
        )
    return ModelInputs(i64[0], i64[1], meta, i64[3])


def _trailing_prompts(cu_seqlens: np.ndarray, context_lens: np.ndarray) -> int:
    """How many sequences at the end have no cached tokens (context == chunk), when at least one sequence
    with cached tokens comes before them and none after; else 0. Also 0 when each of them is one token
    long: the attention would take such a group for decodes (which read the pages, not the step's rows)."""
    q_lens = np.diff(cu_seqlens)
    has_prefix = context_lens > q_lens
    if not has_prefix.any() or has_prefix.all():
        return 0
    prompts = int(has_prefix.size - 1 - int(np.flatnonzero(has_prefix)[-1]))
    return prompts if bool((q_lens[-prompts:] > 1).any()) else 0


def _leading_decodes(cu_seqlens: np.ndarray) -> int:
    """How many sequences at the start of the step have exactly one query token (the scheduler puts a
    step's decodes first)."""
    ones = np.diff(cu_seqlens) == 1
    return int(ones.size) if ones.all() else int(np.argmin(ones))


_ALIGN_BYTES = 16


def _aligned_offsets(sizes: list[int], align: int) -> tuple[list[int], int]:
    """Start of each part, each a multiple of `align` elements, and the total length (also a multiple)."""
    offsets, end = [], 0
    for size in sizes:
        offsets.append(end)
        end += -(-size // align) * align
    return offsets, end


def _fill(dest: np.ndarray, parts: list[np.ndarray], offsets: list[int]) -> None:
    for part, offset in zip(parts, offsets, strict=True):
        dest[offset : offset + part.size] = part.reshape(-1)


def _split(flat: torch.Tensor, parts: list[np.ndarray], offsets: list[int]) -> list[torch.Tensor]:
    return [flat[offset : offset + part.size] for part, offset in zip(parts, offsets, strict=True)]


def prompt_row_indices(batch: StepBatch, device: torch.device) -> torch.Tensor:
    """Flat token indices of batch.prompt_logprob_rows, in order (the rows the runner returns after the
    sampled ones)."""
    starts = np.zeros(len(batch.chunks) + 1, dtype=np.int64)
    np.cumsum([len(c.token_ids) for c in batch.chunks], out=starts[1:])
    parts = [
        np.arange(n, dtype=np.int64) + starts[chunk] + offset
        for chunk, offset, n in batch.prompt_logprob_rows
    ]
    flat = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    return torch.from_numpy(flat).to(device)
