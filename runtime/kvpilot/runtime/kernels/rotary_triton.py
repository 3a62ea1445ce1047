"""Triton rotary embedding (NeoX / Llama "rotate half"), same cos/sin cache layout as apply_rotary_ref.

The cache row of a position holds cos in its first half and sin in its second half; Llama-3.1 scaling and
Qwen's theta only change how that cache is built, not this kernel. One program per token rotates all of
its query and key heads: for halves (x1, x2) it writes (x1*cos - x2*sin, x2*cos + x1*sin), in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_utils import next_power_of_2, require_last_dim_contiguous, require_same_device


@triton.jit
def _rotate_heads(
    src_ptr,
    dst_ptr,
    token,
    stride_st,
    stride_sh,
    stride_dt,
    stride_dh,
    cos,
    sin,
    num_heads,
    HALF: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
):
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask = (offs_h[:, None] < num_heads) & (offs_d[None, :] < HALF)  # [BLOCK_H, BLOCK_HALF]
    src = src_ptr + token * stride_st + offs_h[:, None] * stride_sh + offs_d[None, :]
    dst = dst_ptr + token * stride_dt + offs_h[:, None] * stride_dh + offs_d[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    out_ty = dst_ptr.dtype.element_ty
    tl.store(dst, (x1 * cos[None, :] - x2 * sin[None, :]).to(out_ty), mask=mask)
    tl.store(dst + HALF, (x2 * cos[None, :] + x1 * sin[None, :]).to(out_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    positions_ptr,  # [num_tokens] int64
    q_ptr,  # [num_tokens, num_heads, head_dim]
    k_ptr,  # [num_tokens, num_kv_heads, head_dim]
    q_out_ptr,
    k_out_ptr,
    cos_sin_ptr,  # [max_positions, head_dim]
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_qot,
    stride_qoh,
    stride_kot,
    stride_koh,
    stride_cache,
    num_heads,
    num_kv_heads,
    HALF: tl.constexpr,  # head_dim // 2
    BLOCK_HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + token).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_HALF)
    d_mask = offs_d < HALF
    row = cos_sin_ptr + pos * stride_cache
    cos = tl.load(row + offs_d, mask=d_mask, other=0.0).to(tl.float32)  # [BLOCK_HALF]
    sin = tl.load(row + HALF + offs_d, mask=d_mask, other=0.0).to(tl.float32)
    _rotate_heads(
        q_ptr,
        q_out_ptr,
        token,
        stride_qt,
        stride_qh,
        stride_qot,
        stride_qoh,
        cos,
        sin,
        num_heads,
        HALF,
        BLOCK_HQ,
        BLOCK_HALF,
    )
    _rotate_heads(
        k_ptr,
        k_out_ptr,
        token,
        stride_kt,
        stride_kh,
        stride_kot,
        stride_koh,
        cos,
        sin,
        num_kv_heads,
        HALF,
        BLOCK_HK,
        BLOCK_HALF,
    )


def apply_rotary_triton(
    positions: torch.Tensor,  # [num_tokens] int64
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    cos_sin_cache: torch.Tensor,  # [max_positions, head_dim]: cos in the first half, sin in the second
) -> tuple[torch.Tensor, torch.Tensor]:
    num_tokens, num_heads, head_dim = q.shape
    if k.dim() != 3 or k.shape[0] != num_tokens or k.shape[2] != head_dim:
        raise ValueError(f"k must be [{num_tokens}, kv_heads, {head_dim}], got {tuple(k.shape)}")
    if head_dim % 2 or cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != head_dim:
        raise ValueError(
            f"cos_sin_cache must be [max_positions, {head_dim}] (even), got {tuple(cos_sin_cache.shape)}"
        )
    if positions.shape != (num_tokens,):
        raise ValueError(f"positions must be [{num_tokens}], got {tuple(positions.shape)}")
    for name, t in (("q", q), ("k", k), ("cos_sin_cache", cos_sin_cache)):
        require_last_dim_contiguous(name, t)
    require_same_device(positions=positions, q=q, k=k, cos_sin_cache=cos_sin_cache)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    if num_tokens == 0:
        return q_out, k_out
    half = head_dim // 2
    block_hq, block_hk = next_power_of_2(num_heads), next_power_of_2(k.shape[1])
    _rotary_kernel[(num_tokens,)](
        positions,
        q,
        k,
        q_out,
        k_out,
        cos_sin_cache,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        q_out.stride(0),
        q_out.stride(1),
        k_out.stride(0),
        k_out.stride(1),
        cos_sin_cache.stride(0),
        num_heads,
        k.shape[1],
        HALF=half,
        BLOCK_HALF=next_power_of_2(half),
        BLOCK_HQ=block_hq,
        BLOCK_HK=block_hk,
        num_warps=4 if block_hq * next_power_of_2(half) >= 1024 else 1,
    )
    return q_out, k_out
