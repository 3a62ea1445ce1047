"""Paged decode attention (one query token per sequence) in Triton: split-KV flash-decoding.

Each program owns one (sequence, KV head, context partition) and processes ALL query heads of that KV
head at once (GQA packing: the group's q rows form the M side of the tile matmuls), so every K/V byte is
read from memory exactly once. A tile is BLOCK_N consecutive context positions gathered through the block
table, i.e. BLOCK_N / block_size pages per tile (page size 16 is too small to be a tile on its own).

- Single pass (num_splits == 1): when num_seqs * num_kv_heads alone fills the GPU, every program walks its
  whole context and writes the normalised output directly.
- Split-KV (num_splits > 1): few sequences -> partition the context so that enough programs run; each writes
  a normalised partial output and its log-sum-exp (base 2), and a reduce kernel merges the partitions.
  The split count comes from the shapes; each sequence's partition size from its own context on the
  device (DecodePlan), so a graph captured for a wide block table spreads a short context over its splits.
- Pages ahead (DecodePlan.pages_ahead, batches that do not fill the GPU): each tile's block-table entries
  are loaded one tile ahead, so the K/V loads depend on no load of their own iteration and Triton
  double-buffers them from 3 stages (with the table lookup in the loop it takes 5).
- Programmatic dependent launch (DecodeConfig.pdl, sm_90+): the kernel may start while the one before it
  (qkv_prepare) drains; it waits for it before its first read and releases the next kernel (the reduce, or
  the o-projection) only after its tiles, so a waiting grid never holds SM slots through this one's work.
- Tile shapes: a plan may carry its own block_n / num_warps / num_stages (DecodeConfig.single_pass and
  dense_pass: 8-bit caches run fewer warps when the batch fills the GPU).

Grid shape depends only on tensor shapes (the context bound is block_tables.shape[1] * block_size), never on
device values, so the launch is CUDA-graph capturable and needs no host sync.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from .attention_tile_triton import attend_tile
from .decode_plan import (
    EIGHT_BIT_DECODE,
    DecodeConfig,
    DecodePlan,
    MmaPath,
    default_decode_config,
    partition_for,
    plan_decode,
    plan_mma,
)
from .decode_split_triton import _partition_for, reduce_splits, store_partial
from .kv_cache import QUANT_MAX
from .triton_utils import next_power_of_2, num_sms, pdl_launch, pdl_supported
from .triton_utils import scale_launch_args as _scale_args

__all__ = [  # the plan types are re-exported: callers plan and launch through this module
    "EIGHT_BIT_DECODE",
    "DecodeConfig",
    "DecodePlan",
    "MmaPath",
    "default_decode_config",
    "paged_decode_attention_triton",
    "partition_for",
    "plan_decode",
    "plan_mma",
]


@triton.jit
def _quantize_rows(q, qtype: tl.constexpr, QMAX: tl.constexpr):
    """q [BLOCK_H, BLOCK_D] -> (q8 in qtype, scales [BLOCK_H] fp32): symmetric absmax per row (query head),
    rounded to nearest (int8: half away from zero, like the KV store)."""
    qf = q.to(tl.float32)
    amax = tl.max(tl.abs(qf), 1)  # [BLOCK_H]
    scale = tl.where(amax > 0.0, amax / QMAX, 1.0)
    y = qf / scale[:, None]
    if qtype == tl.int8:
        y = tl.where(y >= 0.0, y + 0.5, y - 0.5)  # the cast truncates toward zero
    return y.to(qtype), scale


# the eager path's block-table width and plan change with the batch: no value specialisation on them
@triton.jit(do_not_specialize=["partition_size", "num_splits", "stride_bt"])
def _decode_kernel(
    q_ptr,  # [num_seqs, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,
    out_ptr,  # [num_seqs, num_heads, head_dim] (single pass)
    part_out_ptr,  # [num_seqs, num_heads, num_splits, head_dim] fp32 (split-KV)
    part_lse_ptr,  # [num_seqs, num_heads, num_splits] fp32 (split-KV)
    context_lens_ptr,  # [num_seqs] int32
    block_tables_ptr,  # [num_seqs, max_blocks] int32
    qk_scale,  # softmax scale * log2(e): scores are kept in base 2
    partition_size,
    num_splits,
    num_heads,
    stride_qs,
    stride_qh,
    stride_os,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    k_scale_ptr,  # [num_blocks, block_size, num_kv_heads] fp32 (read when SCALED)
    v_scale_ptr,
    stride_sb,
    stride_ss,
    stride_sh,
    GROUP: tl.constexpr,  # query heads per KV head
    BLOCK_H: tl.constexpr,  # GROUP padded to a power of two >= 16 (tl.dot needs M >= 16)
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,  # cache block size in tokens
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    SCALED: tl.constexpr,  # 8-bit cache: q stays in its dtype, scales dequantize the scores/weights
    QK_NATIVE: tl.constexpr = False,  # 8-bit QK dot (q quantized per row here)
    V_TILE: tl.constexpr = False,  # 8-bit V widened in its load layout (attention_tile_triton.py)
    WIDEN_ASM: tl.constexpr = True,  # False under the CPU interpreter
    QMAX: tl.constexpr = 448.0,  # largest magnitude of the cache's 8-bit type (QK_NATIVE)
    PAGES_AHEAD: tl.constexpr = False,  # DecodeConfig.pages_ahead
    PDL: tl.constexpr = False,  # programmatic dependent launch (triton_utils.pdl_supported)
):
    split = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = tl.program_id(2)
    if PDL:  # q and the pages come from the kernel before (launched early by PDL: wait for it)
        tl.extra.cuda.gdc_wait()
    ctx = tl.load(context_lens_ptr + seq)
    partition_size = _partition_for(ctx, partition_size, num_splits, BLOCK_N)
    start = split * partition_size
    if SPLIT:  # noqa: SIM102 (a constexpr branch around a runtime one)
        if start >= ctx:  # this partition lies past the sequence's end: the reduce ignores it
            return
    end = tl.minimum(start + partition_size, ctx)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    head_mask = offs_h < GROUP
    d_mask = offs_d < HEAD_DIM
    heads = kv_head * GROUP + offs_h
    q_ptrs = q_ptr + seq.to(tl.int64) * stride_qs + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptrs, mask=head_mask[:, None] & d_mask[None, :], other=0.0)  # [BLOCK_H, BLOCK_D]
    if not SCALED:  # a 16/32-bit cache: the dots run in its type
        q = q.to(k_cache_ptr.dtype.element_ty)
    elif q.dtype != tl.float32 and k_cache_ptr.dtype.element_ty != tl.int8:
        q = q.to(tl.float16)  # e4m3 pages, 16-bit activations: fp16 dots (attention_tile_triton.py)
    if QK_NATIVE:
        q8, q_scale = _quantize_rows(q, k_cache_ptr.dtype.element_ty, QMAX)
    else:
        q8, q_scale = q, tl.full([BLOCK_H], 1.0, tl.float32)  # unused

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    k_head_off = kv_head * stride_kh
    v_head_off = kv_head * stride_vh
    s_head_off = kv_head * stride_sh
    full_end = start + (end - start) // BLOCK_N * BLOCK_N  # tiles before this need no mask
    offs_n = tl.arange(0, BLOCK_N)
    # PAGES_AHEAD: [BLOCK_N] table entries of the next tile, loaded while the current one is processed
    if PAGES_AHEAD:
        pages = tl.load(bt_row + (start + offs_n) // PAGE, mask=start + offs_n < end, other=0)
    else:
        pages = offs_n  # unused: attend_tile looks its pages up
    for n0 in range(start, full_end, BLOCK_N):
        tile_pages = pages.to(tl.int64)
        if PAGES_AHEAD:
            nxt = n0 + BLOCK_N + offs_n
            pages = tl.load(bt_row + nxt // PAGE, mask=nxt < end, other=0)
        acc, l_i, m_i = attend_tile(
            acc,
            l_i,
            m_i,
            q,
            end,
            k_cache_ptr,
            v_cache_ptr,
            bt_row,
            n0,
            end,
            qk_scale,
            k_head_off,
            v_head_off,
            stride_kb,
            stride_ks,
            stride_vb,
            stride_vs,
            k_scale_ptr,
            v_scale_ptr,
            s_head_off,
            stride_sb,
            stride_ss,
            HEAD_DIM,
            BLOCK_D,
            PAGE,
            BLOCK_N,
            MASK=False,
            CAUSAL=False,
            SCALED=SCALED,
            q8=q8,
            q_scale=q_scale,
            QK_NATIVE=QK_NATIVE,
            V_TILE=V_TILE,
            WIDEN_ASM=WIDEN_ASM,
            tile_pages=tile_pages,
            PAGES_GIVEN=PAGES_AHEAD,
        )
    if full_end < end:  # the ragged last tile
        acc, l_i, m_i = attend_tile(
            acc,
            l_i,
            m_i,
            q,
            end,
            k_cache_ptr,
            v_cache_ptr,
            bt_row,
            full_end,
            end,
            qk_scale,
            k_head_off,
            v_head_off,
            stride_kb,
            stride_ks,
            stride_vb,
            stride_vs,
            k_scale_ptr,
            v_scale_ptr,
            s_head_off,
            stride_sb,
            stride_ss,
            HEAD_DIM,
            BLOCK_D,
            PAGE,
            BLOCK_N,
            MASK=True,
            CAUSAL=False,
            SCALED=SCALED,
            q8=q8,
            q_scale=q_scale,
            QK_NATIVE=QK_NATIVE,
            V_TILE=V_TILE,
            WIDEN_ASM=WIDEN_ASM,
            tile_pages=pages.to(tl.int64),
            PAGES_GIVEN=PAGES_AHEAD,
        )

    if PDL:  # the next kernel may launch and wait while this one finishes (not earlier: its waiting
        # programs would hold SM slots, and launch the one after them, all through this kernel's work)
        tl.extra.cuda.gdc_launch_dependents()
    out_mask = head_mask[:, None] & d_mask[None, :]
    if SPLIT:
        store_partial(acc, l_i, m_i, part_out_ptr, part_lse_ptr, seq, kv_head, split, num_splits, num_heads,
                      GROUP, BLOCK_H, HEAD_DIM, BLOCK_D)  # fmt: skip
    else:
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)  # context_len 0 (padding rows) -> zeros, not NaN
        o_ptrs = out_ptr + seq.to(tl.int64) * stride_os + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, (acc / l_safe[:, None]).to(out_ptr.dtype.element_ty), mask=out_mask)


def paged_decode_attention_triton(
    q: torch.Tensor,  # [num_seqs, num_heads, head_dim]: exactly one query token per sequence
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    context_lens: torch.Tensor,  # [num_seqs] int32, the new token included
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    scale: float,
    *,
    config: DecodeConfig | None = None,
    plan: DecodePlan | None = None,
    sms: int | None = None,
    k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] fp32: 8-bit caches
    v_scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,  # like q (a slice of a larger output is fine): written, returned
) -> torch.Tensor:  # [num_seqs, num_heads, head_dim]
    cfg = config or default_decode_config(k_cache.dtype)
    num_seqs, num_heads, head_dim = q.shape
    page, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    max_context = block_tables.shape[1] * page
    cache = (k_cache, v_cache, k_scale, v_scale)
    mma = _mma_path(cfg, q, cache)
    if plan is None:
        sms = sms or num_sms(q.device)
        plan = (
            plan_decode(num_seqs, num_kv_heads, max_context, sms, cfg)
            if mma is None
            else plan_mma(num_seqs, num_kv_heads, max_context, sms, mma)
        )
    out = torch.empty_like(q) if out is None else out
    if num_seqs == 0:
        return out
    split = plan.num_splits > 1
    if split:  # [num_seqs, num_heads, num_splits, head_dim] partials + [.., num_splits] log-sum-exp
        f32, dev = torch.float32, q.device
        part_out = torch.empty(num_seqs, num_heads, plan.num_splits, head_dim, device=dev, dtype=f32)
        part_lse = torch.empty(num_seqs, num_heads, plan.num_splits, device=dev, dtype=f32)
    else:
        part_out = part_lse = out  # unused by the single-pass specialisation
    pdl = cfg.pdl and pdl_supported(q.device)
    block_d = next_power_of_2(head_dim)
    scaled = k_scale is not None
    tile = plan.block_n or cfg.block_n  # the main kernels and the reduce size partitions with the same tile
    if mma is not None and (mma.split_plans or not split):
        from .kv8_decode_cuda import launch_plan  # CUDA-only (NVRTC); the Triton kernels stay the CPU path

        launch_plan(mma, plan, q, cache, out, (part_out, part_lse), context_lens, block_tables, scale, tile)
        if split:
            reduce_splits(plan, tile, part_out, part_lse, out, context_lens, pdl)
        return out
    # the shared kernel's pipelining choice, or the 8-bit kernel's path constants (it has no pages-ahead
    # mode); 8-bit caches take the kv8 kernel where the config selects it
    kernel, kernel_consts = _decode_kernel, {"PAGES_AHEAD": plan.pages_ahead}
    if scaled and cfg.kv8 is not None and (cfg.kv8.split_plans or not split):
        from .kv8_decode_triton import kv8_kernel  # it imports this module's device helpers

        kernel, kernel_consts = kv8_kernel(cfg.kv8, q, k_cache, block_d)
    kernel[(plan.num_splits, num_kv_heads, num_seqs)](
        q,
        k_cache,
        v_cache,
        out,
        part_out,
        part_lse,
        context_lens,
        block_tables,
        scale * math.log2(math.e),
        plan.partition_size,
        plan.num_splits,
        num_heads,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        v_cache.stride(0),
        v_cache.stride(1),
        v_cache.stride(2),
        block_tables.stride(0),
        *_scale_args(k_cache, k_scale, v_scale),
        GROUP=group,
        BLOCK_H=max(16, next_power_of_2(group)),
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        PAGE=page,
        BLOCK_N=tile,
        SPLIT=split,
        SCALED=scaled,
        # 8-bit tensor-core dots need K >= 32: below that head_dim the QK dot widens
        QK_NATIVE=scaled and cfg.qk_dot == "native" and block_d >= 32,
        V_TILE=scaled and cfg.v_widen == "tile",
        WIDEN_ASM=q.device.type == "cuda",
        QMAX=QUANT_MAX.get(k_cache.dtype, 448.0),
        **kernel_consts,
        PDL=pdl,
        num_warps=plan.num_warps or cfg.num_warps,
        num_stages=plan.num_stages or cfg.num_stages,
        **pdl_launch(pdl),
    )
    if split:
        reduce_splits(plan, tile, part_out, part_lse, out, context_lens, pdl)
    return out


def _mma_path(
    cfg: DecodeConfig, q: torch.Tensor, cache: tuple[torch.Tensor, torch.Tensor, Tensor | None, Tensor | None]
) -> MmaPath | None:
    """cfg.mma where kv8_decode.cu runs these tensors (an 8-bit cache on a CUDA device it supports, a batch
    of at least mma.min_programs (sequence, KV head) pairs)."""
    if cfg.mma is None or cache[2] is None or q.device.type != "cuda":
        return None
    if not cfg.mma.runs(q.shape[0], cache[0].shape[2]):
        return None
    from .kv8_decode_cuda import unsupported

    return cfg.mma if unsupported(q, *(t for t in cache if t is not None)) is None else None
