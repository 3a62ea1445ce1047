"""The "cpu" backend: the plain-PyTorch references rewritten for serving on a CPU, where every op is a
few microseconds of Python and dispatch and the model's own matmuls are the only real work.

Same semantics as the references beside them (and tested against them): fewer, larger ops, no Python
loop over the sequences of a decode step, torch's fused RMSNorm and scaled-dot-product attention. The
references stay what they are: the oracle the Triton kernels and this file are checked against.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from .attention import paged_attention_ref
from .qkv_prepare import check_qk_norm, qkv_heads, qkv_prepare_ref

# ---- linear ------------------------------------------------------------------------------------
# Weights repacked once into oneDNN's blocked layout (kept beside the original, which stays the
# parameter): the BLAS GEMM behind F.linear is fast for one row (a GEMV, bound by memory) but several
# times slower than oneDNN from a handful of rows up, and bfloat16 is only fast through oneDNN (AVX-512
# BF16). Keyed by the parameter and packed at its first use (after loading), repacked if it is written
# again in place (its version changes; writes through `.data` are not seen).
_PACKED: dict[int, tuple[weakref.ref, int, torch.Tensor]] = {}
_CAN_PACK = torch.backends.mkldnn.is_available()


def _packed(weight: torch.Tensor) -> torch.Tensor:
    key = id(weight)
    entry = _PACKED.get(key)
    if entry is not None and entry[0]() is weight and entry[1] == weight._version:
        return entry[2]
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
    _PACKED[key] = (weakref.ref(weight, lambda _: _PACKED.pop(key, None)), weight._version, packed)
    return packed


def linear_cpu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear; through oneDNN with a prepacked weight for float32 batches of several rows and for
    bfloat16."""
    one_fp32_row = x.dtype == torch.float32 and x.shape[0] == 1
    if (
        not _CAN_PACK
        or one_fp32_row
        or x.dim() != 2
        or x.dtype not in (torch.float32, torch.bfloat16)
        or weight.dtype != x.dtype
        or weight.device.type != "cpu"
    ):
        return F.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, _packed(weight), bias, "none", [], "")


# ---- per-step values ---------------------------------------------------------------------------
class _StepMemo:
    """Values every layer of a step derives from the same step inputs (rotary cos/sin by position, the
    decode mask, the block tables as int64): made by the first layer, reused by the others. Keyed by the
    identity of those input tensors, which the memo holds (so an id is never reused while it is kept);
    the runner makes them afresh for every step and never writes them in place."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[tuple[torch.Tensor, ...], Any]] = {}

    def get(self, name: str, key: tuple[torch.Tensor, ...], make: Callable[[], Any]) -> Any:
        entry = self._entries.get(name)
        if entry is not None and all(a is b for a, b in zip(entry[0], key, strict=True)):
            return entry[1]
        value = make()
        self._entries[name] = (key, value)
        return value


_memo = _StepMemo()


def _rotary(positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each [num_tokens, 1, head_dim // 2] float32."""
    cos_sin = cos_sin_cache[positions].float()[:, None, :]
    cos, sin = cos_sin.chunk(2, dim=-1)
    return cos, sin


# ---- norms, activation, attention ----------------------------------------------------------------


def rms_norm_cpu(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """rms_norm_ref in five ops (float32 models; other dtypes take the reference). torch's own
    F.rms_norm is slower here: on CPU it decomposes into more ops than this."""
    if x.dtype != torch.float32:
        from .norm import rms_norm_ref

        return rms_norm_ref(x, weight, eps, residual)
    if residual is not None:
        x = x + residual
    scale = torch.mul(x, x).mean(dim=-1, keepdim=True).add_(eps).rsqrt_()
    out = torch.mul(x, scale).mul_(weight)
    return out if residual is None else (out, x)


def silu_and_mul_cpu(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    if x.dtype != torch.float32:
        return (F.silu(gate.float()) * up.float()).to(x.dtype)
    return F.silu(gate).mul_(up)


def qkv_prepare_cpu(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """qkv_prepare_ref with q and k rotated together (one set of rotary ops instead of two). 8-bit caches
    (scales given) take the reference, which quantizes on store."""
    if k_scale is not None:
        return qkv_prepare_ref(
            qkv,
            positions,
            cos_sin_cache,
            k_cache,
            v_cache,
            slot_mapping,
            q_norm_weight,
            k_norm_weight,
            eps,
            k_scale=k_scale,
            v_scale=v_scale,
        )
    num_heads, num_kv_heads, head_dim = qkv_heads(qkv, k_cache)
    num_tokens = qkv.shape[0]
    heads = qkv.view(num_tokens, -1, head_dim)
    qk = heads[:, : num_heads + num_kv_heads].float()
    if check_qk_norm(q_norm_weight, k_norm_weight, head_dim):
        weight = torch.cat(
            [q_norm_weight.float().expand(num_heads, -1), k_norm_weight.float().expand(num_kv_heads, -1)]  # type: ignore[union-attr]
        )
        qk = qk * torch.rsqrt(qk.pow(2).mean(dim=-1, keepdim=True) + eps) * weight
    cos, sin = _memo.get("rotary", (positions, cos_sin_cache), lambda: _rotary(positions, cos_sin_cache))
    x1, x2 = qk.chunk(2, dim=-1)
    rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(qkv.dtype)
    q, k = rotated.split([num_heads, num_kv_heads], dim=1)
    v = heads[:, num_heads + num_kv_heads :]
    flat_k = k_cache.view(-1, num_kv_heads, head_dim)
    flat_v = v_cache.view(-1, num_kv_heads, head_dim)
    padded = _memo.get("padded", (slot_mapping,), lambda: num_tokens > 0 and int(slot_mapping.min()) < 0)
    if padded:  # padding rows are not stored
        valid = slot_mapping >= 0
        slot_mapping, k, v = slot_mapping[valid], k[valid], v[valid]
    flat_k[slot_mapping] = k.to(k_cache.dtype)  # index_put_: also for fp8 caches (index_copy_ is not)
    flat_v[slot_mapping] = v.to(v_cache.dtype)
    return q


def _gather(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """[num_seqs, max_blocks * block_size, kv_heads, head_dim]: every sequence's blocks in order."""
    tables = block_tables if block_tables.dtype == torch.int64 else block_tables.long()
    blocks = cache[tables]  # [S, max_blocks, block_size, KVH, D]
    return blocks.view(blocks.shape[0], -1, *cache.shape[2:])


def paged_attention_cpu(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    *,
    max_q_len: int,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """paged_attention_ref: a decode step (one query per sequence) as one batched attention over the
    gathered caches, masked by context length; prefill chunks per sequence with SDPA. 8-bit caches (scales
    given) take the reference, which dequantizes them."""
    if k_scale is not None:
        return paged_attention_ref(
            q,
            k_cache,
            v_cache,
            cu_seqlens_q,
            context_lens,
            block_tables,
            scale,
            k_scale=k_scale,
            v_scale=v_scale,
        )
    if max_q_len == 1:
        return _decode(q, k_cache, v_cache, context_lens, block_tables, scale)
    out = torch.empty_like(q)
    cu = cu_seqlens_q.tolist()
    for s, ctx in enumerate(context_lens.tolist()):
        start, end = cu[s], cu[s + 1]
        q_len = end - start
        blocks = -(-ctx // k_cache.shape[1])
        table = block_tables[s : s + 1, :blocks]
        k = _gather(k_cache, table)[:, :ctx].transpose(1, 2).float()  # [1, KVH, ctx, D]
        v = _gather(v_cache, table)[:, :ctx].transpose(1, 2).float()
        qs = q[start:end].transpose(0, 1)[None].float()  # [1, H, q_len, D]
        if q_len == ctx:
            attn = F.scaled_dot_product_attention(qs, k, v, is_causal=True, scale=scale, enable_gqa=True)
        else:  # a later chunk of a prompt: row i sits at position ctx - q_len + i
            q_pos = torch.arange(ctx - q_len, ctx)[:, None]
            mask = torch.arange(ctx)[None, :] <= q_pos
            attn = F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        out[start:end] = attn[0].transpose(0, 1).to(q.dtype)
    return out


def _decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """One query per sequence: SDPA over every sequence's gathered blocks, positions past its context
    masked out (the block tables are padded with block 0)."""
    num_seqs, num_heads, head_dim = q.shape
    width = block_tables.shape[1] * k_cache.shape[1]

    def make() -> tuple[torch.Tensor, torch.Tensor]:
        mask = (torch.arange(width) < context_lens[:, None])[:, None, None, :]  # [S, 1, 1, L]
        return block_tables.long(), mask

    tables, mask = _memo.get("decode", (context_lens, block_tables), make)
    k = _gather(k_cache, tables).transpose(1, 2).float()  # [S, KVH, L, D]
    v = _gather(v_cache, tables).transpose(1, 2).float()
    out = F.scaled_dot_product_attention(
        q.float()[:, :, None, :], k, v, attn_mask=mask, scale=scale, enable_gqa=True
    )
    return out.view(num_seqs, num_heads, head_dim).to(q.dtype)
