"""Rendering: a pure function from (InferenceService, Plan, profile) to the manifests to apply.

One node per replica: a Deployment. Several (pipeline stages): a LeaderWorkerSet whose group is one
replica. Always: a Service, a headless Service for discovery, and a ConfigMap with the plan. Each object
carries the labels, an owner reference to the InferenceService and a spec-hash annotation.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from kvpilot.operator.labels import (
    SERVED_MODEL,
    SPEC_HASH,
    Owner,
    headless_service_name,
    labels,
    plan_configmap_name,
)
from kvpilot.operator.planning.plan import Plan
from kvpilot.operator.planning.profiles import GpuProfile
from kvpilot.operator.pod import DEFAULT_RUNTIME_IMAGE, PORT, pod_template, runtime_image, served_model_name
from kvpilot.operator.spec import InferenceServiceSpec

Manifest = dict[str, Any]
LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_LEADER = {"leaderworkerset.sigs.k8s.io/worker-index": "0"}


@dataclass(frozen=True)
class RenderConfig:
    default_image: str = DEFAULT_RUNTIME_IMAGE


def render(
    owner: Owner,
    spec: InferenceServiceSpec,
    plan: Plan,
    profile: GpuProfile,
    config: RenderConfig = RenderConfig(),
) -> list[Manifest]:
    """Manifests for a feasible plan, in apply order (ConfigMap, Services, workload)."""
    if not plan.feasible:
        raise ValueError("only a feasible plan renders")
    owner.check_name()
    image = runtime_image(spec, profile, config.default_image)
    served = served_model_name(spec, owner)
    multi_node = plan.pipeline_parallel > 1
    selector = {**labels(owner.name), **(LWS_LEADER if multi_node else {})}
    objects = [
        plan_configmap(owner, plan),
        service(owner, owner.name, selector, served, headless=False),
        service(owner, headless_service_name(owner.name), selector, served, headless=True),
        (leader_worker_set if multi_node else deployment)(owner, spec, plan, profile, image),
    ]
    return [finish(owner, obj) for obj in objects]


def deployment(
    owner: Owner, spec: InferenceServiceSpec, plan: Plan, profile: GpuProfile, image: str
) -> Manifest:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": owner.name},
        "spec": {
            "replicas": spec.replicas,
            "selector": {"matchLabels": labels(owner.name)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "progressDeadlineSeconds": 3600,
            "template": pod_template(owner, spec, plan, profile, image),
        },
    }


def leader_worker_set(
    owner: Owner, spec: InferenceServiceSpec, plan: Plan, profile: GpuProfile, image: str
) -> Manifest:
    return {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": {"name": owner.name},
        "spec": {
            "replicas": spec.replicas,
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0},
            },
            "leaderWorkerTemplate": {
                "size": plan.pipeline_parallel,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": pod_template(owner, spec, plan, profile, image, role="leader"),
                "workerTemplate": pod_template(owner, spec, plan, profile, image, role="worker"),
            },
        },
    }


def service(owner: Owner, name: str, selector: dict[str, str], served: str, headless: bool) -> Manifest:
    port = {"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}
    spec: dict[str, Any] = {"selector": selector, "ports": [port]}
    if headless:
        spec.update(clusterIP="None", publishNotReadyAddresses=False)
    else:
        spec["type"] = "ClusterIP"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "annotations": {SERVED_MODEL: served}},
        "spec": spec,
    }


def plan_configmap(owner: Owner, plan: Plan) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": plan_configmap_name(owner.name)},
        "data": {
            "plan.json": json.dumps(plan.to_status(), indent=2, sort_keys=True) + "\n",
            "summary": plan.summary,
        },
    }


def finish(owner: Owner, obj: Manifest) -> Manifest:
    """Namespace, labels, owner reference, and the hash of everything but the replica count."""
    meta = obj["metadata"]
    meta["namespace"] = owner.namespace
    meta["labels"] = {**labels(owner.name), **meta.get("labels", {})}
    meta["ownerReferences"] = [owner.reference()]
    meta.setdefault("annotations", {})[SPEC_HASH] = spec_hash(obj)
    return obj


def spec_hash(obj: Manifest) -> str:
    """Stable over replica changes (scaling must not look like a new spec, nor roll pods)."""
    body = {k: v for k, v in obj.items() if k != "metadata"}
    if isinstance(body.get("spec"), dict):
        body["spec"] = {k: v for k, v in body["spec"].items() if k != "replicas"}
    meta = {k: v for k, v in obj["metadata"].items() if k in ("labels", "annotations")}
    meta["annotations"] = {k: v for k, v in meta.get("annotations", {}).items() if k != SPEC_HASH}
    canonical = json.dumps({**body, "metadata": meta}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
