"""Split-KV decode: the partition each split takes (device side), the partials a split stores, and the
kernel that merges them into the output (decode_attention_triton.py and verify_attention_triton.py launch
their main kernels over these partitions; kv8_decode.cu writes the same partials)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .decode_plan import DecodePlan, reduce_block_s
from .triton_utils import next_power_of_2, pdl_launch

# PDL: release the next kernel (the o projection's GEMV, which loads its first weight tiles before it waits)
# at entry. H200, W3 tpot, two same-call pairs: int4 2.606 / 2.604 -> 2.558 / 2.557 ms, bf16 4.266 / 4.258
# -> 4.247 / 4.248. The next kernel launches only once every program of this one has started, so waiting
# programs never hold slots this grid still needs.
REDUCE_RELEASE_EARLY = True


@triton.jit
def _partition_for(ctx, min_partition, num_splits, tile):
    """Context positions per split for a sequence of ctx positions (DecodePlan): its context spread over
    all num_splits, in whole tiles (the main kernels' BLOCK_N; the reduce's runtime tile_n), and never
    fewer than min_partition."""
    return tl.maximum(min_partition, tl.cdiv(tl.cdiv(ctx, num_splits), tile) * tile)


@triton.jit
def store_partial(
    acc, l_i, m_i, part_out_ptr, part_lse_ptr, seq, kv_head, split, num_splits, num_heads,
    GROUP: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """acc [BLOCK_H, BLOCK_D], l_i, m_i [BLOCK_H] of partition `split`: its partial rows [seq, head, split, :]
    for the reduce kernel, normalised by the partition's own sum, and their log-sum-exp (base 2)."""
    offs_h, offs_d = tl.arange(0, BLOCK_H), tl.arange(0, BLOCK_D)
    h_mask = offs_h < GROUP
    row = (seq.to(tl.int64) * num_heads + kv_head * GROUP + offs_h) * num_splits + split  # [BLOCK_H]
    mask = h_mask[:, None] & (offs_d < HEAD_DIM)[None, :]
    tl.store(part_out_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], acc / l_i[:, None], mask=mask)
    tl.store(part_lse_ptr + row, m_i + tl.log2(l_i), mask=h_mask)


@triton.jit(do_not_specialize=["partition_size", "num_splits", "tile_n"])
def _decode_reduce_kernel(
    part_out_ptr,  # [num_seqs * Q, num_heads, num_splits, head_dim] fp32
    part_lse_ptr,  # [num_seqs * Q, num_heads, num_splits] fp32
    out_ptr,  # [num_seqs * Q, num_heads, head_dim]
    context_lens_ptr,  # [num_seqs] int32
    partition_size,
    num_splits,
    tile_n,  # the main kernel's tile (partitions are multiples of it); not a constexpr: one build for all
    num_heads,
    stride_ot,
    stride_oh,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,  # splits merged per pass (reduce_block_s: 16, or 64 in as many passes as needed)
    Q: tl.constexpr = 1,  # query tokens per sequence (k + 1 in a speculative verification)
    PDL: tl.constexpr = False,  # programmatic dependent launch (triton_utils.pdl_supported)
    RELEASE_EARLY: tl.constexpr = False,  # PDL: release the next kernel at entry (REDUCE_RELEASE_EARLY)
):
    """Merges a query row's split-KV partials. Row `token` is query token % Q of sequence token // Q; it
    sees the context up to its own position, so only the partitions holding those positions are merged.
    Up to BLOCK_S partials take one pass (its sums equal a single softmax's); more are merged BLOCK_S at a
    time with the running maximum rescaling the sums so far."""
    head = tl.program_id(0)
    token = tl.program_id(1)
    if PDL and RELEASE_EARLY:
        tl.extra.cuda.gdc_launch_dependents()
    if PDL:  # as _decode_kernel's: wait first, release the next kernel when the work is done
        tl.extra.cuda.gdc_wait()
    ctx = tl.load(context_lens_ptr + token // Q)
    visible = ctx - Q + token % Q + 1  # positions this row sees (decode: the whole context)
    # the partitions that hold at least one of them (sized from ctx, as the main kernel's)
    used = tl.cdiv(visible, _partition_for(ctx, partition_size, num_splits, tile_n))
    offs_d = tl.arange(0, BLOCK_D)
    row0 = (token.to(tl.int64) * num_heads + head) * num_splits
    m_run = tl.full((), float("-inf"), tl.float32)
    total = tl.zeros((), tl.float32)
    acc = tl.zeros((BLOCK_D,), tl.float32)
    for s0 in range(0, used, BLOCK_S):
        offs_s = s0 + tl.arange(0, BLOCK_S)
        s_mask = offs_s < used
        lse = tl.load(part_lse_ptr + row0 + offs_s, mask=s_mask, other=float("-inf"))  # [BLOCK_S]
        m_new = tl.maximum(m_run, tl.max(lse, 0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        w = tl.exp2(lse - m_safe)  # [BLOCK_S], 0 for partitions not merged
        parts = tl.load(
            part_out_ptr + (row0 + offs_s[:, None]) * HEAD_DIM + offs_d[None, :],
            mask=s_mask[:, None] & (offs_d[None, :] < HEAD_DIM),
            other=0.0,
        )  # [BLOCK_S, BLOCK_D]
        rescale = tl.exp2(m_run - m_safe)  # 0 on the first pass (m_run = -inf): its sums are as they come
        total = total * rescale + tl.sum(w, 0)
        acc = acc * rescale + tl.sum(parts * w[:, None], 0)
        m_run = m_new
    o = acc / tl.where(total > 0.0, total, 1.0)  # [BLOCK_D]
    if PDL and not RELEASE_EARLY:
        tl.extra.cuda.gdc_launch_dependents()
    o_ptrs = out_ptr + token.to(tl.int64) * stride_ot + head * stride_oh + offs_d
    tl.store(o_ptrs, o.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)


def reduce_splits(
    plan: DecodePlan,
    block_n: int,  # the tile the main kernel rounded partitions to
    part_out: torch.Tensor,  # [num_seqs, num_heads, num_splits, head_dim] fp32
    part_lse: torch.Tensor,  # [num_seqs, num_heads, num_splits] fp32
    out: torch.Tensor,  # [num_seqs, num_heads, head_dim]
    context_lens: torch.Tensor,
    pdl: bool,
) -> None:
    """Merge a decode plan's split partials into out (one program per query head and sequence)."""
    num_seqs, num_heads, head_dim = out.shape
    block_d = next_power_of_2(head_dim)
    _decode_reduce_kernel[(num_heads, num_seqs)](
        part_out,
        part_lse,
        out,
        context_lens,
        plan.partition_size,
        plan.num_splits,
        block_n,
        num_heads,
        out.stride(0),
        out.stride(1),
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_S=reduce_block_s(plan.num_splits),
        PDL=pdl,
        RELEASE_EARLY=REDUCE_RELEASE_EARLY,
        num_warps=4 if block_d * reduce_block_s(plan.num_splits) >= 2048 else 2,
        **pdl_launch(pdl),
    )
