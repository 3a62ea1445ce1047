"""The runner's setup, resolved from its arguments: device, dtypes, and the KV cache's bytes per block
(the operator's sizing uses the same formula). Pure functions of their inputs; the runner calls them."""

from __future__ import annotations

import torch
from kvpilot.contracts.kv_cache import canonical_kv_dtype, kv_bytes_per_token
from kvpilot.runtime.config import ModelConfig
from kvpilot.runtime.distributed.topology import Rank, stage_layers
from kvpilot.runtime.errors import ModelLoadError

_DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp16": torch.float16,
}
# canonical KV-cache dtype names (kvpilot.contracts.kv_cache) <-> torch dtypes
_KV_DTYPES = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8": torch.float8_e4m3fn,
    "int8": torch.int8,
}
_KV_DTYPE_NAMES = {dtype: name for name, dtype in _KV_DTYPES.items()}


def kv_dtype_name(dtype: torch.dtype) -> str:
    """torch.float8_e4m3fn -> 'fp8' (kvpilot.contracts.kv_cache's names)."""
    return _KV_DTYPE_NAMES[dtype]


CPU_KV_CACHE_BYTES = 1 << 30  # CPU default: at most 1 GiB of KV cache ...
CPU_KV_CACHE_SEQS = 8  # ... and no more than 8 sequences of max_model_len tokens


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r} requested but no CUDA GPU is available")
    if device != "cpu" and not device.startswith("cuda"):
        raise ModelLoadError(f"unknown device {device!r}; use auto, cpu or cuda")
    return torch.device(device)


def resolve_dtype(dtype: str, config: ModelConfig, device: torch.device) -> torch.dtype:
    """'auto' is float32 on CPU (exact against references) and the checkpoint's 16-bit type (else bf16)
    on CUDA."""
    if dtype == "auto":
        if device.type == "cpu":
            return torch.float32
        native = _DTYPES.get(config.torch_dtype, torch.bfloat16)
        return native if native in (torch.bfloat16, torch.float16) else torch.bfloat16
    if dtype not in _DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use auto, {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def resolve_kv_cache_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """'auto' is the model's dtype; fp8 (fp8_e4m3) and int8 are 8-bit caches with per-token-head scales
    (kernels/kv_cache.py). EngineArgs.validate() has refused what this build cannot store."""
    name = canonical_kv_dtype(kv_cache_dtype)
    return model_dtype if name == "auto" else _KV_DTYPES[name]


def kv_block_bytes(config: ModelConfig, block_size: int, kv_dtype: torch.dtype, rank: Rank = Rank(0)) -> int:
    """Bytes of K and V for one block across the rank's layers (its pipeline stage) and KV heads, 8-bit
    caches' scales included: the operator's sizing uses the same formula (for the busiest rank), and
    _allocate_kv_cache allocates exactly this."""
    per_token = kv_bytes_per_token(
        num_layers=len(stage_layers(config.num_hidden_layers, rank.pp, rank.pp_rank)),
        num_kv_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        kv_dtype=_KV_DTYPE_NAMES[kv_dtype],
        tensor_parallel=rank.tp,
    )
    return block_size * per_token


def cpu_num_kv_blocks(*, block_bytes: int, block_size: int, max_model_len: int) -> int:
    """A modest CPU cache: at most CPU_KV_CACHE_BYTES and CPU_KV_CACHE_SEQS sequences, at least one.
    (On CUDA the cache is sized by profiling the worst step: see memory.py.)"""
    blocks_per_seq = -(-max_model_len // block_size)
    by_bytes = CPU_KV_CACHE_BYTES // block_bytes
    return max(blocks_per_seq, min(by_bytes, CPU_KV_CACHE_SEQS * blocks_per_seq))
