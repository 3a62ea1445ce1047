"""Byte arithmetic: parameters, weight bytes per format, KV bytes per token, workspace per GPU.

Pure functions of ModelFacts and plain numbers. Conventions:
- 16-bit weights: 2 bytes each. Embedding, lm_head, norms and MoE routers always stay 16-bit.
- fp8 / int8 weights: 1 byte each + 4 bytes per output channel (fp8: an fp32 scale; int8: a 16-bit
  scale and zero point).
- int4 (quantized at load), AWQ and GPTQ: `bits` / 8 bytes each (4, or 8 for 8-bit GPTQ, from the
  checkpoint's config) + per group of `group_size` weights a 16-bit scale and a 16-bit zero point: the
  runtime's kernel layout, which every integer format is repacked into at load.
- KV cache: kvpilot.contracts.kv_cache.kv_bytes_per_token, the one formula the runtime allocates by too
  (2 (K and V) x layers x kv_heads x head_dim elements per token; 8-bit KV adds one fp32 scale per
  (token, layer, K/V, kv head)).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvpilot.contracts import kv_cache
from kvpilot.operator.planning.model_facts import ModelFacts

MIB = 1024**2
GIB = 1024**3
BLOCK_SIZE = 16
SCALE_BYTES = 4  # one fp32 scale (per output channel of an 8-bit matmul; per group index in GPTQ)
# Per GPU, outside weights, KV and activations: CUDA context + cuBLAS workspace + allocator slack,
# CUDA graphs of the decode buckets, and NCCL buffers when the GPU talks to others.
CONTEXT_BYTES = 768 * MIB
CUDA_GRAPH_BYTES = 256 * MIB
NCCL_BYTES = 256 * MIB


@dataclass(frozen=True)
class ParamCounts:
    """Parameters by how they are stored; *_linear are the quantizable matmul weights."""

    layer_linear: int  # all decoder layers together
    layer_other: int  # norms, biases, routers (16-bit)
    embedding: int
    lm_head: int  # 0 when tied to the embedding
    out_channels: int  # output channels of all quantizable matmuls (scales are per output channel)
    in_channels: int  # input channels of all quantizable matmuls (GPTQ group index)

    @property
    def total(self) -> int:
        return self.layer_linear + self.layer_other + self.embedding + self.lm_head


def param_counts(facts: ModelFacts) -> ParamCounts:
    h, hd, layers = facts.hidden_size, facts.head_dim, facts.num_layers
    q, kv = facts.num_heads * hd, facts.num_kv_heads * hd
    attn = h * (q + 2 * kv) + q * h
    attn_out, attn_in = q + 2 * kv + h, 3 * h + q
    mats = 3 if facts.gated_mlp else 2
    dense = (
        mats * h * facts.intermediate_size,
        (mats - 1) * facts.intermediate_size + h,
        (mats - 1) * h + facts.intermediate_size,
    )
    moe_layers = layers - facts.dense_layers if facts.num_experts else 0
    moe = _moe_layer(facts)
    linear = layers * attn + (layers - moe_layers) * dense[0] + moe_layers * moe[0]
    out_ch = layers * attn_out + (layers - moe_layers) * dense[1] + moe_layers * moe[1]
    in_ch = layers * attn_in + (layers - moe_layers) * dense[2] + moe_layers * moe[2]
    bias = (q + 2 * kv) if facts.attention_bias else 0
    router = h * facts.num_experts
    other = layers * (2 * h + bias) + moe_layers * router + h
    embedding = facts.vocab_size * h
    return ParamCounts(linear, other, embedding, 0 if facts.tie_embeddings else embedding, out_ch, in_ch)


def _moe_layer(facts: ModelFacts) -> tuple[int, int, int]:
    """(weights, output channels, input channels) of one MoE MLP: routed experts + shared expert."""
    h, experts = facts.hidden_size, facts.num_experts
    sizes = [facts.moe_intermediate_size] * experts
    if facts.shared_expert_intermediate_size:
        sizes.append(facts.shared_expert_intermediate_size)
    weights = sum(3 * h * size for size in sizes)
    return weights, sum(2 * size + h for size in sizes), sum(2 * h + size for size in sizes)


def linear_bytes(params: ParamCounts, quantization: str, group_size: int = 128, bits: int = 4) -> int:
    """Bytes of the quantizable matmul weights in the given format (bits: of an AWQ/GPTQ checkpoint)."""
    n = params.layer_linear
    if quantization == "none":
        return 2 * n
    if quantization in ("fp8", "int8"):
        return n + SCALE_BYTES * params.out_channels
    if quantization in ("int4", "awq", "gptq"):
        bits = 4 if quantization == "int4" else bits
        groups = math.ceil(n / (group_size if group_size > 0 else 4096))  # -1: one group per row (~4k)
        return n * bits // 8 + groups * 4
    raise ValueError(f"unknown quantization {quantization!r}")


def weight_bytes(facts: ModelFacts, quantization: str) -> int:
    """All weights of the model in the given format (what one replica holds in total)."""
    params = param_counts(facts)
    return linear_bytes(params, quantization, facts.quant_group_size, facts.quant_bits) + 2 * (
        params.layer_other + params.embedding + params.lm_head
    )


def weight_bytes_per_gpu(facts: ModelFacts, quantization: str, tp: int, pp: int) -> int:
    """Weights on the busiest GPU: matmuls and vocabulary split over tp; layers split over pp stages.

    With pp > 1 the first stage holds the embedding and the last the lm_head (a copy of the embedding when
    tied), so the busiest stage holds ceil(layers / pp) layers plus one vocabulary matrix.
    """
    params = param_counts(facts)
    layers = facts.num_layers
    stage_layers = math.ceil(layers / pp)
    layer_bytes = (
        linear_bytes(params, quantization, facts.quant_group_size, facts.quant_bits) + 2 * params.layer_other
    )
    vocab = 2 * params.embedding * (1 if pp > 1 else (2 if params.lm_head else 1))
    return math.ceil((layer_bytes * stage_layers / layers + vocab) / tp)


def kv_bytes_per_token(facts: ModelFacts, kv_dtype: str, tp: int = 1, pp: int = 1) -> int:
    """KV cache bytes one token takes on the busiest GPU (whole model: tp = pp = 1)."""
    return kv_cache.kv_bytes_per_token(
        num_layers=facts.num_layers,
        num_kv_heads=facts.num_kv_heads,
        head_dim=facts.head_dim,
        kv_dtype=kv_dtype,
        tensor_parallel=tp,
        pipeline_parallel=pp,
    )


def workspace_bytes(facts: ModelFacts, tp: int, pp: int, batched_tokens: int, max_seqs: int) -> int:
    """Per-GPU memory besides weights and KV: fixed runtime overhead plus peak activations of one step."""
    h = facts.hidden_size
    intermediate = facts.intermediate_size
    if facts.num_experts:
        intermediate = max(
            intermediate,
            facts.experts_per_token * facts.moe_intermediate_size + facts.shared_expert_intermediate_size,
        )
    qkv = (facts.num_heads + 2 * facts.num_kv_heads) * facts.head_dim
    per_token = 2 * (4 * h + qkv // tp + 2 * intermediate // tp)
    logits = 4 * max_seqs * facts.vocab_size
    comms = NCCL_BYTES if tp * pp > 1 else 0
    return CONTEXT_BYTES + CUDA_GRAPH_BYTES + comms + batched_tokens * per_token + logits


def kv_cache_tokens(free_bytes: int, per_token: int) -> int:
    """Tokens that fit in free_bytes, in whole blocks of BLOCK_SIZE tokens."""
    if free_bytes <= 0:
        return 0
    return (free_bytes // per_token) // BLOCK_SIZE * BLOCK_SIZE


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"
