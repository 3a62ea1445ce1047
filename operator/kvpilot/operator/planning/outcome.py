"""From a raw InferenceService spec to a Plan: validate, find model facts and the profile, plan.

Each step's failure becomes a PlanOutcome with a condition reason and a message for the user, never an
exception: the operator writes it as Planned=False, `kvpilot plan` prints it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvpilot.contracts.capabilities import RUNTIME, RuntimeCapabilities
from kvpilot.operator.hub_config import ConfigFetcher, ConfigFetchError
from kvpilot.operator.planning.model_facts import ModelFacts, ModelFactsError, facts_from_config
from kvpilot.operator.planning.plan import Plan
from kvpilot.operator.planning.planner import PlanRequest, plan
from kvpilot.operator.planning.profiles import GpuProfile, ProfileStore
from kvpilot.operator.spec import InferenceServiceSpec, ModelSource, SpecError, parse_spec

FEASIBLE = "Feasible"
INFEASIBLE = "Infeasible"
UNSUPPORTED_BY_RUNTIME = "UnsupportedByRuntime"  # a plan fits, but not one this runtime can run
INVALID_SPEC = "InvalidSpec"
UNKNOWN_PROFILE = "UnknownGPUProfile"
NO_MODEL_CONFIG = "ModelConfigUnavailable"


@dataclass(frozen=True)
class PlanOutcome:
    reason: str  # condition reason: one of the constants above
    message: str
    spec: InferenceServiceSpec | None = None
    profile: GpuProfile | None = None
    facts: ModelFacts | None = None
    plan: Plan | None = None

    @property
    def planned(self) -> bool:
        return self.plan is not None and self.plan.feasible


async def model_facts(source: ModelSource, fetch: ConfigFetcher | None) -> ModelFacts:
    """Facts from spec.model.config, else from the Hub for hf://; ModelFactsError says what to add."""
    if source.config is not None:
        return facts_from_config(source.config)
    if source.scheme != "hf" or fetch is None:
        raise ModelFactsError(
            f"the operator cannot read config.json from {source.uri}; add "
            "spec.model.config (the model's config.json fields)"
        )
    try:
        config = await fetch(source.location, source.revision)
    except ConfigFetchError as exc:
        raise ModelFactsError(f"{exc}; or add spec.model.config (the model's config.json fields)") from None
    return facts_from_config(config)


async def plan_service(
    raw_spec: Any,
    profiles: ProfileStore,
    fetch: ConfigFetcher | None,
    gpu_override: str | None = None,
    capabilities: RuntimeCapabilities = RUNTIME,
) -> PlanOutcome:
    try:
        spec = parse_spec(raw_spec)
    except SpecError as exc:
        return PlanOutcome(INVALID_SPEC, str(exc))
    name = gpu_override or spec.gpu.profile
    profile = profiles.get(name)
    if profile is None:
        known = ", ".join(profiles.names())
        return PlanOutcome(UNKNOWN_PROFILE, f"unknown GPU profile {name!r}; known: {known}", spec=spec)
    try:
        facts = await model_facts(spec.model, fetch)
    except ModelFactsError as exc:
        return PlanOutcome(NO_MODEL_CONFIG, str(exc), spec=spec, profile=profile)
    draft = None
    if spec.speculative is not None and spec.speculative.draft_model is not None:
        try:
            draft = await model_facts(spec.speculative.draft_model, fetch)
        except ModelFactsError as exc:
            message = f"spec.speculative.draftModel: {exc}".replace("spec.model.config", "its config")
            return PlanOutcome(NO_MODEL_CONFIG, message, spec=spec, profile=profile)
    result = plan(PlanRequest.from_spec(spec, facts, profile, capabilities, draft))
    reason = INFEASIBLE if not result.needs else UNSUPPORTED_BY_RUNTIME
    return PlanOutcome(FEASIBLE if result.feasible else reason, result.reason, spec, profile, facts, result)
