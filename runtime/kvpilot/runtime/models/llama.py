"""The Llama family: Llama 2/3/3.x, Qwen2/2.5 (q/k/v bias) and Qwen3 (q/k RMSNorm), over a paged KV cache.

Parameter names follow Hugging Face's except for the fused projections (self_attn.qkv_proj,
mlp.gate_up_proj), which the loader assembles from q/k/v_proj and gate/up_proj.

Parallelism (kvpilot.runtime.distributed): with tensor parallel tp each rank holds 1/tp of the attention
heads (its KV heads, replicated when there are fewer than tp) and of the MLP, and one block of the
vocabulary; with pipeline parallel a stage holds only its layers (the others are empty placeholders, so
parameter names stay the checkpoint's), the first stage the embedding and the last the norm and LM head.
"""

from __future__ import annotations

from typing import Any

import torch
from kvpilot.runtime.config import ModelConfig
from kvpilot.runtime.distributed.comm import Comm
from kvpilot.runtime.distributed.sharding import even_split, kv_heads_per_rank, kv_split
from kvpilot.runtime.distributed.topology import stage_layers
from kvpilot.runtime.kernels.gemv import GEMV_MAX_M
from kvpilot.runtime.layers.activation import SiluAndMul
from kvpilot.runtime.layers.attention import AttentionMetadata, KVCache, PagedAttention
from kvpilot.runtime.layers.embedding import LMHead, VocabEmbedding
from kvpilot.runtime.layers.kernel_ops import KernelOps
from kvpilot.runtime.layers.norm import RMSNorm
from kvpilot.runtime.layers.parallel_linear import ColumnParallelLinear, RowParallelLinear
from kvpilot.runtime.layers.rotary import RotaryEmbedding
from torch import nn

# what a pipeline stage that is not the last hands the next one: (hidden, residual), each [T, hidden]
Intermediate = tuple[torch.Tensor, torch.Tensor]


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding, ops: KernelOps, comm: Comm) -> None:
        super().__init__()
        tp, tp_rank = comm.tp_size, comm.tp_rank
        self.num_heads = config.num_attention_heads // tp
        self.num_kv_heads = kv_heads_per_rank(config.num_key_value_heads, tp)
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim  # this rank's
        kv = kv_split(config.num_key_value_heads, self.head_dim, tp, tp_rank)
        self.qkv_proj = ColumnParallelLinear(
            config.hidden_size,
            (config.q_size, config.kv_size, config.kv_size),
            ops,
            comm,
            bias=config.attention_bias,
            splits=(even_split(config.q_size, tp, tp_rank), kv, kv),
        )
        self.o_proj = RowParallelLinear(config.q_size, config.hidden_size, ops, comm, bias=config.o_proj_bias)
        if config.qk_norm:  # hold the weights; the norms run inside attn.store_qkv
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, ops)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, ops)
        self.qk_norm = config.qk_norm
        self.rotary = rotary  # shared by every layer; holds no parameters
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim**-0.5, ops)

    @property
    def fusable(self) -> bool:
        """The QKV projection takes the norm (no bias; any weight format whose method fuses)."""
        return self.qkv_proj.fusable

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        return self._attend(positions, self.qkv_proj(hidden), kv_cache, meta)

    def forward_with_norm(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        norm: RMSNorm,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode: norm(hidden + residual) fused into the QKV GEMV; returns (output, hidden + residual)."""
        qkv, residual = self.qkv_proj.norm_linear(hidden, residual, norm.weight, norm.eps)
        return self._attend(positions, qkv, kv_cache, meta), residual

    def _attend(
        self, positions: torch.Tensor, qkv: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        """q/k norm, rotary and the K/V store run as one op on the fused projection, with no copies."""
        q = self.attn.store_qkv(
            qkv, positions, self.rotary.cos_sin_cache, kv_cache, meta, **self._qk_norm_weights()
        )
        out = self.attn(q, kv_cache, meta, qkv)  # qkv: the step's K/V rows on prefix-free steps
        return self.o_proj(out.reshape(qkv.shape[0], self.q_size))  # a view: out is dense

    def _qk_norm_weights(self) -> dict[str, Any]:
        """Read at call time: the loader may replace the parameters after construction."""
        if not self.qk_norm:
            return {}
        return {
            "q_norm_weight": self.q_norm.weight,
            "k_norm_weight": self.k_norm.weight,
            "eps": self.q_norm.eps,
        }


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps, comm: Comm) -> None:
        super().__init__()
        inter = config.intermediate_size
        self.gate_up_proj = ColumnParallelLinear(config.hidden_size, (inter, inter), ops, comm)
        self.down_proj = RowParallelLinear(inter, config.hidden_size, ops, comm)
        self.act = SiluAndMul(ops)

    @property
    def fusable(self) -> bool:
        """Both projections take their fused op (the MLP has no bias; any weight format that fuses)."""
        return self.gate_up_proj.fusable and self.down_proj.fusable

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))

    def forward_with_norm(
        self, hidden: torch.Tensor, residual: torch.Tensor, norm: RMSNorm
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Decode, tp 1: norm(hidden + residual) fused into the gate/up GEMV, SiLU-and-mul into the down
        GEMV (two launches instead of four); returns (output, hidden + residual)."""
        gate_up, residual = self.gate_up_proj.norm_linear(hidden, residual, norm.weight, norm.eps)
        return self.down_proj.silu_linear(gate_up), residual


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding, ops: KernelOps, comm: Comm) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, rotary, ops, comm)
        self.mlp = LlamaMLP(config, ops, comm)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        # decode steps of <= GEMV_MAX_M tokens fuse each norm (and the SiLU) into the next GEMV; one rank
        # only (a tensor-parallel rank's row-parallel GEMV is followed by an all-reduce)
        self.fused_gemv = comm.tp_size == 1

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-norm block; the residual add is fused into the following norm, and at decode (the token
        count is a shape, so each captured CUDA graph bakes in one path) the norm into the next GEMV."""
        fused = self.fused_gemv and hidden.shape[0] <= GEMV_MAX_M
        attn, mlp = self.self_attn, self.mlp
        if fused and attn.fusable:
            hidden, residual = attn.forward_with_norm(
                positions, hidden, residual, self.input_layernorm, kv_cache, meta
            )
        else:
            if residual is None:
                residual = hidden
                hidden = self.input_layernorm(hidden)
            else:
                hidden, residual = self.input_layernorm(hidden, residual)
            hidden = attn(positions, hidden, kv_cache, meta)
        if fused and mlp.fusable:
            return mlp.forward_with_norm(hidden, residual, self.post_attention_layernorm)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return mlp(hidden), residual


class LlamaModel(nn.Module):
    """The layers of this rank's pipeline stage (all of them without pipeline parallelism)."""

    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding, ops: KernelOps, comm: Comm) -> None:
        super().__init__()
        rank = comm.rank
        self.stage = stage_layers(config.num_hidden_layers, rank.pp, rank.pp_rank)
        self.is_first, self.is_last = rank.is_first_stage, rank.is_last_stage
        if self.is_first:
            self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size, comm)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, rotary, ops, comm) if i in self.stage else nn.Identity()
            for i in range(config.num_hidden_layers)
        )
        if self.is_last:
            self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
        intermediate: Intermediate | None = None,
    ) -> torch.Tensor | Intermediate:
        """kv_caches: one per layer of the stage. The last stage returns the final hidden states, the
        others (hidden, residual) for the next stage, which passes them back in as `intermediate`."""
        if intermediate is None:
            hidden, residual = self.embed_tokens(input_ids), None
        else:
            hidden, residual = intermediate
        for index, kv_cache in zip(self.stage, kv_caches, strict=True):
            hidden, residual = self.layers[index](positions, hidden, residual, kv_cache, meta)
        assert residual is not None  # every stage holds at least one layer (EngineArgs checks pp)
        if not self.is_last:
            return hidden, residual
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    """forward() returns final hidden states [num_tokens, hidden]; compute_logits() the LM head on the
    rows the caller selects (only the sampled ones), so prefill never pays for a full-vocab projection."""

    def __init__(
        self,
        config: ModelConfig,
        ops: KernelOps,
        *,
        max_positions: int | None = None,
        rope_device: torch.device | str = "cpu",
        comm: Comm | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        comm = comm or Comm.single(torch.device(rope_device))
        rotary = RotaryEmbedding(
            config.head_dim,
            max_positions or config.max_position_embeddings,
            config.rope_theta,
            config.rope_scaling,
            device=rope_device,
        )
        self.model = LlamaModel(config, rotary, ops, comm)
        self.is_partial = comm.rank.pp > 1  # a pipeline stage: the checkpoint holds other stages' tensors
        if self.model.is_last:
            self.lm_head = LMHead(config.vocab_size, config.hidden_size, ops, comm)

    def tie_weights(self) -> None:
        """Share the embedding with the LM head (tie_word_embeddings); call after materialising. A last
        stage without the embedding loads the embedding's tensor into its LM head instead (the loader)."""
        if self.model.is_first and self.model.is_last:
            self.lm_head.tie_to(self.model.embed_tokens)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
        intermediate: Intermediate | None = None,
    ) -> torch.Tensor | Intermediate:
        return self.model(input_ids, positions, kv_caches, meta, intermediate)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
