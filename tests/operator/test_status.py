"""Status is a pure function of the plan outcome and the observed workload."""

from __future__ import annotations

from typing import Any

from kvpilot.operator.labels import Owner
from kvpilot.operator.planning.outcome import FEASIBLE, INFEASIBLE, PlanOutcome
from kvpilot.operator.planning.plan import Plan
from kvpilot.operator.status import Observed, compute_status, status_changed, status_patch

OWNER = Owner("m", "ml", "u")
PLAN = Plan(
    feasible=True,
    gpu_profile="l4",
    reason="1 x l4",
    gpus=1,
    quantization="none",
    kv_cache_dtype="bf16",
    tensor_parallel=1,
    pipeline_parallel=1,
    max_num_seqs=8,
    max_model_len=8192,
)
PLANNED = PlanOutcome(FEASIBLE, "1 x l4", plan=PLAN)
INFEASIBLE_OUTCOME = PlanOutcome(INFEASIBLE, "does not fit", plan=Plan(False, "l4", "does not fit"))


def status(
    outcome: PlanOutcome, observed: Observed, desired: int = 2, previous: Any = None, now: str = "T1"
) -> dict[str, Any]:
    return compute_status(OWNER, 3, desired, outcome, observed, previous or {}, "m", now)


def cond(s: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in s["conditions"] if c["type"] == kind)


def test_phases() -> None:
    assert status(PLANNED, Observed(True, 2, 1))["phase"] == "Progressing"
    ready = status(PLANNED, Observed(True, 2, 2))
    assert ready["phase"] == "Ready" and cond(ready, "Ready")["status"] == "True" and ready["ready"] == "2/2"
    assert status(PLANNED, Observed(True, 0, 0), desired=0)["phase"] == "ScaledToZero"
    assert status(INFEASIBLE_OUTCOME, Observed())["phase"] == "Failed"
    serving = status(INFEASIBLE_OUTCOME, Observed(True, 2, 2))
    assert serving["phase"] == "Degraded" and cond(serving, "Degraded")["reason"] == "ServingPreviousPlan"
    assert cond(serving, "Planned") == {
        "type": "Planned",
        "status": "False",
        "reason": "Infeasible",
        "message": "does not fit",
        "observedGeneration": 3,
        "lastTransitionTime": "T1",
    }


def test_stuck_rollout_is_degraded() -> None:
    workload = {
        "status": {
            "replicas": 2,
            "readyReplicas": 1,
            "conditions": [
                {
                    "type": "Progressing",
                    "status": "False",
                    "reason": "ProgressDeadlineExceeded",
                    "message": "ReplicaSet has timed out progressing.",
                }
            ],
        }
    }
    s = status(PLANNED, Observed.from_workload(workload))
    assert s["phase"] == "Degraded" and cond(s, "Degraded")["status"] == "True"
    assert "ProgressDeadlineExceeded" in cond(s, "Degraded")["message"]


def test_transition_times_hold_while_status_holds() -> None:
    first = status(PLANNED, Observed(True, 2, 1), now="T1")
    same = status(PLANNED, Observed(True, 2, 1), previous=first, now="T2")
    assert same == first and not status_changed(first, same)
    flipped = status(PLANNED, Observed(True, 2, 2), previous=first, now="T3")
    assert cond(flipped, "Ready")["lastTransitionTime"] == "T3"
    assert cond(flipped, "Planned")["lastTransitionTime"] == "T1"
    assert status_changed(first, flipped)


def test_patch_touches_only_owned_keys_and_clears_stale_ones() -> None:
    previous = {**status(PLANNED, Observed(True, 1, 1)), "someoneElse": 1}
    new = compute_status(
        OWNER, 4, 0, PlanOutcome("InvalidSpec", "spec.replicas: bad"), Observed(), previous, None, "T2"
    )
    patch = status_patch(previous, new)["status"]
    assert "someoneElse" not in patch and patch["servedModelName"] is None
    assert patch["plan"] == {"feasible": False, "reason": "InvalidSpec: spec.replicas: bad"}
    assert not status_changed({**new, "someoneElse": 2}, new)
