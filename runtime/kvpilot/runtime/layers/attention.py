"""Attention over the paged KV cache: prepare q and store the new K/V at their slots, then attend (prefill and
decode)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from kvpilot.runtime.kernels.attention_route import uniform_query_len
from kvpilot.runtime.kernels.kv_cache import KVCache
from kvpilot.runtime.layers.kernel_ops import KernelOps
from torch import nn

__all__ = ["AttentionMetadata", "KVCache", "MixedSplit", "PagedAttention", "PromptPart"]


@dataclass
class MixedSplit:
    """A mixed step's sequences past its leading decodes (one query token each), staged on their own so
    the decodes can go to the decode kernel and the rest to the prefill kernel (16-byte aligned tensors:
    views at a moving offset would make Triton compile new variants while serving)."""

    num_decode_seqs: int
    cu_seqlens_q: torch.Tensor  # [num_seqs - num_decode_seqs + 1] int32, from 0
    context_lens: torch.Tensor  # [num_seqs - num_decode_seqs] int32
    block_tables: torch.Tensor  # [num_seqs - num_decode_seqs, max_blocks] int32
    prefix_free: bool  # none of those sequences has cached tokens
    # those sequences as chunks with cached tokens, then prompts without (the scheduler's order): the
    # prompts staged again on their own, so each group takes its own prefill launch (PagedAttention)
    prompts: PromptPart | None = None


@dataclass
class PromptPart:
    """The prefix-free sequences that follow a mixed step's chunks with cached tokens (MixedSplit)."""

    num_prefix_seqs: int  # the chunks with cached tokens before them
    num_prefix_tokens: int
    cu_seqlens_q: torch.Tensor  # [prompts + 1] int32, from 0
    context_lens: torch.Tensor  # [prompts] int32
    block_tables: torch.Tensor  # [prompts, max_blocks] int32


@dataclass
class AttentionMetadata:
    """Where each token of the flattened batch goes in the paged cache and what it attends to."""

    slot_mapping: torch.Tensor  # [num_tokens] int64; -1 = do not store
    cu_seqlens_q: torch.Tensor  # [num_seqs + 1] int32: query rows of sequence s are [cu[s], cu[s+1])
    context_lens: torch.Tensor  # [num_seqs] int32: cached tokens per sequence, the new ones included
    block_tables: torch.Tensor  # [num_seqs, max_blocks] int32, padded with 0
    max_q_len: int
    max_context_len: int
    # every sequence's whole context is this step's chunk (no cached tokens): the prefill attention may
    # read the step's K/V rows instead of the pages (PagedAttention)
    prefix_free: bool = False
    # a step of decodes followed by longer chunks (model_inputs stages this for every such step)
    mixed: MixedSplit | None = None


class PagedAttention(nn.Module):
    """store_qkv() turns the fused qkv projection into q and the cached K/V (one launch on triton);
    forward() attends q over the cache."""

    def __init__(
        self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float, ops: KernelOps
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = scale
        self._prepare = ops.qkv_prepare
        self._attend = ops.paged_attention
        self._step_kv = ops.step_kv

    def uses_step_kv(self, kv_cache: KVCache, meta: AttentionMetadata) -> bool:
        """On kernels that support it, store_qkv leaves the rotated k in qkv's k columns and the prefill
        kernel reads each chunk's own K/V from qkv rather than from the pages: for prefix-free prefill steps
        over a 16-bit cache (no gather; H200 1 x 1024: 30.9 vs 38.7 µs paged, torch SDPA 32.3;
        benchmarks/sweep_attention2.py), and for every prefill step over an 8-bit cache, whose pages the
        prefill kernel reads at 0.5-0.6x of bf16's speed (benchmarks/sweep_prefill_kv8.py): only the
        cached prefix comes from them then, and a chunk attends over its own tokens at full precision.
        Steps of the verify kernel's shape (every chunk 2-16 tokens long) read the pages. A mixed step
        decides for the sequences after its decodes (the decode kernel reads the pages)."""
        if not self._step_kv or meta.max_q_len <= 1:
            return False
        tokens, seqs, prefix_free = meta.slot_mapping.shape[0], meta.context_lens.shape[0], meta.prefix_free
        if meta.mixed is not None:
            tokens, seqs = tokens - meta.mixed.num_decode_seqs, seqs - meta.mixed.num_decode_seqs
            prefix_free = meta.mixed.prefix_free
        if kv_cache.k_scale is None:
            return prefix_free
        return not uniform_query_len(tokens, seqs, meta.max_q_len)

    def store_qkv(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        cos_sin_cache: torch.Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
        q_norm_weight: torch.Tensor | None = None,
        k_norm_weight: torch.Tensor | None = None,
        eps: float = 1e-6,
    ) -> torch.Tensor:
        """qkv [T, (H + 2 * KVH) * D]: per-head q/k RMSNorm (when weights are given), rotary, k and v into
        the caches [num_blocks, block_size, KVH, D] at meta.slot_mapping (8-bit caches: quantized, with
        their scales) -> q [T, H, D], dense."""
        extra = {"k_to_qkv": True} if self.uses_step_kv(kv_cache, meta) else {}
        return self._prepare(
            qkv,
            positions,
            cos_sin_cache,
            kv_cache.k,
            kv_cache.v,
            meta.slot_mapping,
            q_norm_weight,
            k_norm_weight,
            eps,
            k_scale=kv_cache.k_scale,
            v_scale=kv_cache.v_scale,
            **extra,
        )

    def forward(
        self, q: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata, qkv: torch.Tensor | None = None
    ) -> torch.Tensor:
        """q [T, H, D] over the caches [num_blocks, block_size, KVH, D] -> [T, H, D] (8-bit caches are
        dequantized in registers). qkv: the projection store_qkv ran on (read when uses_step_kv). On
        kernels that take the step's rows, a mixed step runs its decodes through the decode kernel and the
        other sequences through the prefill kernel (one launch each, into one output)."""
        rows = None
        if qkv is not None and self.uses_step_kv(kv_cache, meta):
            t, h, kvh, d = qkv.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
            # views of qkv's k and v columns: [T, KVH, D] each, token stride (H + 2 KVH) * D
            rows = (qkv[:, h * d : (h + kvh) * d].view(t, kvh, d), qkv[:, (h + kvh) * d :].view(t, kvh, d))
        split = meta.mixed if self._step_kv else None
        if split is None:
            extra: dict[str, object] = {}
            if rows is not None:
                extra = {"step_kv": rows, "prefix_free": meta.prefix_free}
            return self._call(q, kv_cache, meta.cu_seqlens_q, meta.context_lens, meta.block_tables,
                              meta.max_q_len, **extra)  # fmt: skip
        n, out = split.num_decode_seqs, torch.empty_like(q)
        self._call(q[:n], kv_cache, meta.cu_seqlens_q[: n + 1], meta.context_lens[:n],
                   meta.block_tables[:n], 1, out=out[:n])  # fmt: skip
        if rows is not None and split.prompts is not None:
            rest = (rows[0][n:], rows[1][n:])
            self._chunks_then_prompts(q[n:], kv_cache, split, split.prompts, rest, meta, out[n:])
            return out
        extra = {}
        if rows is not None:
            extra = {"step_kv": (rows[0][n:], rows[1][n:]), "prefix_free": split.prefix_free}
        self._call(q[n:], kv_cache, split.cu_seqlens_q, split.context_lens, split.block_tables,
                   meta.max_q_len, out=out[n:], **extra)  # fmt: skip
        return out

    def _chunks_then_prompts(
        self,
        q: torch.Tensor,
        kv_cache: KVCache,
        split: MixedSplit,
        p: PromptPart,
        rows: tuple[torch.Tensor, torch.Tensor],
        meta: AttentionMetadata,
        out: torch.Tensor,
    ) -> None:
        """A mixed step's chunks with cached tokens, then its prompts, as two step-rows launches (into
        out): the prompts take the prefix-free kernel; the chunks may split their prefixes over programs
        (max_context_len). H200, a W2L step's tail of 40 tokens after 8,152 cached ones beside an 8,150-
        token prompt, int8: 1,554 µs against 1,986 in one launch and 1,779 for bf16's
        (benchmarks/bench_prefill_mixed.py)."""
        s, t = p.num_prefix_seqs, p.num_prefix_tokens
        # max_q_len None: the prefill kernel's flat grid, even for a group of the verify kernel's shape
        # (which reads the pages, not the step's rows)
        self._call(q[:t], kv_cache, split.cu_seqlens_q[: s + 1], split.context_lens[:s],
                   split.block_tables[:s], None, out=out[:t], step_kv=(rows[0][:t], rows[1][:t]),
                   max_context_len=meta.max_context_len)  # fmt: skip
        self._call(q[t:], kv_cache, p.cu_seqlens_q, p.context_lens, p.block_tables, None,
                   out=out[t:], step_kv=(rows[0][t:], rows[1][t:]), prefix_free=True)  # fmt: skip

    def _call(
        self,
        q: torch.Tensor,
        kv_cache: KVCache,
        cu_seqlens_q: torch.Tensor,
        context_lens: torch.Tensor,
        block_tables: torch.Tensor,
        max_q_len: int | None,
        **extra: object,
    ) -> torch.Tensor:
        # max_q_len is known on the host, so the triton kernel choice and grid never read device memory
        return self._attend(
            q,
            kv_cache.k,
            kv_cache.v,
            cu_seqlens_q,
            context_lens,
            block_tables,
            self.scale,
            max_q_len=max_q_len,
            k_scale=kv_cache.k_scale,
            v_scale=kv_cache.v_scale,
            **extra,
        )
