"""The attention prologue after the fused qkv projection, as one op: per-head q/k RMSNorm (Qwen3 only),
rotary on q and k, q written out dense, rotated k and raw v stored into the paged KV cache.

This is the plain-PyTorch reference, composed of the single-op references it replaces; the Triton
kernel beside it (qkv_prepare_triton.py) does the same in one launch.
"""

from __future__ import annotations

import torch

from .kv_cache import store_kv_cache_ref
from .norm import rms_norm_ref
from .rotary import apply_rotary_ref


def qkv_heads(qkv: torch.Tensor, k_cache: torch.Tensor) -> tuple[int, int, int]:
    """(num_heads, num_kv_heads, head_dim) of a fused projection [num_tokens, (H + 2 * KVH) * D], with
    KVH and D read from the cache [num_blocks, block_size, KVH, D]; ValueError when they do not fit."""
    if qkv.dim() != 2 or k_cache.dim() != 4:
        raise ValueError(f"qkv must be 2-D and k_cache 4-D, got {tuple(qkv.shape)}, {tuple(k_cache.shape)}")
    num_kv_heads, head_dim = k_cache.shape[2:]
    width = qkv.shape[1]
    num_heads = width // head_dim - 2 * num_kv_heads
    if width % head_dim or num_heads <= 0 or num_heads % num_kv_heads:
        raise ValueError(
            f"qkv width {width} is not (H + 2 * {num_kv_heads}) * {head_dim}, H a multiple of {num_kv_heads}"
        )
    return num_heads, num_kv_heads, head_dim


def check_qk_norm(
    q_norm_weight: torch.Tensor | None, k_norm_weight: torch.Tensor | None, head_dim: int
) -> bool:
    """Whether q/k norm applies: both weights [head_dim], or neither."""
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError("pass both q_norm_weight and k_norm_weight, or neither")
    for name, w in (("q_norm_weight", q_norm_weight), ("k_norm_weight", k_norm_weight)):
        if w is not None and w.shape != (head_dim,):
            raise ValueError(f"{name} must be [{head_dim}], got {tuple(w.shape)}")
    return q_norm_weight is not None


def qkv_prepare_ref(
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
) -> torch.Tensor:
    """Returns q [num_tokens, num_heads, head_dim] (normed, rotated); writes k (normed, rotated) and v
    (quantized per token and head, their scales beside them, when the cache is 8-bit). k_to_qkv: also
    writes the normed, rotated k over qkv's k columns (the step's K rows that attention may read)."""
    num_heads, num_kv_heads, head_dim = qkv_heads(qkv, k_cache)
    has_norm = check_qk_norm(q_norm_weight, k_norm_weight, head_dim)
    num_tokens = qkv.shape[0]
    q, k, v = qkv.view(num_tokens, -1, head_dim).split([num_heads, num_kv_heads, num_kv_heads], dim=1)
    if has_norm and q_norm_weight is not None and k_norm_weight is not None:
        q = rms_norm_ref(q.reshape(-1, head_dim), q_norm_weight, eps).view(q.shape)  # type: ignore[union-attr]
        k = rms_norm_ref(k.reshape(-1, head_dim), k_norm_weight, eps).view(k.shape)  # type: ignore[union-attr]
    q, k = apply_rotary_ref(positions, q, k, cos_sin_cache)
    store_kv_cache_ref(k, v, k_cache, v_cache, slot_mapping, k_scale=k_scale, v_scale=v_scale)
    if k_to_qkv:
        qkv.view(num_tokens, -1, head_dim)[:, num_heads : num_heads + num_kv_heads] = k.to(qkv.dtype)
    return q
