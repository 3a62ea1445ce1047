"""Paged attention for verification steps in Triton: every sequence has the same small number Q of query
tokens (speculative decoding verifies k drafts + 1 in one step: Q = k + 1), with split-KV.

The reference is paged_attention_ref (kernels/attention.py) with q_len = Q for every sequence: query row i
of sequence s sits at position context_lens[s] - Q + i and sees positions 0..that position.

Why not the prefill kernel: it gives each (sequence, KV head) one program that walks the whole context, so
at batch 1 only num_kv_heads programs run; the decode kernel's split-KV partitions fill the GPU instead.
This kernel is the decode kernel's scheme (plan_decode, decode_attention_triton.py) with the Q query tokens
of a sequence as extra rows: a program owns one (sequence, KV head, context partition) and its tile rows are
the Q tokens x GROUP query heads of that KV head (row r = token r // GROUP_PAD, head r % GROUP_PAD), so each
K/V tile is read once for all of them. Each row keeps its own causal limit.

A row whose causal limit lies before its partition's first position sees nothing there: its query position
is clamped to the partition start (so the online softmax never meets an all-masked first tile) and the
reduce ignores that partition for that row, as it only merges partitions j with j * partition_size <= the
row's position. Grid and loops depend on tensor shapes and device values only: CUDA-graph capturable.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .attention_tile_triton import attend_tile
from .decode_attention_triton import DecodeConfig, DecodePlan, plan_decode
from .decode_plan import reduce_block_s
from .decode_split_triton import _decode_reduce_kernel, _partition_for
from .triton_utils import next_power_of_2, num_sms
from .triton_utils import scale_launch_args as _scale_args

# 8-bit pages: the decode kernel's 128-position tiles; with 5 x 4 query rows (32 after padding) that needs
# 8 warps to stay clear of spills (sm_90 compile: 4 warps spill 80 B for e4m3; 8 warps, 195 registers)
EIGHT_BIT_VERIFY = DecodeConfig(block_n=128, num_warps=8, min_partition=128, pages_ahead=False)
VERIFY = DecodeConfig(pages_ahead=False, min_partition=128)


def default_verify_config(cache_dtype: torch.dtype) -> DecodeConfig:
    """Launch defaults for a cache of this dtype: the decode kernel's, with more warps for 8-bit pages."""
    # pages_ahead plans are the decode kernel's only (this kernel looks its pages up per tile); partitions
    # of >= 128 positions, as it was measured (the decode kernel's 64 was not measured here)
    return EIGHT_BIT_VERIFY if cache_dtype.itemsize == 1 else VERIFY


@triton.jit
def _verify_kernel(
    q_ptr,  # [num_seqs * Q, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,
    out_ptr,  # [num_seqs * Q, num_heads, head_dim] (single pass)
    part_out_ptr,  # [num_seqs * Q, num_heads, num_splits, head_dim] fp32 (split-KV)
    part_lse_ptr,  # [num_seqs * Q, num_heads, num_splits] fp32 (split-KV)
    context_lens_ptr,  # [num_seqs] int32, the Q new tokens included
    block_tables_ptr,  # [num_seqs, max_blocks] int32
    qk_scale,  # softmax scale * log2(e)
    partition_size,
    num_splits,
    num_heads,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    k_scale_ptr,
    v_scale_ptr,
    stride_sb,
    stride_ss,
    stride_sh,
    Q: tl.constexpr,  # query tokens per sequence
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr,  # Q * GROUP_PAD rounded up to a power of two >= 16
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    SCALED: tl.constexpr,
):
    split = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.program_id(2)
    ctx = tl.load(context_lens_ptr + seq)
    partition_size = _partition_for(ctx, partition_size, num_splits, BLOCK_N)
    start = split * partition_size
    if SPLIT:  # noqa: SIM102 (a constexpr branch around a runtime one)
        if start >= ctx:  # past the sequence's end: the reduce ignores this partition
            return
    end = tl.minimum(start + partition_size, ctx)

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    tok = offs_m // GROUP_PAD  # [BLOCK_M] query token of each row
    g = offs_m % GROUP_PAD
    row_mask = (tok < Q) & (g < GROUP)
    heads = kv_head * GROUP + g
    q_pos = tl.maximum(ctx - Q + tok, start)  # [BLOCK_M] causal limit, clamped to the partition (see above)
    row_off = (seq * Q + tok).to(tl.int64)
    io_mask = row_mask[:, None] & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(
        q_ptr + row_off[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=io_mask,
        other=0.0,
    )  # [BLOCK_M, BLOCK_D]
    if not SCALED:
        q = q.to(k_cache_ptr.dtype.element_ty)
    elif q.dtype != tl.float32 and k_cache_ptr.dtype.element_ty != tl.int8:
        q = q.to(tl.float16)  # e4m3 pages, 16-bit activations: fp16 dots (attention_tile_triton.py)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    k_head_off = kv_head * stride_kh
    v_head_off = kv_head * stride_vh
    s_head_off = kv_head * stride_sh
    # positions below ctx - Q + 1 are visible to every row: whole tiles of them need no mask
    shared_end = tl.minimum(end, tl.maximum(ctx - Q + 1, start))
    full_end = start + (shared_end - start) // BLOCK_N * BLOCK_N
    for n0 in range(start, full_end, BLOCK_N):
        acc, l_i, m_i = attend_tile(
            acc, l_i, m_i, q, q_pos, k_cache_ptr, v_cache_ptr, bt_row, n0, end, qk_scale,
            k_head_off, v_head_off, stride_kb, stride_ks, stride_vb, stride_vs,
            k_scale_ptr, v_scale_ptr, s_head_off, stride_sb, stride_ss,
            HEAD_DIM, BLOCK_D, PAGE, BLOCK_N, MASK=False, CAUSAL=False, SCALED=SCALED,
        )  # fmt: skip
    for n0 in range(full_end, end, BLOCK_N):  # the diagonal and the ragged end
        acc, l_i, m_i = attend_tile(
            acc, l_i, m_i, q, q_pos, k_cache_ptr, v_cache_ptr, bt_row, n0, end, qk_scale,
            k_head_off, v_head_off, stride_kb, stride_ks, stride_vb, stride_vs,
            k_scale_ptr, v_scale_ptr, s_head_off, stride_sb, stride_ss,
            HEAD_DIM, BLOCK_D, PAGE, BLOCK_N, MASK=True, CAUSAL=True, SCALED=SCALED,
        )  # fmt: skip

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    if SPLIT:  # partial rows [token, head, split, :], normalised by this partition's own sum
        part = (row_off * num_heads + heads) * num_splits + split  # [BLOCK_M]
        tl.store(
            part_out_ptr + part[:, None] * HEAD_DIM + offs_d[None, :], acc / l_safe[:, None], mask=io_mask
        )
        tl.store(part_lse_ptr + part, m_i + tl.log2(l_safe), mask=row_mask)
    else:
        o_ptrs = out_ptr + row_off[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, (acc / l_safe[:, None]).to(out_ptr.dtype.element_ty), mask=io_mask)


def paged_verify_attention_triton(
    q: torch.Tensor,  # [num_seqs * Q, num_heads, head_dim]: Q query tokens per sequence, in order
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    context_lens: torch.Tensor,  # [num_seqs] int32, the Q new tokens included (each >= Q)
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    scale: float,
    *,
    config: DecodeConfig | None = None,
    plan: DecodePlan | None = None,
    sms: int | None = None,
    k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] fp32: 8-bit caches
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:  # [num_seqs * Q, num_heads, head_dim]
    cfg = config or default_verify_config(k_cache.dtype)
    num_tokens, num_heads, head_dim = q.shape
    num_seqs = context_lens.shape[0]
    if num_seqs == 0 or num_tokens % num_seqs:
        raise ValueError(f"{num_tokens} query tokens do not split evenly over {num_seqs} sequences")
    query_len = num_tokens // num_seqs
    page, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    if plan is None:
        max_context = block_tables.shape[1] * page
        plan = plan_decode(num_seqs, num_kv_heads, max_context, sms or num_sms(q.device), cfg)
    out = torch.empty_like(q)
    split = plan.num_splits > 1
    if split:
        part_out = torch.empty(
            num_tokens, num_heads, plan.num_splits, head_dim, device=q.device, dtype=torch.float32
        )
        part_lse = torch.empty(num_tokens, num_heads, plan.num_splits, device=q.device, dtype=torch.float32)
    else:
        part_out = part_lse = out  # unused by the single-pass specialisation
    group_pad = next_power_of_2(group)
    block_d = next_power_of_2(head_dim)
    _verify_kernel[(plan.num_splits, num_kv_heads, num_seqs)](
        q, k_cache, v_cache, out, part_out, part_lse, context_lens, block_tables,
        scale * math.log2(math.e), plan.partition_size, plan.num_splits, num_heads,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        block_tables.stride(0),
        *_scale_args(k_cache, k_scale, v_scale),
        Q=query_len,
        GROUP=group,
        GROUP_PAD=group_pad,
        BLOCK_M=max(16, next_power_of_2(query_len * group_pad)),
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        PAGE=page,
        BLOCK_N=cfg.block_n,
        SPLIT=split,
        SCALED=k_scale is not None,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )  # fmt: skip
    if split:
        _decode_reduce_kernel[(num_heads, num_tokens)](
            part_out, part_lse, out, context_lens, plan.partition_size, plan.num_splits, cfg.block_n,
            num_heads, out.stride(0), out.stride(1),
            Q=query_len,
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            BLOCK_S=reduce_block_s(plan.num_splits),
            num_warps=4 if block_d * reduce_block_s(plan.num_splits) >= 2048 else 2,
        )  # fmt: skip
    return out
