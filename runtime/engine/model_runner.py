"""The model runner: the only part of the engine that touches the device.

execute(StepBatch) flattens the step's prefill chunks and decodes into one varlen batch, writes their K/V
into the paged cache, attends over it and returns the logits of the rows that will be sampled.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from kvpilot.runtime.config import ModelConfig
from kvpilot.runtime.engine.batch import StepBatch
from kvpilot.runtime.errors import ModelLoadError, UnsupportedModelError
from kvpilot.runtime.layers.attention import AttentionMetadata
from kvpilot.runtime.loader import load_model

_DTYPES = {
    "float32": torch.float32, "float": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
}
_KV_ONLY_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn}
CPU_KV_CACHE_BYTES = 1 << 30  # CPU default: at most 1 GiB of KV cache ...
CPU_KV_CACHE_SEQS = 8  # ... and no more than 8 sequences of max_model_len tokens
CUDA_ACTIVATION_RESERVE_BYTES = 1 << 30  # kept free for activations when sizing the cache from memory


@dataclass
class ModelInputs:
    input_ids: torch.Tensor  # [num_tokens] int64
    positions: torch.Tensor  # [num_tokens] int64
    meta: AttentionMetadata
    sample_indices: torch.Tensor  # [num_sampled] int64: the rows whose logits are returned, in chunk order


def prepare_inputs(batch: StepBatch, block_size: int, device: torch.device) -> ModelInputs:
    """Flatten a StepBatch: token ids, positions, cache slots, per-sequence lengths, padded block tables."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    cu_seqlens, context_lens, sample_indices = [0], [], []
    for chunk in batch.chunks:
        if len(chunk.block_table) * block_size < chunk.context_len:
            raise ValueError(f"sequence {chunk.seq_id}: block table of {len(chunk.block_table)} blocks "
                             f"cannot hold {chunk.context_len} tokens at block size {block_size}")
        chunk_positions = range(chunk.start_pos, chunk.context_len)
        input_ids.extend(chunk.token_ids)
        positions.extend(chunk_positions)
        slots.extend(chunk.block_table[p // block_size] * block_size + p % block_size
                     for p in chunk_positions)
        cu_seqlens.append(len(input_ids))
        context_lens.append(chunk.context_len)
        if chunk.sample:
            sample_indices.append(len(input_ids) - 1)
    max_blocks = max((len(c.block_table) for c in batch.chunks), default=0)
    tables = [c.block_table + [0] * (max_blocks - len(c.block_table)) for c in batch.chunks]

    def tensor(values: list, dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=device)

    meta = AttentionMetadata(
        slot_mapping=tensor(slots, torch.int64),
        cu_seqlens_q=tensor(cu_seqlens, torch.int32),
        context_lens=tensor(context_lens, torch.int32),
        block_tables=tensor(tables, torch.int32).reshape(len(tables), max_blocks),
        max_q_len=max((len(c.token_ids) for c in batch.chunks), default=0),
        max_context_len=max(context_lens, default=0),
    )
    return ModelInputs(tensor(input_ids, torch.int64), tensor(positions, torch.int64), meta,
                       tensor(sample_indices, torch.int64))


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
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype in _DTYPES:
        return _DTYPES[kv_cache_dtype]
    if kv_cache_dtype in _KV_ONLY_DTYPES:
        return _KV_ONLY_DTYPES[kv_cache_dtype]
    if kv_cache_dtype == "int8":
        raise UnsupportedModelError("kv_cache_dtype 'int8' is not supported yet")
    raise ModelLoadError(f"unknown kv_cache_dtype {kv_cache_dtype!r}")


def kv_block_bytes(config: ModelConfig, block_size: int, kv_dtype: torch.dtype) -> int:
    """Bytes of K and V for one block across all layers."""
    element = torch.empty((), dtype=kv_dtype).element_size()
    return 2 * config.num_hidden_layers * block_size * config.kv_size * element


def default_num_kv_blocks(*, device: torch.device, block_bytes: int, block_size: int, max_model_len: int,
                          gpu_memory_utilization: float) -> int:
    """CPU: a modest cache. CUDA: what fits under gpu_memory_utilization once the weights are loaded."""
    blocks_per_seq = -(-max_model_len // block_size)
    if device.type == "cpu":
        by_bytes = CPU_KV_CACHE_BYTES // block_bytes
        return max(blocks_per_seq, min(by_bytes, CPU_KV_CACHE_SEQS * blocks_per_seq))
    free, total = torch.cuda.mem_get_info(device)
    budget = int(total * gpu_memory_utilization) - (total - free) - CUDA_ACTIVATION_RESERVE_BYTES
    blocks = budget // block_bytes
    if blocks < blocks_per_seq:
        raise ModelLoadError(
            f"not enough GPU memory for the KV cache: {max(budget, 0) / 2**30:.2f} GiB left after the "
            f"weights at gpu_memory_utilization={gpu_memory_utilization}, one sequence of max_model_len="
            f"{max_model_len} needs {blocks_per_seq * block_bytes / 2**30:.2f} GiB")
    return blocks


class ModelRunner:
    def __init__(self, model_dir: str | Path, *, block_size: int = 16, max_model_len: int | None = None,
                 device: str = "auto", dtype: str = "auto", gpu_memory_utilization: float = 0.9,
                 num_kv_blocks: int | None = None, kv_cache_dtype: str = "auto", seed: int = 0,
                 backend: str = "torch", load_format: str = "auto") -> None:
        """backend: "torch" (reference ops) or "triton". load_format: "auto" reads the safetensors,
        "dummy" makes seeded random weights of the same shapes (benchmarks)."""
        if block_size < 1:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.model_config = ModelConfig.from_dir(model_dir)
        self.block_size, self.seed, self.backend = block_size, seed, backend
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.model_config, self.device)
        limit = self.model_config.max_position_embeddings
        if max_model_len is not None and max_model_len > limit:
            raise ModelLoadError(
                f"max_model_len {max_model_len} exceeds the model's max_position_embeddings {limit}")
        self.max_model_len = max_model_len or limit
        self.model = load_model(model_dir, self.model_config, device=self.device, dtype=self.dtype,
                                backend=backend, max_positions=limit, load_format=load_format, seed=seed)
        self.kv_cache_dtype = resolve_kv_cache_dtype(kv_cache_dtype, self.dtype)
        block_bytes = kv_block_bytes(self.model_config, block_size, self.kv_cache_dtype)
        if num_kv_blocks is not None and num_kv_blocks < 1:
            raise ValueError(f"num_kv_blocks must be positive, got {num_kv_blocks}")
        self.num_kv_blocks = num_kv_blocks or default_num_kv_blocks(
            device=self.device, block_bytes=block_bytes, block_size=block_size,
            max_model_len=self.max_model_len, gpu_memory_utilization=gpu_memory_utilization)
        self.kv_caches = self._allocate_kv_cache()

    def _allocate_kv_cache(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One tensor [layers, 2, num_blocks, block_size, kv_heads, head_dim]; per-layer (K, V) views."""
        cfg = self.model_config
        cache = torch.zeros(cfg.num_hidden_layers, 2, self.num_kv_blocks, self.block_size,
                            cfg.num_key_value_heads, cfg.head_dim, dtype=self.kv_cache_dtype,
                            device=self.device)
        return [(cache[layer, 0], cache[layer, 1]) for layer in range(cfg.num_hidden_layers)]

    @torch.inference_mode()
    def execute(self, batch: StepBatch) -> torch.Tensor:
        """Run one step; returns float32 logits [batch.num_sampled, vocab_size] in chunk order."""
        if not batch.chunks:
            return torch.empty(0, self.model_config.vocab_size, device=self.device)
        inputs = prepare_inputs(batch, self.block_size, self.device)
        hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)
        return self.model.compute_logits(hidden[inputs.sample_indices])
