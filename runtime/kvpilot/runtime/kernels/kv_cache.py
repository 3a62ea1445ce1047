"""The paged KV cache: its layout, 8-bit quantization, and writing new keys/values into it.

Cache layout (every layer, K and V alike): values [num_blocks, block_size, num_kv_heads, head_dim]. A slot is
block_id * block_size + offset; slot -1 means "do not store" (padding).

8-bit caches (fp8 e4m3 and int8) keep one fp32 scale per (slot, KV head) beside the values, for K and V
each: scales [num_blocks, block_size, num_kv_heads]. The scheme is symmetric per-token-head absmax:

    scale = max(|x|) / QMAX over the head_dim values of one token's head   (QMAX: 448 e4m3, 127 int8)
    stored = round(x / scale), dequantized = stored * scale

Why this scheme rather than per-tensor or per-(layer, head) scales:
- it needs no calibration data and no first-prefill statistics: every token-head is scaled on its own when
  it is written, so nothing depends on which request came first or what the checkpoint carries;
- it never clips: max(|x|) maps to QMAX exactly, however large the activations (an unscaled e4m3 cast
  saturates at 448, and int8 without scales cannot represent anything), and small heads keep their full
  relative resolution;
- a block's values and scales are written once, by the token that owns the slot, and never rescaled, so a
  prefix-cached block stays valid for every later reader and preemption by recompute rewrites the same
  bytes;
- the bytes are the shared sizing formula's (kvpilot.contracts.kv_cache.kv_bytes_per_token counts
  SCALE_BYTES = 4 per token, layer, K/V and KV head), so the operator's plan and the runtime's allocation
  agree. That is head_dim + 4 bytes per vector: 3% over 8 bits at head_dim 128.
int8 is symmetric (zero point 0): K and V after rotary are roughly centred per head, and a zero point
would cost a second scale-sized field per vector and an extra term in every attention dot.
Checkpoint k_scale/v_scale (llm-compressor's per-tensor static scales) are not read: per-token-head scales
computed on write are at least as fine-grained.

The attention kernels dequantize in registers: K's scale multiplies the q.k scores of its position, V's
scale the softmax weight of its position, so the 8-bit values go to the dot unscaled and exactly widened.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

# the largest magnitude each 8-bit format stores (e4m3fn: 1.75 * 2^8; int8 symmetric: 127, never -128)
QUANT_MAX = {torch.float8_e4m3fn: 448.0, torch.int8: 127.0}


def is_scaled(dtype: torch.dtype) -> bool:
    """Whether a cache of this dtype keeps per-token-head scales beside its values."""
    return dtype in QUANT_MAX


class KVCache(NamedTuple):
    """One layer's paged K/V. k, v: [num_blocks, block_size, num_kv_heads, head_dim]; for 8-bit caches
    k_scale, v_scale: [num_blocks, block_size, num_kv_heads] float32 (None for 16/32-bit caches)."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None


def check_scales(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
) -> bool:
    """Whether the cache is scaled; ValueError when the scales do not fit its dtype and shape."""
    scaled = is_scaled(k_cache.dtype)
    if v_cache.dtype != k_cache.dtype:
        raise ValueError(f"k_cache is {k_cache.dtype} but v_cache is {v_cache.dtype}")
    if not scaled:
        if k_scale is not None or v_scale is not None:
            raise ValueError(f"a {k_cache.dtype} cache takes no scales")
        return False
    if k_scale is None or v_scale is None:
        raise ValueError(f"a {k_cache.dtype} KV cache needs k_scale and v_scale")
    want = tuple(k_cache.shape[:3])
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        if tuple(s.shape) != want or s.dtype != torch.float32:
            raise ValueError(f"{name} must be float32 {list(want)}, got {s.dtype} {list(s.shape)}")
    if k_scale.stride() != v_scale.stride():
        raise ValueError("k_scale and v_scale must have the same strides")
    return True


def round_half_away(y: torch.Tensor) -> torch.Tensor:
    """Round to nearest, ties away from zero: what the triton store does (trunc(y +- 0.5))."""
    return torch.trunc(y + torch.where(y >= 0, 0.5, -0.5))


def quantize_ref(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., head_dim] -> (values [..., head_dim] in dtype, scales [...] float32), absmax per row."""
    qmax = QUANT_MAX[dtype]
    xf = x.float()
    absmax = xf.abs().amax(dim=-1)
    scale = absmax / qmax
    inv = torch.where(absmax > 0, qmax / absmax, torch.zeros_like(absmax))
    y = (xf * inv[..., None]).clamp(-qmax, qmax)
    if dtype == torch.int8:
        y = round_half_away(y)
    return y.to(dtype), scale


def dequantize_ref(values: torch.Tensor, scales: torch.Tensor | None) -> torch.Tensor:
    """float32 values of a cache slice: values [..., head_dim] * scales [...] (or the values widened)."""
    if scales is None:
        return values.float()
    return values.float() * scales[..., None]


def store_kv_cache_ref(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64
    *,
    k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] fp32, 8-bit caches
    v_scale: torch.Tensor | None = None,
) -> None:
    scaled = check_scales(k_cache, v_cache, k_scale, v_scale)
    num_blocks, block_size = k_cache.shape[:2]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    # View the cache as one long row of slots so a slot indexes it directly.
    flat = num_blocks * block_size
    for x, cache, scales in ((key, k_cache, k_scale), (value, v_cache, v_scale)):
        rows = x[valid]
        if scaled:
            stored, s = quantize_ref(rows, cache.dtype)
            cache.view(flat, *cache.shape[2:])[slots] = stored
            scales.view(flat, scales.shape[2])[slots] = s  # type: ignore[union-attr]
        else:
            cache.view(flat, *cache.shape[2:])[slots] = rows.to(cache.dtype)
