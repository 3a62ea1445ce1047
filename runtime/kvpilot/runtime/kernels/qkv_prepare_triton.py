"""Triton version of qkv_prepare_ref: the whole attention prologue in one launch.

One program per (token, kv head) reads its slice of the fused qkv row: the GROUP = H / KVH query heads
that share kv head g, k head g and v head g. In fp32 it RMS-normalises each q/k head (Qwen3; a constexpr
switch for the other families), rounds the normed head to the activation dtype as the reference's norm
does, then rotates it (NeoX rotate-half: (x1*cos - x2*sin, x2*cos + x1*sin)) and rounds once more. q goes
to a dense [num_tokens, H, D] output; rotated k and raw v go to cache slot `slot_mapping[token]`
(block = slot // block_size, offset = slot % block_size), unless the slot is -1. An 8-bit cache (fp8 e4m3,
int8) gets each k and v head quantized on write with its own absmax scale, stored beside it (kv_cache.py
says why that scheme).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .kv_cache import QUANT_MAX, check_scales
from .qkv_prepare import check_qk_norm, qkv_heads
from .triton_utils import (
    next_power_of_2,
    pdl_launch,
    pdl_supported,
    require_last_dim_contiguous,
    require_same_device,
)


@triton.jit
def _norm_rotate(
    x1,
    x2,
    w_ptr,
    cos,
    sin,
    eps,
    offs_d,
    d_mask,
    round_ty: tl.constexpr,
    HALF: tl.constexpr,
    HAS_NORM: tl.constexpr,
):
    """x1, x2: [rows, BLOCK_HALF] fp32 halves of `rows` heads; cos, sin: [BLOCK_HALF]. Returns the halves
    normed (when HAS_NORM, rounded to round_ty like the reference) and rotated, in fp32."""
    if HAS_NORM:
        inv_rms = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / (2 * HALF) + eps)[:, None]
        w1 = tl.load(w_ptr + offs_d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + HALF + offs_d, mask=d_mask, other=0.0).to(tl.float32)[None, :]
        x1 = (x1 * inv_rms * w1).to(round_ty).to(tl.float32)
        x2 = (x2 * inv_rms * w2).to(round_ty).to(tl.float32)
    return x1 * cos[None, :] - x2 * sin[None, :], x2 * cos[None, :] + x1 * sin[None, :]


@triton.jit
def _round_to_e4m3(y):
    """fp32 y rounded to e4m3's 3 mantissa bits (nearest, ties to even), still fp32, so the cast to fp8
    that follows is exact. The cast alone rounds the same way on a GPU; Triton's CPU interpreter drops the
    carry when the mantissa rounds up into the next power of two (127.9 -> 64), so the store rounds first
    (four integer ops per element; it also pins the result to torch's rounding everywhere)."""
    bits = y.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000  # drop 20 of fp32's 23 mantissa bits
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _quantize_store(dst, scale_dst, x1, x2, mask, HALF: tl.constexpr, QMAX: tl.constexpr, INT8: tl.constexpr):
    """One head's halves x1, x2 [1, BLOCK_HALF] fp32 -> 8-bit values at dst (and dst + HALF), symmetric
    absmax scale at scale_dst. Masked lanes hold 0, so they do not move the max."""
    absmax = tl.maximum(tl.max(tl.abs(x1)), tl.max(tl.abs(x2)))
    inv = tl.where(absmax > 0.0, QMAX / absmax, 0.0)
    y1 = tl.minimum(tl.maximum(x1 * inv, -QMAX), QMAX)
    y2 = tl.minimum(tl.maximum(x2 * inv, -QMAX), QMAX)
    if INT8:  # round half away from zero (the conversion truncates), as round_half_away() does
        y1 = tl.where(y1 >= 0.0, y1 + 0.5, y1 - 0.5)
        y2 = tl.where(y2 >= 0.0, y2 + 0.5, y2 - 0.5)
    else:
        y1 = _round_to_e4m3(y1)
        y2 = _round_to_e4m3(y2)
    tl.store(dst, y1.to(dst.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, y2.to(dst.dtype.element_ty), mask=mask)
    tl.store(scale_dst, absmax / QMAX)


@triton.jit
def _qkv_prepare_kernel(
    qkv_ptr,  # [num_tokens, (NUM_HEADS + 2 * NUM_KV_HEADS) * HEAD_DIM]
    positions_ptr,  # [num_tokens] int64
    cos_sin_ptr,  # [max_positions, HEAD_DIM]
    q_norm_ptr,  # [HEAD_DIM] (read when HAS_NORM)
    k_norm_ptr,  # [HEAD_DIM] (read when HAS_NORM)
    q_out_ptr,  # [num_tokens, NUM_HEADS, HEAD_DIM], dense
    k_cache_ptr,  # [num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM]
    v_cache_ptr,  # like k_cache, same strides
    slot_mapping_ptr,  # [num_tokens] int64
    k_scale_ptr,  # [num_blocks, BLOCK_SIZE, NUM_KV_HEADS] fp32 (written when SCALED)
    v_scale_ptr,  # like k_scale, same strides
    stride_sb,  # scale strides: block, offset in block (the kv head is dense)
    stride_ss,
    stride_qkv,
    stride_cos_sin,
    stride_cb,  # cache strides: block, offset in block, kv head
    stride_cs,
    stride_ch,
    eps,
    NUM_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,  # tokens per cache block (page)
    BLOCK_G: tl.constexpr,  # next power of 2 of GROUP
    BLOCK_HALF: tl.constexpr,  # next power of 2 of HEAD_DIM // 2
    HAS_NORM: tl.constexpr,
    SCALED: tl.constexpr,  # 8-bit cache: quantize per (token, head), scales beside the values
    QMAX: tl.constexpr,  # largest stored magnitude (448 e4m3, 127 int8)
    INT8: tl.constexpr,
    K_TO_QKV: tl.constexpr = False,  # also write the normed, rotated k back over qkv's k columns
    PDL: tl.constexpr = False,  # programmatic dependent launch (triton_utils.pdl_supported)
):
    HALF: tl.constexpr = HEAD_DIM // 2
    GROUP: tl.constexpr = NUM_HEADS // NUM_KV_HEADS
    token = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1)
    round_ty: tl.constexpr = qkv_ptr.dtype.element_ty
    offs_d = tl.arange(0, BLOCK_HALF)
    d_mask = offs_d < HALF
    pos = tl.load(positions_ptr + token).to(tl.int64)
    cos = tl.load(cos_sin_ptr + pos * stride_cos_sin + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    sin = tl.load(cos_sin_ptr + pos * stride_cos_sin + HALF + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    if PDL:  # positions and the rotary table are the step's inputs; qkv and the cache wait for the GEMV
        tl.extra.cuda.gdc_wait()
    row = qkv_ptr + token * stride_qkv

    # q: the GROUP heads of this kv head, [BLOCK_G, BLOCK_HALF] per half
    heads = kv_head * GROUP + tl.arange(0, BLOCK_G)
    q_mask = (tl.arange(0, BLOCK_G) < GROUP)[:, None] & d_mask[None, :]
    q_cols = heads[:, None] * HEAD_DIM + offs_d[None, :]
    q1 = tl.load(row + q_cols, mask=q_mask, other=0.0).to(tl.float32)
    q2 = tl.load(row + q_cols + HALF, mask=q_mask, other=0.0).to(tl.float32)
    q1, q2 = _norm_rotate(q1, q2, q_norm_ptr, cos, sin, eps, offs_d, d_mask, round_ty, HALF, HAS_NORM)
    q_dst = q_out_ptr + token * (NUM_HEADS * HEAD_DIM) + q_cols
    tl.store(q_dst, q1.to(q_out_ptr.dtype.element_ty), mask=q_mask)
    tl.store(q_dst + HALF, q2.to(q_out_ptr.dtype.element_ty), mask=q_mask)
    if PDL:  # the attention may launch (it waits for this kernel's end before reading anything)
        tl.extra.cuda.gdc_launch_dependents()

    # k and v of this kv head, into the cache slot (skipped for slot -1)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot >= 0:
        kv_mask = d_mask[None, :]
        k_cols = (NUM_HEADS + kv_head) * HEAD_DIM + offs_d[None, :]  # [1, BLOCK_HALF]
        k1 = tl.load(row + k_cols, mask=kv_mask, other=0.0).to(tl.float32)
        k2 = tl.load(row + k_cols + HALF, mask=kv_mask, other=0.0).to(tl.float32)
        k1, k2 = _norm_rotate(k1, k2, k_norm_ptr, cos, sin, eps, offs_d, d_mask, round_ty, HALF, HAS_NORM)
        if K_TO_QKV:  # the step's k rows, token-aligned with q (step_kv of the prefill attention)
            tl.store(row + k_cols, k1.to(round_ty), mask=kv_mask)  # each by the thread that loaded it
            tl.store(row + k_cols + HALF, k2.to(round_ty), mask=kv_mask)
        dst = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_cs + kv_head * stride_ch
        k_dst = k_cache_ptr + dst + offs_d[None, :]
        v_cols = k_cols + NUM_KV_HEADS * HEAD_DIM
        v_dst = v_cache_ptr + dst + offs_d[None, :]
        if SCALED:
            s_dst = (slot // BLOCK_SIZE) * stride_sb + (slot % BLOCK_SIZE) * stride_ss + kv_head
            k1 = k1.to(round_ty).to(tl.float32)  # k as the reference holds it, in the activation dtype
            k2 = k2.to(round_ty).to(tl.float32)
            _quantize_store(k_dst, k_scale_ptr + s_dst, k1, k2, kv_mask, HALF, QMAX, INT8)
            v1 = tl.load(row + v_cols, mask=kv_mask, other=0.0).to(tl.float32)
            v2 = tl.load(row + v_cols + HALF, mask=kv_mask, other=0.0).to(tl.float32)
            _quantize_store(v_dst, v_scale_ptr + s_dst, v1, v2, kv_mask, HALF, QMAX, INT8)
        else:
            tl.store(k_dst, k1.to(round_ty).to(k_cache_ptr.dtype.element_ty), mask=kv_mask)
            tl.store(k_dst + HALF, k2.to(round_ty).to(k_cache_ptr.dtype.element_ty), mask=kv_mask)
            v_ty = v_cache_ptr.dtype.element_ty
            tl.store(v_dst, tl.load(row + v_cols, mask=kv_mask).to(v_ty), mask=kv_mask)
            tl.store(v_dst + HALF, tl.load(row + v_cols + HALF, mask=kv_mask).to(v_ty), mask=kv_mask)


def _check_inputs(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    head_dim: int,
) -> None:
    num_tokens = qkv.shape[0]
    if head_dim % 2 or cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != head_dim:
        raise ValueError(
            f"cos_sin_cache must be [max_positions, {head_dim}] (even), got {tuple(cos_sin_cache.shape)}"
        )
    if k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride():
        raise ValueError(
            f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} must match "
            "in shape and strides"
        )
    for name, t in (("positions", positions), ("slot_mapping", slot_mapping)):
        if t.shape != (num_tokens,):
            raise ValueError(f"{name} must be [{num_tokens}], got {tuple(t.shape)}")
    for name, t in (("qkv", qkv), ("cos_sin_cache", cos_sin_cache), ("k_cache", k_cache)):
        require_last_dim_contiguous(name, t)
    require_same_device(
        qkv=qkv,
        positions=positions,
        cos_sin_cache=cos_sin_cache,
        k_cache=k_cache,
        v_cache=v_cache,
        slot_mapping=slot_mapping,
    )


def qkv_prepare_triton(
    qkv: torch.Tensor,  # [num_tokens, (num_heads + 2 * num_kv_heads) * head_dim]: q | k | v columns
    positions: torch.Tensor,  # [num_tokens] int64
    cos_sin_cache: torch.Tensor,  # [max_positions, head_dim]: cos in the first half, sin in the second
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,  # like k_cache
    slot_mapping: torch.Tensor,  # [num_tokens] int64; -1 = do not store
    q_norm_weight: torch.Tensor | None = None,  # [head_dim]; with k_norm_weight, Qwen3's q/k norm
    k_norm_weight: torch.Tensor | None = None,  # [head_dim]
    eps: float = 1e-6,
    *,
    k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] fp32: 8-bit caches
    v_scale: torch.Tensor | None = None,
    k_to_qkv: bool = False,
    num_warps: int = 1,  # benchmarks/bench_qkv_prepare.py
    pdl: bool = True,  # programmatic dependent launch where the GPU has it (triton_utils.pdl_supported)
) -> torch.Tensor:
    """Returns q [num_tokens, num_heads, head_dim] (normed, rotated); writes k (normed, rotated) and v
    (quantized per token and head, their scales beside them, when the cache is 8-bit). k_to_qkv: also
    overwrites qkv's k columns with the rotated k (in the activation dtype) of every stored token, so
    qkv's k and v columns hold the step's K/V rows as the cache gets them (PagedAttention)."""
    num_heads, num_kv_heads, head_dim = qkv_heads(qkv, k_cache)
    has_norm = check_qk_norm(q_norm_weight, k_norm_weight, head_dim)
    _check_inputs(qkv, positions, cos_sin_cache, k_cache, v_cache, slot_mapping, head_dim)
    scaled = check_scales(k_cache, v_cache, k_scale, v_scale)
    if scaled:
        if k_scale.stride(2) != 1:  # type: ignore[union-attr]
            raise ValueError(f"k_scale must be dense in its last dimension, got {k_scale.stride()}")  # type: ignore[union-attr]
        require_same_device(k_cache=k_cache, k_scale=k_scale, v_scale=v_scale)  # type: ignore[arg-type]
    num_tokens = qkv.shape[0]
    q_out = torch.empty(num_tokens, num_heads, head_dim, dtype=qkv.dtype, device=qkv.device)
    if num_tokens == 0:
        return q_out
    block_g, block_half = next_power_of_2(num_heads // num_kv_heads), next_power_of_2(head_dim // 2)
    pdl = pdl and pdl_supported(qkv.device)
    _qkv_prepare_kernel[(num_tokens, num_kv_heads)](
        qkv,
        positions,
        cos_sin_cache,
        q_norm_weight if has_norm else qkv,
        k_norm_weight if has_norm else qkv,  # unread without the norm
        q_out,
        k_cache,
        v_cache,
        slot_mapping,
        k_scale if scaled else k_cache,  # unread without scales
        v_scale if scaled else k_cache,
        k_scale.stride(0) if scaled else 0,  # type: ignore[union-attr]
        k_scale.stride(1) if scaled else 0,  # type: ignore[union-attr]
        qkv.stride(0),
        cos_sin_cache.stride(0),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        eps,
        NUM_HEADS=num_heads,
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=k_cache.shape[1],
        BLOCK_G=block_g,
        BLOCK_HALF=block_half,
        HAS_NORM=has_norm,
        SCALED=scaled,
        QMAX=QUANT_MAX.get(k_cache.dtype, 0.0),
        INT8=k_cache.dtype == torch.int8,
        K_TO_QKV=k_to_qkv,
        PDL=pdl,
        # One warp per (token, KV head): the head's norm and absmax reductions stay within the warp
        # (shuffles, no shared memory or barrier). H200, 8,192 tokens of Qwen3-8B: int8/fp8 caches
        # 98.7 -> 63.3 µs (44 -> 69% of 4.25 TB/s), bf16 70.5 -> 66.6, against the 2 warps before.
        num_warps=num_warps,
        **pdl_launch(pdl),
    )
    return q_out
