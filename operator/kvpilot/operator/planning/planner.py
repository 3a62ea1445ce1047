"""Planning: how a model fits a GPU profile. Pure functions of (request, model facts, profile, runtime).

Only what the runtime can run is considered (request.capabilities: weight formats, KV dtypes, tensor and
pipeline degrees), so a feasible plan is a runnable one. When nothing within the runtime fits, the plan is
infeasible and says what was needed, what this runtime serves and, if the planner knows a plan that fits
with everything it can reason about (capabilities.EVERYTHING), what that plan would be.

Every way to run the model (layout x weight format x KV dtype) is sized as a Candidate; the choice is:
- with spec.gpu.count absent, the fewest GPUs that fit (one node), then the best quality that reaches the
  target concurrency; with count given (the most a replica may use), the best quality that reaches the
  target, then the fewest GPUs. If nothing reaches the target, the most sequences (an honest shortfall).
- weights: a pre-quantized checkpoint runs its own format (awq, gptq, fp8); a 16-bit one may be quantized
  at load (fp8 where the GPU has it, int8, int4), never planned as AWQ/GPTQ (that needs their checkpoint:
  the reason names it as the better 4-bit alternative).
- quality: 16-bit KV before 8-bit KV, then weights none > fp8 > int8 > int4 > awq > gptq.
- "fits" means the weights, the workspace and the KV of one max-length sequence fit in
  gpu_memory_utilization x memory on every GPU; 0.95 instead of 0.90 only when nothing reaches the
  target at 0.90.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kvpilot.contracts.capabilities import EVERYTHING, RUNTIME, RuntimeCapabilities
from kvpilot.operator.planning import reasons
from kvpilot.operator.planning.model_facts import ModelFacts
from kvpilot.operator.planning.plan import Plan
from kvpilot.operator.planning.profiles import GpuProfile
from kvpilot.operator.planning.sizing import (
    kv_bytes_per_token,
    kv_cache_tokens,
    weight_bytes,
    weight_bytes_per_gpu,
    workspace_bytes,
)
from kvpilot.operator.spec import InferenceServiceSpec

DEFAULT_MAX_MODEL_LEN = 8192
DEFAULT_TARGET_SEQS = 32
DEFAULT_MAX_SEQS = 256
UTILIZATIONS = (0.90, 0.95)
WEIGHT_QUALITY = ("none", "fp8", "int8", "int4", "awq", "gptq")
LOAD_TIME_FORMATS = ("none", "fp8", "int8", "int4")  # what a 16-bit checkpoint can become at load
CHECKPOINT_FORMATS = {"awq": "AWQ", "gptq": "GPTQ"}  # need their own pre-quantized checkpoint
MAX_SUGGESTED_STAGES = reasons.MAX_STAGES_HINT  # one number for the search and its message


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


@dataclass(frozen=True)
class Candidate:
    tp: int
    pp: int
    quantization: str
    kv_dtype: str
    utilization: float
    usable: int  # bytes per GPU
    weights: int  # bytes on the busiest GPU
    workspace: int
    kv_per_token: int  # bytes per token on the busiest GPU
    kv_tokens: int
    max_model_len: int
    avg_context_len: int

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    @property
    def feasible(self) -> bool:
        return self.kv_tokens >= self.max_model_len

    @property
    def capacity(self) -> int:
        """Sequences of the average context length the KV cache holds at once."""
        return self.kv_tokens // self.avg_context_len

    @property
    def needed(self) -> int:
        return self.weights + self.workspace + self.kv_per_token * self.max_model_len

    @property
    def quality(self) -> tuple[int, int]:
        return (0 if self.kv_dtype in ("bf16", "fp16") else 1, WEIGHT_QUALITY.index(self.quantization))


def plan(request: PlanRequest) -> Plan:
    """The plan for one replica, within request.capabilities; an infeasible or contradictory request
    yields feasible=False with why (and, when only the runtime stands in the way, what would fit)."""
    within = plan_within(request)
    if within.feasible or request.capabilities == EVERYTHING:
        return within
    unconstrained = plan_within(replace(request, capabilities=EVERYTHING))
    if not unconstrained.feasible:
        if unconstrained.reason == within.reason:
            return within
        serves = reasons.runtime_serves(request.capabilities)
        return replace(within, reason=f"{unconstrained.reason}; but this runtime serves only {serves}")
    needs = runtime_needs(request, unconstrained)
    if not needs:  # cannot happen (a fitting plan within the runtime would have been found): be safe
        return within
    return replace(within, reason=reasons.unsupported(request, unconstrained, needs, within), needs=needs)


def runtime_needs(request: PlanRequest, fits: Plan) -> tuple[str, ...]:
    """What a plan needs that the runtime can't run, as short phrases (`4-bit AWQ weights`)."""
    capabilities, needs = request.capabilities, []
    if not capabilities.serves_architecture(request.facts.architectures):
        needs.append(f"the {'/'.join(request.facts.architectures)} architecture")
    if fits.quantization not in capabilities.weight_quantizations:
        needs.append(f"{reasons.FORMAT_NAMES.get(fits.quantization, fits.quantization)} weights")
    elif not runs_split(capabilities, fits.quantization, fits.tensor_parallel, fits.pipeline_parallel):
        name = reasons.FORMAT_NAMES.get(fits.quantization, fits.quantization)
        needs.append(f"{name} weights split across {fits.tensor_parallel * fits.pipeline_parallel} GPUs")
    if fits.kv_cache_dtype not in capabilities.kv_cache_dtypes:
        needs.append(f"{reasons.article(fits.kv_cache_dtype)} {fits.kv_cache_dtype} KV cache")
    if fits.tensor_parallel > capabilities.max_tensor_parallel:
        needs.append(f"tensor parallel {fits.tensor_parallel}")
    if fits.pipeline_parallel > capabilities.max_pipeline_parallel:
        needs.append(f"pipeline parallel {fits.pipeline_parallel}")
    return tuple(needs)


def runs_split(capabilities: RuntimeCapabilities, quantization: str, tp: int, pp: int) -> bool:
    """Whether weights of this format run over tp x pp GPUs (quantized ones may be one-GPU only)."""
    return capabilities.quantized_parallel or quantization == "none" or tp * pp == 1


def plan_within(request: PlanRequest) -> Plan:
    """The plan among the layouts and formats request.capabilities allows."""
    try:
        check_architecture(request)
        workload = resolve_workload(request)
        quantizations = allowed_quantizations(request)
        kv_dtypes = allowed_kv_dtypes(request)
        single, multi = layouts(request)
    except PlanningError as exc:
        return Plan(feasible=False, gpu_profile=request.profile.name, reason=str(exc))
    evaluated: list[Candidate] = []
    count_given = request.gpu_count is not None
    for group in layout_groups(single, multi, count_given):
        for utilizations in (UTILIZATIONS[:1], UTILIZATIONS):
            batch = [
                size(request, workload, tp, pp, q, kv, utilization)
                for utilization in utilizations
                for tp, pp in group
                for q in quantizations
                for kv in kv_dtypes
                if runs_split(request.capabilities, q, tp, pp)
            ]
            evaluated.extend(batch)
            feasible = [c for c in batch if c.feasible]
            meets = any(c.capacity >= workload.target_seqs for c in feasible)
            if meets or (feasible and len(utilizations) == len(UTILIZATIONS)):
                chosen, meets = choose(feasible, workload.target_seqs, count_given)
                return build_plan(request, workload, chosen, meets, batch)
    return infeasible_plan(request, workload, evaluated, quantizations, kv_dtypes)


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
        raise PlanningError(
            f"fp8 weights need fp8 tensor cores (Ada or Hopper); {profile.name} has none: "
            "use int8, int4 or auto"
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
    kinds = [kv for kv in (request.facts.dtype, "fp8" if request.profile.fp8 else "int8") if kv in served]
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


def size(
    request: PlanRequest,
    workload: ResolvedWorkload,
    tp: int,
    pp: int,
    quantization: str,
    kv_dtype: str,
    utilization: float,
) -> Candidate:
    facts = request.facts
    usable = int(request.profile.memory_bytes * utilization)
    weights = weight_bytes_per_gpu(facts, quantization, tp, pp) + draft_weight_bytes(request)
    workspace = workspace_bytes(facts, tp, pp, workload.batched_tokens, workload.max_seqs)
    per_token = kv_bytes_per_token(facts, kv_dtype, tp, pp) + draft_kv_bytes_per_token(request, kv_dtype)
    tokens = kv_cache_tokens(usable - weights - workspace, per_token)
    return Candidate(
        tp,
        pp,
        quantization,
        kv_dtype,
        utilization,
        usable,
        weights,
        workspace,
        per_token,
        tokens,
        workload.max_model_len,
        workload.avg_context_len,
    )


def draft_weight_bytes(request: PlanRequest) -> int:
    """The draft model's weights (16-bit, not split: the draft runs whole beside rank 0's share)."""
    return 0 if request.draft is None else weight_bytes(request.draft, "none")


def draft_kv_bytes_per_token(request: PlanRequest, kv_dtype: str) -> int:
    """The draft model's KV bytes per token: its cache holds as many tokens as the target's."""
    return 0 if request.draft is None else kv_bytes_per_token(request.draft, kv_dtype)


def choose(feasible: list[Candidate], target: int, count_given: bool) -> tuple[Candidate, bool]:
    """The chosen candidate and whether it reaches the target concurrency."""
    pool = feasible
    if not count_given:
        fewest = min(c.gpus for c in feasible)
        pool = [c for c in feasible if c.gpus == fewest]
    meeting = [c for c in pool if c.capacity >= target]
    if meeting:
        return min(meeting, key=lambda c: (c.quality, c.gpus, c.utilization)), True
    return max(pool, key=lambda c: (c.capacity, -c.gpus, [-q for q in c.quality], -c.utilization)), False


def build_plan(
    request: PlanRequest,
    workload: ResolvedWorkload,
    chosen: Candidate,
    meets: bool,
    alternatives: list[Candidate],
) -> Plan:
    seqs = max(1, min(workload.max_seqs, chosen.capacity))
    facts = request.facts
    base = Plan(
        feasible=True,
        gpu_profile=request.profile.name,
        reason="",
        gpus=chosen.gpus,
        quantization=chosen.quantization,
        kv_cache_dtype=chosen.kv_dtype,
        tensor_parallel=chosen.tp,
        pipeline_parallel=chosen.pp,
        max_num_seqs=seqs,
        max_model_len=workload.max_model_len,
        max_num_batched_tokens=workload.batched_tokens,
        weight_bytes=weight_bytes(facts, chosen.quantization) + draft_weight_bytes(request),
        kv_bytes_per_token=kv_bytes_per_token(facts, chosen.kv_dtype)
        + draft_kv_bytes_per_token(request, chosen.kv_dtype),
        kv_cache_tokens=chosen.kv_tokens,
        gpu_memory_utilization=chosen.utilization,
    )
    why = reasons.feasible_reasons(request, workload, chosen, meets, alternatives)
    return replace(base, reasons=why, reason=reasons.summary(request, workload, chosen, meets, seqs))


def infeasible_plan(
    request: PlanRequest,
    workload: ResolvedWorkload,
    evaluated: list[Candidate],
    quantizations: list[str],
    kv_dtypes: list[str],
) -> Plan:
    closest = min(evaluated, key=lambda c: (c.needed - c.usable, -c.gpus))
    suggestion = suggest_count(request, workload, quantizations, kv_dtypes)
    return Plan(
        feasible=False,
        gpu_profile=request.profile.name,
        weight_bytes=weight_bytes(request.facts, closest.quantization) + draft_weight_bytes(request),
        kv_bytes_per_token=kv_bytes_per_token(request.facts, closest.kv_dtype)
        + draft_kv_bytes_per_token(request, closest.kv_dtype),
        max_model_len=workload.max_model_len,
        reason=reasons.infeasible(request, workload, closest, suggestion),
    )


def suggest_count(
    request: PlanRequest, workload: ResolvedWorkload, quantizations: list[str], kv_dtypes: list[str]
) -> int | None:
    """The fewest GPUs of this profile that would fit, through more GPUs per node or pipeline stages
    (within what the runtime runs)."""
    per_node = request.profile.gpus_per_node
    caps = request.capabilities
    valid = [tp for tp in tensor_degrees(request.facts, per_node) if tp <= caps.max_tensor_parallel]
    if isinstance(request.tensor, int) and request.tensor in valid:
        valid = [request.tensor]
    stages = min(MAX_SUGGESTED_STAGES, caps.max_pipeline_parallel, request.facts.num_layers)
    options = sorted(
        {(tp, 1) for tp in valid} | {(valid[-1], pp) for pp in range(2, stages + 1)},
        key=lambda layout: layout[0] * layout[1],
    )
    for tp, pp in options:
        if any(
            size(request, workload, tp, pp, q, kv, utilization).feasible
            for q in quantizations
            for kv in kv_dtypes
            for utilization in UTILIZATIONS
            if runs_split(caps, q, tp, pp)
        ):
            return tp * pp
    return None
