"""Attention over the paged KV cache, for prefill chunks and decodes alike.

Semantics shared by every implementation in this file: sequence s owns the query rows
cu_seqlens_q[s]:cu_seqlens_q[s+1] (its q_len newest tokens) and has context_lens[s] tokens in the cache,
the new ones included (K/V are stored before attention runs). Query row i of s sits at position
context_lens[s] - q_len + i and attends causally to cache positions 0..that position.

8-bit caches (see kv_cache.py) pass k_scale/v_scale [num_blocks, block_size, num_kv_heads] float32: the
reference dequantizes to float32 before the dots; the triton kernels do the same in registers.
"""

from __future__ import annotations

import torch

from .kv_cache import check_scales, dequantize_ref


def gather_kv_ref(
    cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim] (or scales: no head_dim)
    block_table: torch.Tensor,  # [max_blocks] int32 for one sequence
    context_len: int,
) -> torch.Tensor:  # [context_len, num_kv_heads, head_dim]
    block_size = cache.shape[1]
    num_blocks = (context_len + block_size - 1) // block_size
    blocks = cache[block_table[:num_blocks].long()]  # [num_blocks, block_size, kv_heads, head_dim]
    return blocks.reshape(-1, *cache.shape[2:])[:context_len]


def gather_kv_float_ref(
    cache: torch.Tensor,
    scales: torch.Tensor | None,
    block_table: torch.Tensor,
    context_len: int,
) -> torch.Tensor:  # [context_len, num_kv_heads, head_dim] float32, dequantized
    s = None if scales is None else gather_kv_ref(scales, block_table, context_len)
    return dequantize_ref(gather_kv_ref(cache, block_table, context_len), s)


def paged_attention_ref(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,  # [num_seqs + 1] int32
    context_lens: torch.Tensor,  # [num_seqs] int32
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    scale: float,
    *,
    max_q_len: int | None = None,  # the triton kernels' host-side hint; the reference needs none
    k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] fp32, 8-bit caches
    v_scale: torch.Tensor | None = None,
    step_kv: tuple[torch.Tensor, torch.Tensor] | None = None,  # each [num_tokens, num_kv_heads, head_dim]
    prefix_free: bool = False,  # the triton kernels' launch hint; the reference needs none
    out: torch.Tensor | None = None,  # written and returned when given (like q)
    max_context_len: int | None = None,  # the triton kernels' launch hint; the reference needs none
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """step_kv: the step's own K/V rows, attended for each chunk's own positions instead of the pages
    (the same values on a 16-bit cache; full precision on an 8-bit one)."""
    check_scales(k_cache, v_cache, k_scale, v_scale)
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.empty_like(q) if out is None else out
    cu = cu_seqlens_q.tolist()
    for s, ctx in enumerate(context_lens.tolist()):
        qs = q[cu[s] : cu[s + 1]].float()  # [q_len, H, D]
        q_len = qs.shape[0]
        k = gather_kv_float_ref(k_cache, k_scale, block_tables[s], ctx)  # [ctx, KVH, D]
        v = gather_kv_float_ref(v_cache, v_scale, block_tables[s], ctx)
        if step_kv is not None and q_len:
            k[ctx - q_len :] = step_kv[0][cu[s] : cu[s + 1]].float()
            v[ctx - q_len :] = step_kv[1][cu[s] : cu[s + 1]].float()
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = torch.einsum("qhd,khd->hqk", qs, k) * scale  # [H, q_len, ctx]
        q_pos = torch.arange(ctx - q_len, ctx, device=q.device)[:, None]
        k_pos = torch.arange(ctx, device=q.device)[None, :]
        scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        out[cu[s] : cu[s + 1]] = torch.einsum("hqk,khd->qhd", probs, v).to(q.dtype)
    return out
