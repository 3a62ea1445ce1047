"""One reconcile pass for one InferenceService: plan, render, apply, status, events. Idempotent.

Create, update, resume, a change of its workload and a change of GPU profiles all run this same pass.
An unplannable spec is a Planned=False condition and a Warning event, never an exception; API failures
raise ApiError so the caller (kopf) retries with backoff.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kvpilot.operator.apply import ApplyResult, apply_all, observe_workload
from kvpilot.operator.hub_config import ConfigFetcher
from kvpilot.operator.kube import KubeApi
from kvpilot.operator.labels import API_VERSION, KIND, InvalidNameError, Owner
from kvpilot.operator.pod import served_model_name
from kvpilot.operator.profiles import ProfileStore
from kvpilot.operator.render import RenderConfig, render
from kvpilot.operator.service_plan import INVALID_SPEC, PlanOutcome, plan_service
from kvpilot.operator.status import Observed, compute_status, status_changed, status_patch


class Recorder(Protocol):
    def __call__(self, body: dict[str, Any], type: str, reason: str, message: str) -> None: ...


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Deps:
    """Everything a pass needs, passed in explicitly (one instance per operator run)."""

    api: KubeApi
    profiles: ProfileStore
    fetch: ConfigFetcher | None
    record: Recorder
    render_config: RenderConfig = field(default_factory=RenderConfig)
    clock: Callable[[], str] = utc_now


@dataclass
class PassResult:
    outcome: PlanOutcome
    applied: ApplyResult | None
    status_written: bool


async def reconcile(body: dict[str, Any], deps: Deps) -> PassResult:
    owner = Owner.from_body(body)
    meta = body.get("metadata") or {}
    outcome = await plan_service(body.get("spec"), deps.profiles, deps.fetch)
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
    desired = outcome.spec.replicas if outcome.spec else int((body.get("spec") or {}).get("replicas") or 0)
    served = served_model_name(outcome.spec, owner) if outcome.spec else None
    status = compute_status(owner, int(meta.get("generation") or 0), desired, outcome,
                            Observed.from_workload(workload), previous, served, deps.clock())
    record_events(body, previous, outcome, applied, deps.record)
    written = status_changed(previous, status)
    if written:
        await deps.api.merge_patch(API_VERSION, KIND, owner.namespace, owner.name,
                                   status_patch(previous, status), subresource="status")
    return PassResult(outcome, applied, written)


def record_events(body: dict[str, Any], previous: dict[str, Any], outcome: PlanOutcome,
                  applied: ApplyResult | None, record: Recorder) -> None:
    """Events for plan results (once per new plan or new failure) and for rolled workloads."""
    old_plan = previous.get("plan") or {}
    old_planned = next((c for c in previous.get("conditions") or [] if c.get("type") == "Planned"), {})
    if outcome.planned and outcome.plan is not None:
        if old_plan != outcome.plan.to_status():
            record(body, "Normal", "Planned", outcome.plan.reason)
    elif (old_planned.get("status"), old_planned.get("message")) != ("False", outcome.message):
        record(body, "Warning", outcome.reason, outcome.message)
    if applied is not None and (applied.updated or applied.deleted):
        changed = ", ".join(applied.updated + applied.deleted)
        record(body, "Normal", "Rolled", f"re-rendered {changed}")
