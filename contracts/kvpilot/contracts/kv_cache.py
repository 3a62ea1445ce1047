"""KV-cache arithmetic shared by the operator's sizing and the runtime's allocation (one formula)."""

from __future__ import annotations

import math

# bytes of one stored K or V element, by the runtime's KV-cache dtype names (vLLM's)
KV_ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp8_e4m3": 1, "int8": 1}
# 8-bit caches keep one fp32 scale per (token, layer, K/V, KV head) beside the values
SCALED_KV_DTYPES = frozenset({"fp8", "fp8_e4m3", "int8"})
SCALE_BYTES = 4
# the runtime's KV-cache dtype names (vLLM's and torch's aliases) -> the names above
KV_DTYPE_ALIASES = {
    "float32": "fp32",
    "fp32": "fp32",
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "fp16": "fp16",
    "half": "fp16",
    "fp8": "fp8",
    "fp8_e4m3": "fp8",
    "int8": "int8",
}


def canonical_kv_dtype(name: str) -> str:
    """'bfloat16' -> 'bf16', 'fp8_e4m3' -> 'fp8', ...; 'auto' stays 'auto'."""
    if name == "auto":
        return name
    if name not in KV_DTYPE_ALIASES:
        raise ValueError(f"unknown KV-cache dtype {name!r}; known: auto, {', '.join(KV_DTYPE_ALIASES)}")
    return KV_DTYPE_ALIASES[name]


def kv_heads_per_rank(num_kv_heads: int, tensor_parallel: int) -> int:
    """KV heads each tensor-parallel rank holds: split across ranks, replicated when there are fewer
    heads than ranks (as vLLM does)."""
    return max(1, num_kv_heads // tensor_parallel)


def kv_bytes_per_token(
    *,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    kv_dtype: str,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
) -> int:
    """KV bytes one token takes on the busiest GPU (the whole model when tp = pp = 1)."""
    if kv_dtype not in KV_ELEMENT_BYTES:
        raise ValueError(f"unknown KV-cache dtype {kv_dtype!r}; known: {', '.join(KV_ELEMENT_BYTES)}")
    layers = math.ceil(num_layers / pipeline_parallel)
    vectors = 2 * layers * kv_heads_per_rank(num_kv_heads, tensor_parallel)
    scale = SCALE_BYTES if kv_dtype in SCALED_KV_DTYPES else 0
    return vectors * (head_dim * KV_ELEMENT_BYTES[kv_dtype] + scale)
