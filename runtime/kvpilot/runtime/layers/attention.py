"""Attention over the paged KV cache: prepare q and store the new K/V at their slots, then attend (prefill and
decode)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from kvpilot.runtime.kernels.attention import paged_attention_ref
from kvpilot.runtime.kernels.cpu import paged_attention_cpu, qkv_prepare_cpu
from kvpilot.runtime.kernels.qkv_prepare import qkv_prepare_ref
from kvpilot.runtime.layers.backend import lazy_op, pick_op
from torch import nn

_QKV_PREPARE = {
    "torch": qkv_prepare_ref,
    "cpu": qkv_prepare_cpu,
    "triton": lazy_op("kvpilot.runtime.kernels.qkv_prepare_triton", "qkv_prepare_triton"),
}
_paged_attention_triton = lazy_op("kvpilot.runtime.kernels.attention_triton", "paged_attention_triton")


@dataclass
class AttentionMetadata:
    """Where each token of the flattened batch goes in the paged cache and what it attends to."""

    slot_mapping: torch.Tensor  # [num_tokens] int64; -1 = do not store
    cu_seqlens_q: torch.Tensor  # [num_seqs + 1] int32: query rows of sequence s are [cu[s], cu[s+1])
    context_lens: torch.Tensor  # [num_seqs] int32: cached tokens per sequence, the new ones included
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, padded with 0
    max_q_len: int
    max_context_len: int


def _attend_ref(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    return paged_attention_ref(
        q, k_cache, v_cache, meta.cu_seqlens_q, meta.context_lens, meta.block_tables, scale
    )


def _attend_triton(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    """max_q_len is known on the host, so the kernel choice and grid never read device memory."""
    return _paged_attention_triton(
        q,
        k_cache,
        v_cache,
        meta.cu_seqlens_q,
        meta.context_lens,
        meta.block_tables,
        scale,
        max_q_len=meta.max_q_len,
    )


def _attend_cpu(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata, scale: float
) -> torch.Tensor:
    return paged_attention_cpu(
        q,
        k_cache,
        v_cache,
        meta.cu_seqlens_q,
        meta.context_lens,
        meta.block_tables,
        scale,
        max_q_len=meta.max_q_len,
    )


_PAGED_ATTENTION = {"torch": _attend_ref, "cpu": _attend_cpu, "triton": _attend_triton}


class PagedAttention(nn.Module):
    """store_qkv() turns the fused qkv projection into q and the cached K/V (one launch on triton);
    forward() attends q over the cache."""

    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, *, backend: str = "torch"
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self._prepare = pick_op(_QKV_PREPARE, backend, "qkv_prepare")
        self._attend = pick_op(_PAGED_ATTENTION, backend, "paged_attention")

    def store_qkv(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        cos_sin_cache: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        q_norm_weight: torch.Tensor | None = None,
        k_norm_weight: torch.Tensor | None = None,
        eps: float = 1e-6,
    ) -> torch.Tensor:
        """qkv [T, (H + 2 * KVH) * D]: per-head q/k RMSNorm (when weights are given), rotary, k and v into
        the caches [num_blocks, block_size, KVH, D] at meta.slot_mapping -> q [T, H, D], dense."""
        return self._prepare(
            qkv,
            positions,
            cos_sin_cache,
            k_cache,
            v_cache,
            meta.slot_mapping,
            q_norm_weight,
            k_norm_weight,
            eps,
        )

    def forward(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """q [T, H, D] over the caches [num_blocks, block_size, KVH, D] -> [T, H, D]."""
        return self._attend(q, k_cache, v_cache, meta, self.scale)
