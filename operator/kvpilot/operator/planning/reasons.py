"""One-line human reasons for each planning choice (pure string building over sized candidates)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from kvpilot.operator.planning.sizing import BLOCK_SIZE, gib

if TYPE_CHECKING:
    from kvpilot.contracts.capabilities import RuntimeCapabilities
    from kvpilot.operator.planning.plan import Plan
    from kvpilot.operator.planning.planner import Candidate
    from kvpilot.operator.planning.request import PlanRequest, ResolvedWorkload

FORMAT_NAMES = {
    "none": "16-bit",
    "fp8": "fp8",
    "int8": "int8",
    "int4": "int4",
    "awq": "4-bit AWQ",
    "gptq": "GPTQ",
}
MAX_STAGES_HINT = 16
WEIGHT_FORMATS = ("none", "fp8", "int8", "int4", "awq", "gptq")
AT_LOAD = {
    "fp8": "quantized at load (per-channel weight scales, per-token activations)",
    "int8": "weight-only, quantized at load (per channel)",
    "int4": "weight-only, round-to-nearest at load (group 128)",
}


def format_name(request: PlanRequest, quantization: str) -> str:
    if quantization == "none":
        return f"16-bit ({request.facts.dtype})"
    return FORMAT_NAMES[quantization]


def or_list(values: Iterable[str]) -> str:
    items = sorted(values)
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} or {items[-1]}"


def article(name: str) -> str:
    """`an int8`, `an fp8`, `a bf16` (as spoken)."""
    return "an" if name[:1] in "aefhilmnorsx" else "a"


def and_list(items: list[str] | tuple[str, ...]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def weights_served(formats: Iterable[str]) -> str:
    names = [FORMAT_NAMES.get(q, q) for q in sorted(formats, key=lambda q: (q != "none", q))]
    if names == ["16-bit"]:
        return "16-bit (unquantized) weights"
    return (names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}") + " weights"


def runtime_serves(caps: RuntimeCapabilities) -> str:
    """What the runtime runs, for people: `16-bit (unquantized) weights with a bf16, fp16 or fp8 KV cache,
    on one GPU`."""
    if caps.max_tensor_parallel == 1 and caps.max_pipeline_parallel == 1:
        layout = "on one GPU"
    elif caps.max_pipeline_parallel == 1:
        layout = f"on up to {caps.max_tensor_parallel} GPUs of one node (tensor parallel)"
    else:
        layout = (
            f"with tensor parallel up to {caps.max_tensor_parallel} and pipeline parallel up to "
            f"{caps.max_pipeline_parallel}"
        )
    return (
        f"{weights_served(caps.weight_quantizations)} with a {or_list(caps.kv_cache_dtypes)} KV cache, "
        f"{layout}"
    )


def unsupported(request: PlanRequest, fits: Plan, needs: tuple[str, ...], within: Plan) -> str:
    """Why an InferenceService is not planned although the planner knows a plan that fits: that plan
    needs what this runtime can't run."""
    return (
        f"needs {and_list(needs)}, which this runtime cannot run (it serves "
        f"{runtime_serves(request.capabilities)}); the plan that would fit: {fits.reason}; within this "
        f"runtime: {within.reason}"
    )


def feasible_reasons(
    request: PlanRequest,
    workload: ResolvedWorkload,
    chosen: Candidate,
    meets: bool,
    alternatives: list[Candidate],
) -> dict[str, str]:
    same_layout = [c for c in alternatives if (c.tp, c.pp) == (chosen.tp, chosen.pp)]
    return {
        "quantization": quantization(request, workload, chosen, same_layout, meets),
        "kvCacheDtype": kv_dtype(request, workload, chosen, same_layout),
        "tensorParallel": tensor(request, chosen, meets),
        "pipelineParallel": pipeline(request, chosen),
        "maxModelLen": max_model_len(request, workload),
        "maxNumSeqs": max_num_seqs(request, workload, chosen, meets),
        "maxNumBatchedTokens": batched_tokens(request, workload),
        "gpuMemoryUtilization": utilization(workload, chosen, same_layout),
        "kvCacheTokens": kv_tokens(chosen),
    }


def quantization(
    request: PlanRequest,
    workload: ResolvedWorkload,
    chosen: Candidate,
    same_layout: list[Candidate],
    meets: bool = True,
) -> str:
    q = chosen.quantization
    head = f"{q}: {format_name(request, q)} weights, {gib(chosen.weights)} per GPU"
    if request.facts.prequantized:
        layout = f"{request.facts.quant_layout}, " if request.facts.quant_layout else ""
        return f"{head}; the checkpoint is {q}-quantized ({layout}config.json quantization_config)"
    if request.quantization != "auto":
        return f"{head}; pinned by spec.quantization"
    better = [
        c
        for c in same_layout
        if c.kv_dtype == chosen.kv_dtype
        and c.utilization == chosen.utilization
        and c.quality[1] < chosen.quality[1]
    ]
    why = [
        f"{format_name(request, c.quantization)} "
        + (
            f"holds {c.capacity} of {workload.target_seqs} target sequences"
            if c.feasible
            else f"does not fit ({gib(c.needed)} needed, {gib(c.usable)} usable)"
        )
        for c in better
    ]
    if why:
        tail = f"; {', '.join(why)}"
    elif meets:
        tail = f"; reaches {workload.target_seqs} target sequences"
    else:
        tail = f"; holds {chosen.capacity} of {workload.target_seqs} target sequences"
        served = request.capabilities.weight_quantizations
        if any(q not in served for q in WEIGHT_FORMATS):
            tail += f"; this runtime serves only {weights_served(served)}"
    if q in AT_LOAD:
        tail += f"; {AT_LOAD[q]}"
    if q == "int4":
        tail += (
            "; a pre-quantized AWQ or GPTQ checkpoint of this model is the same size and keeps more "
            "quality: point spec.model at one"
        )
    return head + tail


def kv_dtype(
    request: PlanRequest, workload: ResolvedWorkload, chosen: Candidate, same_layout: list[Candidate]
) -> str:
    kv = chosen.kv_dtype
    if request.kv_cache_dtype != "auto":
        return f"{kv}: pinned by spec.kvCacheDtype"
    if chosen.quality[0] == 0:
        return f"{kv}: the model's own dtype; 8-bit KV is used only when 16-bit can't reach the target"
    best16 = max((c.capacity for c in same_layout if c.quality[0] == 0 and c.feasible), default=0)
    return (
        f"{kv}: with 16-bit KV at most {best16} of {workload.target_seqs} target sequences fit; "
        f"{kv} halves the KV bytes per token"
    )


def tensor(request: PlanRequest, chosen: Candidate, meets: bool) -> str:
    facts, profile = request.facts, request.profile
    if isinstance(request.tensor, int):
        head = f"{chosen.tp}: pinned by spec.parallelism.tensor"
    elif request.gpu_count is None:
        head = f"{chosen.tp}: the fewest {profile.name} GPUs that fit"
    elif meets:
        head = (
            f"{chosen.tp}: the fewest GPUs (spec.gpu.count allows {request.gpu_count}) for the best "
            "format that reaches the target"
        )
    else:
        head = f"{chosen.tp}: the most KV cache within spec.gpu.count {request.gpu_count}"
    head += f"; a power of two dividing {facts.num_heads} heads and {facts.num_kv_heads} KV heads"
    if chosen.tp > 1 and profile.interconnect == "pcie":
        head += "; over PCIe (no NVLink), so each step's all-reduce costs more"
    return head


def pipeline(request: PlanRequest, chosen: Candidate) -> str:
    per_node = request.profile.gpus_per_node
    if isinstance(request.pipeline, int):
        return f"{chosen.pp}: pinned by spec.parallelism.pipeline"
    if chosen.pp == 1:
        return f"1: one node ({per_node} x {request.profile.name}) is enough"
    layers = math.ceil(request.facts.num_layers / chosen.pp)
    return (
        f"{chosen.pp}: one node of {per_node} GPUs is not enough; {chosen.pp} stages of at most {layers} "
        "layers, one node each"
    )


def utilization(workload: ResolvedWorkload, chosen: Candidate, same_layout: list[Candidate]) -> str:
    if chosen.utilization < 0.95:
        return f"{chosen.utilization:.2f}: default headroom for other processes and fragmentation"
    at_default = [c.capacity for c in same_layout if c.utilization < 0.95 and c.feasible]
    why = (
        f"at most {max(at_default)} of {workload.target_seqs} target sequences fit"
        if at_default
        else "nothing fits"
    )
    return f"{chosen.utilization:.2f}: raised from 0.90 because at 0.90 {why}"


def batched_tokens(request: PlanRequest, workload: ResolvedWorkload) -> str:
    return (
        f"{workload.batched_tokens}: prefill chunk of 8 x the {request.profile.name}'s compute/bandwidth "
        f"ridge ({request.profile.ridge_tokens:.0f} tokens), a power of two in [2048, 16384] and at "
        "least max_num_seqs"
    )


def kv_tokens(chosen: Candidate) -> str:
    return (
        f"{chosen.kv_tokens:,}: {gib(chosen.usable)} usable per GPU - {gib(chosen.weights)} weights - "
        f"{gib(chosen.workspace)} workspace, at {chosen.kv_per_token:,} bytes per token per GPU, in "
        f"{BLOCK_SIZE}-token blocks"
    )


def max_model_len(request: PlanRequest, workload: ResolvedWorkload) -> str:
    if request.max_model_len:
        return f"{workload.max_model_len}: spec.workload.maxModelLen"
    return (
        f"{workload.max_model_len}: default min(8192, max_position_embeddings {request.facts.max_positions})"
    )


def max_num_seqs(request: PlanRequest, workload: ResolvedWorkload, chosen: Candidate, meets: bool) -> str:
    seqs = max(1, min(workload.max_seqs, chosen.capacity))
    text = (
        f"{seqs}: the KV cache holds {chosen.kv_tokens:,} tokens = {chosen.capacity} sequences of "
        f"{workload.avg_context_len:,} tokens (average context)"
    )
    if chosen.capacity > workload.max_seqs:
        source = "workload.concurrency" if request.concurrency else "the default batch limit"
        text += f", capped at {workload.max_seqs} by {source}"
    if not meets:
        caps = request.capabilities
        more = "a larger GPU profile"
        if caps.max_tensor_parallel > 1 or caps.max_pipeline_parallel > 1:
            more = "more GPUs (spec.gpu.count) or " + more
        text += f"; short of the {workload.target_seqs} target: {more} would hold more"
    return text


def summary(
    request: PlanRequest, workload: ResolvedWorkload, chosen: Candidate, meets: bool, seqs: int
) -> str:
    stages = f" x pp{chosen.pp}" if chosen.pp > 1 else ""
    short = "" if meets else f", short of the {workload.target_seqs} target"
    weights = format_name(request, chosen.quantization)
    return (
        f"{chosen.gpus} x {request.profile.name} (tp{chosen.tp}{stages}), {weights} weights, "
        f"{chosen.kv_dtype} KV: {seqs} sequences of ~{workload.avg_context_len:,} tokens, up to "
        f"{workload.max_model_len:,}{short}"
    )


def infeasible(
    request: PlanRequest, workload: ResolvedWorkload, closest: Candidate, suggestion: int | None
) -> str:
    profile = request.profile
    one_sequence = gib(closest.kv_per_token * closest.max_model_len)
    text = (
        f"does not fit: {format_name(request, closest.quantization)} weights need "
        f"{gib(closest.weights)} per GPU + {gib(closest.workspace)} workspace + {one_sequence} "
        f"{closest.kv_dtype} KV for one {workload.max_model_len:,}-token sequence = "
        f"{gib(closest.needed)}, but {closest.gpus} x {profile.name} offer {gib(closest.usable)} usable "
        f"per GPU ({profile.memory_gi_b:g} GiB x {closest.utilization:.2f})"
    )
    if suggestion:
        per_node = min(suggestion, profile.gpus_per_node)
        nodes = f" ({suggestion // per_node} nodes, pipeline parallel)" if suggestion > per_node else ""
        return text + f"; spec.gpu.count: {suggestion}{nodes} would fit"
    caps = request.capabilities
    stages = min(MAX_STAGES_HINT, caps.max_pipeline_parallel, request.facts.num_layers)
    if stages > 1:
        where = f"no layout of up to {stages} nodes of {profile.name} fits"
    elif caps.max_tensor_parallel > 1:
        where = f"no layout on one node of {profile.name} fits"
    else:
        where = "this runtime runs on one GPU"
    return text + f"; {where}: use a larger GPU profile"
