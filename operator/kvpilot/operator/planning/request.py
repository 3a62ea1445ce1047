"""What a plan is asked for: the model, the GPU profile, the spec's workload and pins, the runtime's
capabilities (PlanRequest), and the workload with its defaults filled in (ResolvedWorkload)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvpilot.contracts.capabilities import RUNTIME, RuntimeCapabilities
from kvpilot.operator.planning.model_facts import ModelFacts
from kvpilot.operator.planning.profiles import GpuProfile
from kvpilot.operator.spec import InferenceServiceSpec


class PlanningError(ValueError):
    """The request contradicts itself or the model (e.g. a pinned fp8 on a GPU without fp8)."""


@dataclass(frozen=True)
class PlanRequest:
    facts: ModelFacts
    profile: GpuProfile
    max_model_len: int | None = None
    concurrency: int | None = None
    avg_context_len: int | None = None
    quantization: str = "auto"
    kv_cache_dtype: str = "auto"
    tensor: int | str = "auto"
    pipeline: int | str = "auto"
    gpu_count: int | None = None
    capabilities: RuntimeCapabilities = RUNTIME  # what the runtime can run: nothing outside is planned
    # spec.speculative.draftModel: its 16-bit weights and its KV cache (as many tokens as the target's,
    # same KV dtype) sit whole on every GPU of the replica, beside the target's share
    draft: ModelFacts | None = None

    @classmethod
    def from_spec(
        cls,
        spec: InferenceServiceSpec,
        facts: ModelFacts,
        profile: GpuProfile,
        capabilities: RuntimeCapabilities = RUNTIME,
        draft: ModelFacts | None = None,
    ) -> PlanRequest:
        w = spec.workload
        if spec.speculative is not None and not capabilities.speculative_parallel:
            # the runtime refuses --speculative-config with tp/pp > 1: plan one GPU per replica
            capabilities = replace(capabilities, max_tensor_parallel=1, max_pipeline_parallel=1)
        return cls(
            facts,
            profile,
            w.max_model_len,
            w.concurrency,
            w.avg_context_len,
            spec.quantization,
            spec.kv_cache_dtype,
            spec.parallelism.tensor,
            spec.parallelism.pipeline,
            spec.gpu.count,
            capabilities,
            draft,
        )


@dataclass(frozen=True)
class ResolvedWorkload:
    """spec.workload with the defaults filled in (the spec's own Workload is spec.Workload)."""

    max_model_len: int
    avg_context_len: int
    target_seqs: int  # concurrency the choice tries to reach
    max_seqs: int  # the most sequences batched at once
    batched_tokens: int
