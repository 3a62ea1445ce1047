"""Writing new keys/values into the paged KV cache.

Cache layout (every layer, K and V alike): [num_blocks, block_size, num_kv_heads, head_dim].
A slot is block_id * block_size + offset; slot -1 means "do not store" (padding).
"""

from __future__ import annotations

import torch


def store_kv_cache_ref(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,  # [num_tokens] int64
) -> None:
    num_blocks, block_size = k_cache.shape[:2]
    valid = slot_mapping >= 0
    slots = slot_mapping[valid]
    # View the cache as one long row of slots so a slot indexes it directly.
    k_cache.view(num_blocks * block_size, *k_cache.shape[2:])[slots] = key[valid].to(k_cache.dtype)
    v_cache.view(num_blocks * block_size, *v_cache.shape[2:])[slots] = value[valid].to(v_cache.dtype)
