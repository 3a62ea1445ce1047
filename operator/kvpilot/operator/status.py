"""The InferenceService status, computed purely from the plan outcome and the observed workload."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvpilot.operator.labels import Owner, selector_string
from kvpilot.operator.planning.outcome import PlanOutcome
from kvpilot.operator.pod import PORT

OWNED_KEYS = (
    "phase",
    "observedGeneration",
    "conditions",
    "plan",
    "planSummary",
    "replicas",
    "readyReplicas",
    "ready",
    "selector",
    "servedModelName",
    "endpoint",
)


@dataclass(frozen=True)
class Observed:
    """What the cluster reports about the workload (Deployment or LeaderWorkerSet), if there is one."""

    exists: bool = False
    replicas: int = 0
    ready_replicas: int = 0
    failure: str | None = None  # why the workload can't progress, from its conditions

    @classmethod
    def from_workload(cls, workload: dict[str, Any] | None) -> Observed:
        if workload is None:
            return cls()
        status = workload.get("status") or {}
        failure = None
        for cond in status.get("conditions") or []:
            stuck = cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded"
            if stuck or (cond.get("type") == "ReplicaFailure" and cond.get("status") == "True"):
                failure = f"{cond.get('reason')}: {cond.get('message', '')}".rstrip(": ")
        return cls(True, int(status.get("replicas") or 0), int(status.get("readyReplicas") or 0), failure)


def compute_status(
    owner: Owner,
    generation: int,
    desired: int,
    outcome: PlanOutcome,
    observed: Observed,
    previous: dict[str, Any],
    served_name: str | None,
    now: str,
) -> dict[str, Any]:
    """The full status the operator owns; lastTransitionTime is kept while a condition's status holds."""
    planned = outcome.planned
    ready = observed.ready_replicas
    phase, ready_cond, degraded_cond = _phase(planned, outcome, desired, observed)
    conditions = [
        _condition("Planned", planned, outcome.reason, outcome.message, generation),
        _condition("Ready", *ready_cond, generation),
        _condition("Degraded", *degraded_cond, generation),
    ]
    status: dict[str, Any] = {
        "phase": phase,
        "observedGeneration": generation,
        "conditions": _keep_transition_times(conditions, previous.get("conditions") or [], now),
        "replicas": observed.replicas,
        "readyReplicas": ready,
        "ready": f"{ready}/{desired}",
        "selector": selector_string(owner.name),
        "endpoint": f"http://{owner.name}.{owner.namespace}.svc:{PORT}",
    }
    if outcome.plan is not None:
        status["plan"] = outcome.plan.to_status()
        status["planSummary"] = outcome.plan.summary
    elif previous.get("plan"):
        status["plan"] = {"feasible": False, "reason": f"{outcome.reason}: {outcome.message}"}
        status["planSummary"] = "not planned"
    if served_name:
        status["servedModelName"] = served_name
    return status


def _phase(
    planned: bool, outcome: PlanOutcome, desired: int, observed: Observed
) -> tuple[str, tuple[bool, str, str], tuple[bool, str, str]]:
    ready = observed.ready_replicas
    if not planned:
        if observed.exists:
            return (
                "Degraded",
                (ready >= desired > 0, "NotPlanned", "the spec is not planned"),
                (True, "ServingPreviousPlan", f"the last planned workload still runs; {outcome.message}"),
            )
        return "Failed", (False, "NotPlanned", outcome.message), (False, "NotPlanned", "")
    if observed.failure:
        return (
            "Degraded",
            (False, "WorkloadFailing", observed.failure),
            (True, "WorkloadFailing", observed.failure),
        )
    healthy = (False, "AsExpected", "")
    if desired == 0:
        return "ScaledToZero", (False, "ScaledToZero", "spec.replicas is 0"), healthy
    if ready >= desired:
        return "Ready", (True, "ReplicasReady", f"{ready}/{desired} replicas ready"), healthy
    return "Progressing", (False, "ReplicasNotReady", f"{ready}/{desired} replicas ready"), healthy


def _condition(kind: str, ok: bool, reason: str, message: str, generation: int) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
        "observedGeneration": generation,
    }


def _keep_transition_times(
    conditions: list[dict[str, Any]], previous: list[dict[str, Any]], now: str
) -> list[dict[str, Any]]:
    before = {c.get("type"): c for c in previous}
    for cond in conditions:
        old = before.get(cond["type"])
        same = old is not None and old.get("status") == cond["status"] and old.get("lastTransitionTime")
        cond["lastTransitionTime"] = old["lastTransitionTime"] if same else now  # type: ignore[index]
    return conditions


def status_changed(current: dict[str, Any] | None, new: dict[str, Any]) -> bool:
    """Whether the keys the operator owns differ (other writers' keys are ignored)."""
    current = current or {}
    return any(current.get(k) != new.get(k) for k in OWNED_KEYS)


def status_patch(current: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """A merge patch that sets the owned keys and removes owned keys the new status lacks."""
    patch: dict[str, Any] = {k: new.get(k) for k in OWNED_KEYS if k in new or k in (current or {})}
    return {"status": patch}
