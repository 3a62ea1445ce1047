"""The benchmark's workloads (DESIGN.md W1-W4 and variants) on real model shapes, their model directories
(real config.json + the fixture tokenizer, random weights at load) and their physical floors."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpilot.contracts.kv_cache import kv_bytes_per_token

HBM_BYTES_PER_S = 4.25e12  # device-to-device copy measured on the H200 (DESIGN.md)
# Bytes per decoder-layer weight as the runtime holds it (--quantization); embedding and LM head stay 16-bit.
WEIGHT_BYTES = {"none": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5 + 4 / 128}
BF16_FLOPS = 784e12  # bf16 matmul measured on the H200

SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": dict(
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
    ),
    "qwen3-8b": dict(
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=151936,
        tie_word_embeddings=False,
        max_position_embeddings=40960,
    ),
}


@dataclass(frozen=True)
class Workload:
    name: str
    shape: str
    num_seqs: int
    input_len: tuple[int, int]
    output_len: tuple[int, int]
    measure: str  # "throughput" | "tpot" | "ttft"


WORKLOADS = {
    "W1": Workload("W1", "qwen3-0.6b", 256, (100, 1024), (100, 1024), "throughput"),
    "W2": Workload("W2", "qwen3-8b", 256, (100, 1024), (256, 256), "throughput"),
    "W3": Workload("W3", "qwen3-8b", 1, (1024, 1024), (256, 256), "tpot"),
    "W4": Workload("W4", "qwen3-8b", 1, (1024, 1024), (1, 1), "ttft"),
    # long context: the KV cache, not the weights, is most of what a decode step reads
    "W2L": Workload("W2L", "qwen3-8b", 64, (8192, 8192), (256, 256), "throughput"),
}


def qwen3_config(shape: str) -> dict[str, Any]:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        **SHAPES[shape],
    }


def write_model_dir(root: Path, shape: str) -> Path:
    """config.json of the real shape + the fixture tokenizer (ids are fed directly, text is never needed)."""
    from kvpilot.runtime.fixtures import make_tiny_checkpoint

    tiny = make_tiny_checkpoint(root / "tiny", "qwen3")
    out = root / shape
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (out / name).write_bytes((tiny / name).read_bytes())
    (out / "config.json").write_text(json.dumps(qwen3_config(shape)))
    return out


def make_requests(w: Workload, vocab: int, seed: int) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    reqs = []
    for _ in range(w.num_seqs):
        n_in = rng.randint(*w.input_len)
        reqs.append(([rng.randrange(1000, vocab - 1000) for _ in range(n_in)], rng.randint(*w.output_len)))
    return reqs


def param_count(c: dict[str, Any]) -> int:
    h, i, layers, v = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    q, kv = c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * i
    return layers * per_layer + v * h * (1 if c["tie_word_embeddings"] else 2)


def physical_floor_s(
    w: Workload, reqs: list[tuple[list[int], int]], kv_cache_dtype: str = "bf16", quantization: str = "none"
) -> float:
    """Prefill FLOPs at the matmul rate + every decode step streaming the weights and each sequence's KV.

    A decode step reads every layer weight and the LM head, but only a few rows of an untied input
    embedding; prefill multiplies each prompt token by the layer weights and only the last by the LM head.
    """
    c = qwen3_config(w.shape)
    embed = c["vocab_size"] * c["hidden_size"]
    layers = param_count(c) - embed * (1 if c["tie_word_embeddings"] else 2)
    streamed_bytes = WEIGHT_BYTES[quantization] * layers + 2 * embed
    kv_per_token = kv_bytes_per_token(
        num_layers=c["num_hidden_layers"],
        num_kv_heads=c["num_key_value_heads"],
        head_dim=c["head_dim"],
        kv_dtype=kv_cache_dtype,
    )
    attn_per_pair = 4 * c["num_hidden_layers"] * c["num_attention_heads"] * c["head_dim"]  # QK^T and PV
    prefill_flops = sum(2 * layers * len(p) + 2 * embed + attn_per_pair * len(p) ** 2 / 2 for p, _ in reqs)
    decode_steps = max(o for _, o in reqs) - 1 if w.measure != "ttft" else 0
    kv_read = sum(kv_per_token * (len(p) * (o - 1) + (o - 1) * o // 2) for p, o in reqs)
    return prefill_flops / BF16_FLOPS + (decode_steps * streamed_bytes + kv_read) / HBM_BYTES_PER_S
