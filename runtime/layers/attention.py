"""Attention over the paged KV cache: store the new K/V at their slots, then attend (prefill and decode)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from kvpilot.runtime.kernels.attention import paged_attention_ref
from kvpilot.runtime.kernels.kv_cache import store_kv_cache_ref
from kvpilot.runtime.layers.backend import lazy_op, pick_op
from torch import nn

_STORE_KV = {
    "torch": store_kv_cache_ref,
    "triton": lazy_op("kvpilot.runtime.kernels.kv_cache_triton", "store_kv_cache_triton"),
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


def _attend_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                scale: float) -> torch.Tensor:
    return paged_attention_ref(q, k_cache, v_cache, meta.cu_seqlens_q, meta.context_lens, meta.block_tables,
                               scale)


def _attend_triton(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                   scale: float) -> torch.Tensor:
    """max_q_len is known on the host, so the kernel choice and grid never read device memory."""
    return _paged_attention_triton(q, k_cache, v_cache, meta.cu_seqlens_q, meta.context_lens,
                                   meta.block_tables, scale, max_q_len=meta.max_q_len)


_PAGED_ATTENTION = {"torch": _attend_ref, "triton": _attend_triton}


class PagedAttention(nn.Module):
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, *,
                 backend: str = "torch") -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self._store = pick_op(_STORE_KV, backend, "store_kv_cache")
        self._attend = pick_op(_PAGED_ATTENTION, backend, "paged_attention")

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """q [T, H, D]; k, v [T, KVH, D]; caches [num_blocks, block_size, KVH, D] -> [T, H, D]."""
        self._store(k, v, k_cache, v_cache, meta.slot_mapping)
        return self._attend(q, k_cache, v_cache, meta, self.scale)
