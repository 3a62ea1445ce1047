"""The Llama family: Llama 2/3/3.x, Qwen2/2.5 (q/k/v bias) and Qwen3 (q/k RMSNorm), over a paged KV cache.

Parameter names follow Hugging Face's except for the fused projections (self_attn.qkv_proj,
mlp.gate_up_proj), which the loader assembles from q/k/v_proj and gate/up_proj.
"""

from __future__ import annotations

import torch
from kvpilot.runtime.config import ModelConfig
from kvpilot.runtime.layers.activation import SiluAndMul
from kvpilot.runtime.layers.attention import AttentionMetadata, KVCache, PagedAttention
from kvpilot.runtime.layers.embedding import LMHead, VocabEmbedding
from kvpilot.runtime.layers.kernel_ops import KernelOps
from kvpilot.runtime.layers.linear import Linear
from kvpilot.runtime.layers.norm import RMSNorm
from kvpilot.runtime.layers.rotary import RotaryEmbedding
from torch import nn


class LlamaAttention(nn.Module):
    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding, ops: KernelOps) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.qkv_proj = Linear(
            config.hidden_size,
            (self.q_size, self.kv_size, self.kv_size),
            ops,
            bias=config.attention_bias,
        )
        self.o_proj = Linear(self.q_size, config.hidden_size, ops, bias=config.o_proj_bias)
        if config.qk_norm:  # hold the weights; the norms run inside attn.store_qkv
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, ops)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, ops)
        self.qk_norm = config.qk_norm
        self.rotary = rotary  # shared by every layer; holds no parameters
        self.attn = PagedAttention(self.num_heads, self.num_kv_heads, self.head_dim, self.head_dim**-0.5, ops)

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata
    ) -> torch.Tensor:
        """q/k norm, rotary and the K/V store run as one op on the fused projection, with no copies."""
        q = self.attn.store_qkv(
            self.qkv_proj(hidden),
            positions,
            self.rotary.cos_sin_cache,
            kv_cache,
            meta,
            **self._qk_norm_weights(),
        )
        out = self.attn(q, kv_cache, meta)
        return self.o_proj(out.reshape(hidden.shape[0], self.q_size))  # a view: out is dense

    def _qk_norm_weights(self) -> dict[str, torch.Tensor | float]:
        """Read at call time: the loader may replace the parameters after construction."""
        if not self.qk_norm:
            return {}
        return {
            "q_norm_weight": self.q_norm.weight,
            "k_norm_weight": self.k_norm.weight,
            "eps": self.q_norm.eps,
        }


class LlamaMLP(nn.Module):
    def __init__(self, config: ModelConfig, ops: KernelOps) -> None:
        super().__init__()
        inter = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, (inter, inter), ops)
        self.down_proj = Linear(inter, config.hidden_size, ops)
        self.act = SiluAndMul(ops)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding, ops: KernelOps) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, rotary, ops)
        self.mlp = LlamaMLP(config, ops)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pre-norm block; the residual add is fused into the following norm."""
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, kv_cache, meta)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig, rotary: RotaryEmbedding, ops: KernelOps) -> None:
        super().__init__()
        self.embed_tokens = VocabEmbedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, rotary, ops) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, ops)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids), None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            hidden, residual = layer(positions, hidden, residual, kv_cache, meta)
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
    ) -> None:
        super().__init__()
        self.config = config
        rotary = RotaryEmbedding(
            config.head_dim,
            max_positions or config.max_position_embeddings,
            config.rope_theta,
            config.rope_scaling,
            device=rope_device,
        )
        self.model = LlamaModel(config, rotary, ops)
        self.lm_head = LMHead(config.vocab_size, config.hidden_size, ops)

    def tie_weights(self) -> None:
        """Share the embedding with the LM head (tie_word_embeddings); call after materialising."""
        self.lm_head.tie_to(self.model.embed_tokens)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        return self.model(input_ids, positions, kv_caches, meta)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
