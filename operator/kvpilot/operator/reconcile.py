"""One reconcile pass for one InferenceService: plan, render, apply, status, events. Idempotent.

Create, update, resume, a change of its workload and a change of GPU profiles all run this same pass.
An unplannable spec is a Planned=False condition and a Warning event, never an exception; API failures
raise ApiError so the caller (kopf) retries with backoff.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvpilot.contracts.capabilities import RUNTIME, RuntimeCapabilities
from kvpilot.operator.apply import ApplyResult, apply_all, observe_workload
from kvpilot.operator.hub_config import ConfigFetcher
from kvpilot.operator.kube import KubeApi
from kvpilot.operator.labels import API_VERSION, KIND, InvalidNameError, Owner
from kvpilot.operator.planning.outcome import INVALID_SPEC, PlanOutcome, plan_service
from kvpilot.operator.planning.profiles import ProfileStore
from kvpilot.operator.pod import served_model_name
from kvpilot.operator.render import RenderConfig, render
from kvpilot.operator.status import Observed, compute_status, status_changed, status_patch


class Recorder(Protocol):
    def __call__(self, body: dict[str, Any], type: str, reason: str, message: str) -> None: ...


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class Deps:
    """Everything a pass needs, passed in explicitly (one instance per operator run)."""

    api: KubeApi
    profiles: ProfileStore
    fetch: ConfigFetcher | None
    record: Recorder
    render_config: RenderConfig = field(default_factory=RenderConfig)
    capabilities: RuntimeCapabilities = RUNTIME  # what the runtime image can run: the planner stays within
    clock: Callable[[], str] = utc_now


@dataclass
class PassResult:
    outcome: PlanOutcome | None  # None: the InferenceService is gone
    applied: ApplyResult | None = None
    status_patch: dict[str, Any] | None = None  # None: the status was already up to date


async def reconcile(body: dict[str, Any], deps: Deps, write_status: bool = True) -> PassResult:
    """One pass over the object as the server has it now (the event's body may be stale).

    write_status=False leaves the status patch to the caller (kopf applies it with its own patch).
    """
    owner = Owner.from_body(body)
    fresh = await deps.api.get(API_VERSION, KIND, owner.namespace, owner.name)
    if fresh is None or (fresh.get("metadata") or {}).get("deletionTimestamp"):
        return PassResult(None)
    body, owner = fresh, Owner.from_body(fresh)
    outcome = await plan_service(body.get("spec"), deps.profiles, deps.fetch, capabilities=deps.capabilities)
    try:
        owner.check_name()
    except InvalidNameError as exc:
        outcome = PlanOutcome(INVALID_SPEC, str(exc))
    applied = None
    if outcome.planned and outcome.spec and outcome.plan and outcome.profile:
        manifests = render(owner, outcome.spec, outcome.plan, outcome.profile, deps.render_config)
        applied = await apply_all(deps.api, owner, manifests)
        workload = applied.workload
    else:
        workload = await observe_workload(deps.api, owner)
    previous = body.get("status") or {}
    status = compute_status(
        owner,
        int((body.get("metadata") or {}).get("generation") or 0),
        desired_replicas(body, outcome),
        outcome,
        Observed.from_workload(workload),
        previous,
        served_model_name(outcome.spec, owner) if outcome.spec else None,
        deps.clock(),
    )
    record_events(body, previous, outcome, applied, deps.record)
    patch = status_patch(previous, status) if status_changed(previous, status) else None
    if patch is not None and write_status:
        await deps.api.merge_patch(
            API_VERSION, KIND, owner.namespace, owner.name, patch, subresource="status"
        )
    return PassResult(outcome, applied, patch)


def desired_replicas(body: dict[str, Any], outcome: PlanOutcome) -> int:
    if outcome.spec is not None:
        return outcome.spec.replicas
    value = (body.get("spec") or {}).get("replicas")
    return value if type(value) is int and value >= 0 else 0


def record_events(
    body: dict[str, Any],
    previous: dict[str, Any],
    outcome: PlanOutcome,
    applied: ApplyResult | None,
    record: Recorder,
) -> None:
    """Events for plan results (once per new plan or new failure) and for rolled workloads."""
    old_plan = previous.get("plan") or {}
    old_planned: dict[str, Any] = next(
        (c for c in previous.get("conditions") or [] if c.get("type") == "Planned"), {}
    )
    if outcome.planned and outcome.plan is not None:
        if old_plan != outcome.plan.to_status():
            record(body, "Normal", "Planned", outcome.plan.reason)
    elif (old_planned.get("status"), old_planned.get("message")) != ("False", outcome.message):
        record(body, "Warning", outcome.reason, outcome.message)
    if applied is not None and (applied.updated or applied.deleted):
        changed = ", ".join(applied.updated + applied.deleted)
        record(body, "Normal", "Rolled", f"re-rendered {changed}")
