"""What the runtime build can run: the planner plans only within it, and the runtime refuses the rest.

One table, so `Planned=True` means runnable. The quantization, 8-bit-KV and parallelism work grows it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RuntimeCapabilities:
    weight_quantizations: frozenset[str]  # the operator's names: none, fp8, int8, int4, awq, gptq
    kv_cache_dtypes: frozenset[str]  # the operator's names: bf16, fp16, fp8, int8
    max_tensor_parallel: int
    max_pipeline_parallel: int
    # config.json `architectures` the runtime loads (Hugging Face class names); None: any
    architectures: frozenset[str] | None = None
    # whether quantized weights run split across tensor/pipeline-parallel ranks (else on one GPU only)
    quantized_parallel: bool = True
    # whether speculative decoding runs with tensor/pipeline parallel > 1 (else on one GPU only)
    speculative_parallel: bool = True

    def unsupported(
        self, *, quantization: str, kv_cache_dtype: str, tensor_parallel: int, pipeline_parallel: int
    ) -> list[str]:
        """Why a plan cannot run on this runtime (empty when it can)."""
        return list(
            self.unsupported_by_setting(
                quantization=quantization,
                kv_cache_dtype=kv_cache_dtype,
                tensor_parallel=tensor_parallel,
                pipeline_parallel=pipeline_parallel,
            ).values()
        )

    def unsupported_by_setting(
        self, *, quantization: str, kv_cache_dtype: str, tensor_parallel: int, pipeline_parallel: int
    ) -> dict[str, str]:
        """The same reasons, keyed by the setting that has them (the keyword names above)."""
        problems = {}
        if quantization not in self.weight_quantizations:
            problems["quantization"] = (
                f"{quantization} weights (the runtime serves {_names(self.weight_quantizations)})"
            )
        elif (
            quantization != "none" and tensor_parallel * pipeline_parallel > 1 and not self.quantized_parallel
        ):
            problems["quantization"] = (
                f"{quantization} weights split over tensor parallel {tensor_parallel} x pipeline parallel "
                f"{pipeline_parallel} (quantized weights run on one GPU)"
            )
        if kv_cache_dtype not in self.kv_cache_dtypes:
            problems["kv_cache_dtype"] = (
                f"a {kv_cache_dtype} KV cache (the runtime has {_names(self.kv_cache_dtypes)})"
            )
        if tensor_parallel > self.max_tensor_parallel:
            problems["tensor_parallel"] = (
                f"tensor parallel {tensor_parallel} (the runtime runs up to {self.max_tensor_parallel})"
            )
        if pipeline_parallel > self.max_pipeline_parallel:
            problems["pipeline_parallel"] = (
                f"pipeline parallel {pipeline_parallel} (the runtime runs up to {self.max_pipeline_parallel})"
            )
        return problems

    def serves_architecture(self, names: Sequence[str]) -> bool:
        """Whether a model whose config.json lists these architectures loads (unknown: assumed so)."""
        return self.architectures is None or not names or any(n in self.architectures for n in names)

    def supports(
        self, *, quantization: str, kv_cache_dtype: str, tensor_parallel: int, pipeline_parallel: int
    ) -> bool:
        return not self.unsupported(
            quantization=quantization,
            kv_cache_dtype=kv_cache_dtype,
            tensor_parallel=tensor_parallel,
            pipeline_parallel=pipeline_parallel,
        )


def _names(values: frozenset[str]) -> str:
    return ", ".join(sorted(values))


# This build: Llama/Qwen2/Qwen3-family models; 16-bit weights, or quantized ones (AWQ and GPTQ checkpoints,
# fp8 checkpoints, or int8/int4/fp8 quantized at load) on one device; a 16-bit KV cache, or an 8-bit one (fp8
# e4m3 or int8) with per-token-head scales; tensor parallel within a node (up to 8 GPUs) and pipeline
# stages across nodes (a LeaderWorkerSet group), for 16-bit and quantized weights alike (quantized_parallel:
# each rank loads its slice of the packed tensors).
RUNTIME = RuntimeCapabilities(
    weight_quantizations=frozenset({"none", "fp8", "int8", "int4", "awq", "gptq"}),
    kv_cache_dtypes=frozenset({"bf16", "fp16", "fp8", "int8"}),
    max_tensor_parallel=8,
    max_pipeline_parallel=8,
    architectures=frozenset({"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}),
    quantized_parallel=True,
    speculative_parallel=False,
)
# Everything the planner knows how to reason about: its decision table is tested against this one.
EVERYTHING = RuntimeCapabilities(
    weight_quantizations=frozenset({"none", "fp8", "int8", "int4", "awq", "gptq"}),
    kv_cache_dtypes=frozenset({"bf16", "fp16", "fp8", "int8"}),
    max_tensor_parallel=1 << 16,
    max_pipeline_parallel=1 << 16,
)
