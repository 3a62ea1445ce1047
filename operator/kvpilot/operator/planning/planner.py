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

from dataclasses import dataclass, replace

from kvpilot.contracts.capabilities import EVERYTHING
from kvpilot.operator.planning import reasons
from kvpilot.operator.planning.plan import Plan
from kvpilot.operator.planning.request import PlanningError, PlanRequest, ResolvedWorkload
from kvpilot.operator.planning.search_space import (
    allowed_kv_dtypes,
    allowed_quantizations,
    check_architecture,
    layout_groups,
    layouts,
    resolve_workload,
    runs_split,
    tensor_degrees,
)
from kvpilot.operator.planning.sizing import (
    kv_bytes_per_token,
    kv_cache_tokens,
    weight_bytes,
    weight_bytes_per_gpu,
    workspace_bytes,
)

UTILIZATIONS = (0.90, 0.95)
WEIGHT_QUALITY = ("none", "fp8", "int8", "int4", "awq", "gptq")
MAX_SUGGESTED_STAGES = reasons.MAX_STAGES_HINT  # one number for the search and its message


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
