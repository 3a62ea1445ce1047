"""Triton paged attention with the signature of paged_attention_ref: picks the decode or prefill kernel.

Decode (every sequence has exactly one query token) goes to the split-KV flash-decoding kernel; batches in
which every sequence has the same few query tokens (speculative verification: k + 1 each) to its
multi-query variant (verify_attention_triton.py); anything else (prefill chunks, extends, mixed prefill +
decode batches) to the varlen prefill kernel. Inputs are
checked here on shapes and dtypes only, so the call never syncs with the device on the decode path.
"""

from __future__ import annotations

import torch

from .attention_route import uniform_query_len
from .decode_attention_triton import paged_decode_attention_triton
from .kv_cache import check_scales
from .prefill_attention_triton import paged_prefill_attention_triton
from .triton_utils import require_last_dim_contiguous, require_same_device
from .verify_attention_triton import paged_verify_attention_triton

_INDEX_DTYPE = torch.int32


def check_paged_attention_inputs(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Raise ValueError naming the first inconsistency between the attention inputs."""
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"expected q [tokens, heads, head_dim] and K/V caches [blocks, block_size, kv_heads, head_dim] "
            f"of one shape, got q {tuple(q.shape)}, k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)}"
        )
    block_size, num_kv_heads, head_dim = k_cache.shape[1:]
    if q.shape[2] != head_dim or q.shape[1] % num_kv_heads != 0:
        raise ValueError(
            f"q heads/head_dim {tuple(q.shape[1:])} do not fit {num_kv_heads} KV heads of {head_dim}"
        )
    if block_size & (block_size - 1):
        raise ValueError(f"block_size must be a power of two, got {block_size}")
    num_seqs = context_lens.shape[0]
    if cu_seqlens_q.shape != (num_seqs + 1,) or block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise ValueError(
            f"{num_seqs} sequences need cu_seqlens_q [{num_seqs + 1}] and "
            f"block_tables [{num_seqs}, max_blocks], "
            f"got {tuple(cu_seqlens_q.shape)} and {tuple(block_tables.shape)}"
        )
    index_tensors = {"cu_seqlens_q": cu_seqlens_q, "context_lens": context_lens, "block_tables": block_tables}
    for name, t in index_tensors.items():
        if t.dtype != _INDEX_DTYPE:
            raise ValueError(f"{name} must be int32, got {t.dtype}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("block_tables", block_tables)):
        require_last_dim_contiguous(name, t)
    if check_scales(k_cache, v_cache, k_scale, v_scale):
        require_same_device(k_cache=k_cache, k_scale=k_scale, v_scale=v_scale)  # type: ignore[arg-type]
    require_same_device(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        cu_seqlens_q=cu_seqlens_q,
        context_lens=context_lens,
        block_tables=block_tables,
    )


def paged_attention_triton(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,  # [num_seqs + 1] int32
    context_lens: torch.Tensor,  # [num_seqs] int32
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    scale: float,
    *,
    max_q_len: int | None = None,
    is_decode: bool | None = None,
    k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] fp32: 8-bit caches
    v_scale: torch.Tensor | None = None,
    step_kv: tuple[torch.Tensor, torch.Tensor] | None = None,  # each [num_tokens, num_kv_heads, head_dim]
    prefix_free: bool = False,
    out: torch.Tensor | None = None,  # like q: written and returned (decode and prefill kernels)
    max_context_len: int | None = None,  # host bound on context_lens (the prefill kernel's prefix splits)
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """is_decode defaults to max_q_len == 1 when given, else to num_tokens == num_seqs (chunks are never
    empty, so that means one token each); both are decided without reading device memory. step_kv: the
    step's K/V rows, which the prefill kernel reads for each chunk's own positions (prefix_free: no
    sequence has cached context); decode and verification read the pages."""
    check_paged_attention_inputs(
        q, k_cache, v_cache, cu_seqlens_q, context_lens, block_tables, k_scale, v_scale
    )
    num_seqs = context_lens.shape[0]
    if is_decode is None:
        is_decode = max_q_len == 1 if max_q_len is not None else q.shape[0] == num_seqs
    if is_decode:
        if q.shape[0] != num_seqs:
            raise ValueError(
                f"decode needs one query token per sequence: {q.shape[0]} tokens, {num_seqs} sequences"
            )
        return paged_decode_attention_triton(
            q, k_cache, v_cache, context_lens, block_tables, scale, k_scale=k_scale, v_scale=v_scale, out=out
        )
    if uniform_query_len(q.shape[0], num_seqs, max_q_len):
        res = paged_verify_attention_triton(
            q, k_cache, v_cache, context_lens, block_tables, scale, k_scale=k_scale, v_scale=v_scale
        )
        return res if out is None else out.copy_(res)
    return paged_prefill_attention_triton(
        q,
        k_cache,
        v_cache,
        cu_seqlens_q,
        context_lens,
        block_tables,
        scale,
        max_q_len=max_q_len,
        k_scale=k_scale,
        v_scale=v_scale,
        step_kv=step_kv,
        prefix_free=prefix_free,
        out=out,
        max_context_len=max_context_len,
    )
