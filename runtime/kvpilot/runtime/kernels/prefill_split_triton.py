"""Split-KV over a short chunk's cached prefix, for the prefill kernel (prefill_attention_triton.py).

Why: a chunk of a few tokens after a long cached prefix (the tail of a prompt that the step's decodes
pushed out of the previous step) has 1-4 query tiles per KV head, and each of those programs streams the
whole prefix alone: on the H200 a W2L mixed step spent ~0.24 ms per layer more on it with an int8 cache
than with bf16 (BENCHMARKS.md, fifth session). Here such a chunk's prefix [0, prefix) is cut into
partitions that programs along grid axis 2 attend in parallel; partition 0 also attends the chunk's own
tokens. Each program stores its unnormalised partial (acc [BLOCK_M, BLOCK_D], running max m and sum l per
row, base 2) to a workspace, then counts itself in; the last of a tile's programs merges the partials in
partition order (the same result on every call) and writes the output rows. The host side (how many
partitions a launch may use, the workspace) is prefill_plan.prefix_splits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .prefill_plan import PrefillConfig, split_slots


@triton.jit
def split_plan(q_len, prefix, prefix_splits, split_partition, SPLIT_Q: tl.constexpr, BLOCK_N: tl.constexpr):
    """(partitions, positions per partition) of one chunk: more than one only for a chunk of at most
    SPLIT_Q tokens whose prefix holds at least two partitions of split_partition positions; each
    partition a whole number of tiles, the last one ragged. One partition covers the whole prefix."""
    n = tl.minimum(prefix_splits, prefix // split_partition)
    n = tl.where((q_len <= SPLIT_Q) & (n >= 2), n, 1)
    part = tl.where(n > 1, tl.cdiv(tl.cdiv(prefix, n), BLOCK_N) * BLOCK_N, prefix)
    n = tl.where(n > 1, tl.cdiv(prefix, tl.maximum(part, 1)), 1)  # part is 0 for a prefix-free chunk
    return n, part


@triton.jit
def store_partial_or_merge(
    acc, l_i, m_i, ws_acc_ptr, ws_ml_ptr, counter_ptr, slot, split, n_split, prefix_splits, out_ptrs,
    io_mask, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """acc [BLOCK_M, BLOCK_D], l_i, m_i [BLOCK_M]: this program's partial of workspace slot `slot` (one
    query tile of one KV head). Workspace: acc [slots, prefix_splits, BLOCK_M, BLOCK_D], (m, l) [slots,
    prefix_splits, 2, BLOCK_M], float32; counter_ptr: int32 [slots], zero before the launch and after."""
    offs_m = tl.arange(0, BLOCK_M)
    tile = offs_m[:, None] * BLOCK_D + tl.arange(0, BLOCK_D)[None, :]  # [BLOCK_M, BLOCK_D]
    base = slot.to(tl.int64) * prefix_splits
    tl.store(ws_acc_ptr + (base + split) * (BLOCK_M * BLOCK_D) + tile, acc)
    tl.store(ws_ml_ptr + (base + split) * (2 * BLOCK_M) + offs_m, m_i)
    tl.store(ws_ml_ptr + (base + split) * (2 * BLOCK_M) + BLOCK_M + offs_m, l_i)
    tl.debug_barrier()  # every thread's partial is written before the count is released
    arrived = tl.atomic_add(counter_ptr + slot, 1, sem="acq_rel")
    if arrived == n_split - 1:  # the last of the tile's programs: the others' partials are visible
        m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
        o = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        for j in range(n_split):  # every partial is finite on every row: each saw >= 1 visible position
            ml = ws_ml_ptr + (base + j) * (2 * BLOCK_M) + offs_m
            m_j = tl.load(ml, cache_modifier=".cg")
            l_j = tl.load(ml + BLOCK_M, cache_modifier=".cg")
            a_j = tl.load(ws_acc_ptr + (base + j) * (BLOCK_M * BLOCK_D) + tile, cache_modifier=".cg")
            m_new = tl.maximum(m, m_j)
            alpha, beta = tl.exp2(m - m_new), tl.exp2(m_j - m_new)
            o = o * alpha[:, None] + a_j * beta[:, None]
            l_sum = l_sum * alpha + l_j * beta
            m = m_new
        l_safe = tl.where(l_sum > 0.0, l_sum, 1.0)
        tl.store(out_ptrs, (o / l_safe[:, None]).to(out_ptrs.dtype.element_ty), mask=io_mask)
        tl.atomic_xchg(counter_ptr + slot, 0, sem="relaxed")  # the next launch is stream-ordered


def split_workspace(
    cfg: PrefillConfig,
    splits: int,
    num_seqs: int,
    heads_axis: int,
    block_m: int,
    block_q: int,
    block_d: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(partial acc, partial m/l, zeroed counters) of a launch that splits prefixes; 1-element stand-ins
    when it does not (never read then)."""
    if splits == 1:
        empty = torch.empty(1, device=device, dtype=torch.float32)
        return empty, empty, torch.empty(1, device=device, dtype=torch.int32)
    slots = split_slots(cfg, num_seqs, heads_axis, block_q)
    acc = torch.empty(slots * splits * block_m * block_d, device=device, dtype=torch.float32)
    ml = torch.empty(slots * splits * 2 * block_m, device=device, dtype=torch.float32)
    return acc, ml, torch.zeros(slots, device=device, dtype=torch.int32)
