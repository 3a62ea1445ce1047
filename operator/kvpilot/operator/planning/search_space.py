"""The planner's search space: which layouts (tp x pp), weight formats and KV dtypes a request allows
within the runtime's capabilities, and the workload with its defaults. Pure functions of the request;
a request that contradicts itself or the runtime raises PlanningError with the reason."""

from __future__ import annotations

import math

from kvpilot.contracts.capabilities import RuntimeCapabilities
from kvpilot.operator.planning import reasons
from kvpilot.operator.planning.model_facts import ModelFacts
from kvpilot.operator.planning.request import PlanningError, PlanRequest, ResolvedWorkload

DEFAULT_MAX_MODEL_LEN = 8192
DEFAULT_TARGET_SEQS = 32
DEFAULT_MAX_SEQS = 256
LOAD_TIME_FORMATS = ("none", "fp8", "int8", "int4")  # what a 16-bit checkpoint can become at load
EIGHT_BIT_KV = "int8"  # what the planner picks when a 16-bit cache cannot reach the target
CHECKPOINT_FORMATS = {"awq": "AWQ", "gptq": "GPTQ"}  # need their own pre-quantized checkpoint


def runs_split(capabilities: RuntimeCapabilities, quantization: str, tp: int, pp: int) -> bool:
    """Whether weights of this format run over tp x pp GPUs (quantized ones may be one-GPU only)."""
    return capabilities.quantized_parallel or quantization == "none" or tp * pp == 1


def layout_groups(
    single: list[tuple[int, int]], multi: list[tuple[int, int]], count_given: bool
) -> list[list[tuple[int, int]]]:
    """Layouts in the order they are tried: without spec.gpu.count one GPU count at a time (fewest first),
    with it all single-node layouts together; multi-node layouts only after every single-node one."""
    if count_given:
        return [group for group in (single, multi) if group]
    return [[layout] for layout in sorted(single + multi, key=lambda lay: (lay[1] > 1, lay[0] * lay[1]))]


def check_architecture(request: PlanRequest) -> None:
    caps, names = request.capabilities, request.facts.architectures
    if not caps.serves_architecture(names):
        raise PlanningError(
            f"the model is a {'/'.join(names)} (config.json architectures) and this runtime loads "
            f"{reasons.or_list(caps.architectures or ())}"
        )


def resolve_workload(request: PlanRequest) -> ResolvedWorkload:
    positions = request.facts.max_positions
    max_len = request.max_model_len or min(DEFAULT_MAX_MODEL_LEN, positions)
    if max_len > positions:
        raise PlanningError(
            f"workload.maxModelLen {max_len} exceeds the model's max_position_embeddings {positions}"
        )
    avg = min(request.avg_context_len or max(1, max_len // 4), max_len)
    target = request.concurrency or DEFAULT_TARGET_SEQS
    max_seqs = request.concurrency or DEFAULT_MAX_SEQS
    ridge = request.profile.ridge_tokens
    batched = min(max(2 ** math.ceil(math.log2(8 * ridge)), 2048), 16384)
    return ResolvedWorkload(max_len, avg, target, max_seqs, max(batched, max_seqs))


def allowed_quantizations(request: PlanRequest) -> list[str]:
    """Weight formats to consider, best first (only those the runtime serves)."""
    facts, profile, pinned = request.facts, request.profile, request.quantization
    served = request.capabilities.weight_quantizations
    if facts.prequantized:
        if pinned not in ("auto", facts.prequantized):
            raise PlanningError(
                f"spec.quantization is {pinned} but the checkpoint is {facts.prequantized}"
                " (config.json quantization_config); use auto or "
                f"{facts.prequantized}"
            )
        formats = [facts.prequantized]
    elif pinned in CHECKPOINT_FORMATS:
        name = CHECKPOINT_FORMATS[pinned]
        raise PlanningError(
            f"spec.quantization is {pinned} but the checkpoint holds 16-bit weights (no config.json "
            f"quantization_config): {name} weights come from a pre-quantized {name} checkpoint of this "
            f"model; point spec.model at one, or use int4 (quantized at load) or auto"
        )
    elif pinned == "auto":
        formats = [q for q in LOAD_TIME_FORMATS if q != "fp8" or profile.fp8]
    else:
        formats = [pinned]
    if "fp8" in formats and not profile.fp8:
        # a pre-quantized fp8 checkpoint cannot become int8/int4 at load: a GPU with fp8 or the 16-bit model
        remedy = (
            "serve it on a GPU profile with fp8, or point spec.model at this model's 16-bit checkpoint "
            "(quantized at load to int8 or int4)"
            if facts.prequantized
            else "use int8, int4 or auto"
        )
        raise PlanningError(
            f"fp8 weights need fp8 tensor cores (Ada or Hopper); {profile.name} has none: {remedy}"
        )
    if facts.prequantized and facts.prequantized not in served:
        raise PlanningError(
            f"the checkpoint is {facts.prequantized}-quantized (config.json quantization_config) and this "
            f"runtime serves {reasons.weights_served(served)}: use an unquantized checkpoint"
        )
    if pinned != "auto" and pinned not in served:
        raise PlanningError(
            f"spec.quantization is {pinned} and this runtime serves {reasons.weights_served(served)}: "
            "use auto"
        )
    return [q for q in formats if q in served]


def allowed_kv_dtypes(request: PlanRequest) -> list[str]:
    """KV-cache dtypes to consider, best first (only those the runtime has)."""
    served = request.capabilities.kv_cache_dtypes
    if request.kv_cache_dtype != "auto":
        if request.kv_cache_dtype not in served:
            raise PlanningError(
                f"spec.kvCacheDtype is {request.kv_cache_dtype} and this runtime has a "
                f"{reasons.or_list(served)} KV cache: use auto"
            )
        return [request.kv_cache_dtype]
    # The 8-bit cache is int8 on every GPU, fp8 only when pinned: with per-token-head scales int8 costs
    # +0.07% perplexity against fp8's +0.35% on SmolLM2, keeps every passkey answer where fp8 changes 9-14%
    # (BENCHMARKS.md), holds the same tokens and decodes at least as fast.
    kinds = [kv for kv in (request.facts.dtype, EIGHT_BIT_KV) if kv in served]
    if not kinds:
        raise PlanningError(
            f"this runtime has a {reasons.or_list(served)} KV cache, none of which suits "
            f"{request.facts.dtype} weights on {request.profile.name}"
        )
    return kinds


def tensor_degrees(facts: ModelFacts, limit: int) -> list[int]:
    """Powers of two dividing both the attention and the KV heads, up to limit."""
    out, tp = [], 1
    while tp <= limit:
        if facts.num_heads % tp == 0 and facts.num_kv_heads % tp == 0:
            out.append(tp)
        tp *= 2
    return out


def layouts(request: PlanRequest) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(single-node layouts, multi-node layouts) as (tp, pp); multi-node only through pipeline stages."""
    facts, per_node, count = request.facts, request.profile.gpus_per_node, request.gpu_count
    max_tp, max_pp = request.capabilities.max_tensor_parallel, request.capabilities.max_pipeline_parallel
    valid = tensor_degrees(facts, per_node)
    if isinstance(request.tensor, int):
        if request.tensor not in valid:
            raise PlanningError(
                f"parallelism.tensor {request.tensor} must be a power of two dividing "
                f"{facts.num_heads} attention heads and {facts.num_kv_heads} KV heads, at "
                f"most {per_node} ({request.profile.name} GPUs per node)"
            )
        if request.tensor > max_tp:
            raise PlanningError(
                f"parallelism.tensor is {request.tensor} and this runtime runs tensor parallel up to {max_tp}"
            )
        valid = [request.tensor]
    valid = [tp for tp in valid if tp <= max_tp]
    pinned_pp = request.pipeline if isinstance(request.pipeline, int) else None
    if pinned_pp is not None and pinned_pp > facts.num_layers:
        raise PlanningError(f"parallelism.pipeline {pinned_pp} exceeds the model's {facts.num_layers} layers")
    if pinned_pp is not None and pinned_pp > max_pp:
        raise PlanningError(
            f"parallelism.pipeline is {pinned_pp} and this runtime runs pipeline parallel up to {max_pp}"
        )
    single = [(tp, 1) for tp in valid if tp <= (count or per_node)] if pinned_pp in (None, 1) else []
    if pinned_pp not in (None, 1):
        multi = [(tp, pinned_pp) for tp in valid]
    elif pinned_pp is None and count and count > per_node:
        stages = min(count // valid[-1], facts.num_layers, max_pp)
        multi = [(valid[-1], pp) for pp in range(2, stages + 1)]
    else:
        multi = []
    if count:
        multi = [(tp, pp) for tp, pp in multi if tp * pp <= count]
    if not single and not multi:
        raise PlanningError(
            f"spec.gpu.count {count} allows no layout: parallelism.tensor "
            f"{request.tensor} x pipeline {request.pipeline} needs more GPUs"
        )
    return single, multi
