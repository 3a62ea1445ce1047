"""Plan: what the operator decided for one InferenceService, with a one-line reason per choice."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Plan attribute -> status.plan key (also the JSON of `kvpilot plan -o json`).
STATUS_KEYS = {
    "feasible": "feasible",
    "gpu_profile": "gpuProfile",
    "gpus": "gpus",
    "quantization": "quantization",
    "kv_cache_dtype": "kvCacheDtype",
    "tensor_parallel": "tensorParallel",
    "pipeline_parallel": "pipelineParallel",
    "max_num_seqs": "maxNumSeqs",
    "max_model_len": "maxModelLen",
    "max_num_batched_tokens": "maxNumBatchedTokens",
    "weight_bytes": "weightBytes",
    "kv_bytes_per_token": "kvBytesPerToken",
    "kv_cache_tokens": "kvCacheTokens",
    "gpu_memory_utilization": "gpuMemoryUtilization",
    "reason": "reason",
    "reasons": "reasons",
}


@dataclass(frozen=True)
class Plan:
    """A feasible plan has every number; an infeasible one says in `reason` what was needed and available.

    weight_bytes and kv_bytes_per_token are for the whole model (one replica), the rest per replica
    except kv_cache_tokens, which every GPU of the replica holds (they split heads and layers).
    """

    feasible: bool
    gpu_profile: str
    reason: str
    gpus: int = 0
    quantization: str = ""
    kv_cache_dtype: str = ""
    tensor_parallel: int = 0
    pipeline_parallel: int = 0
    max_num_seqs: int = 0
    max_model_len: int = 0
    max_num_batched_tokens: int = 0
    weight_bytes: int = 0
    kv_bytes_per_token: int = 0
    kv_cache_tokens: int = 0
    gpu_memory_utilization: float = 0.0
    reasons: dict[str, str] = field(default_factory=dict)
    # Infeasible only: what the plan that would fit needs and this runtime can't run (not in status.plan).
    needs: tuple[str, ...] = ()

    def to_status(self) -> dict[str, Any]:
        """status.plan: camelCase keys; an infeasible plan keeps only what it knows."""
        out = {key: getattr(self, attr) for attr, key in STATUS_KEYS.items()}
        if not self.feasible:
            out = {k: v for k, v in out.items() if v or k in ("feasible", "reason")}
        return out

    @property
    def summary(self) -> str:
        """Short form for the printer column, e.g. `2xrtx4090 tp2 awq kv:bf16 8seq`."""
        if not self.feasible:
            return "infeasible"
        stages = f" pp{self.pipeline_parallel}" if self.pipeline_parallel > 1 else ""
        return (
            f"{self.gpus}x{self.gpu_profile} tp{self.tensor_parallel}{stages} {self.quantization} "
            f"kv:{self.kv_cache_dtype} {self.max_num_seqs}seq"
        )
