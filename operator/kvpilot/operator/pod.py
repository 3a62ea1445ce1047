"""The runtime pod template: container args from the plan, GPUs, scheduling from the GPU profile, probes."""

from __future__ import annotations

import math
from typing import Any

from kvpilot.operator.labels import ROLE_LABEL, Owner, labels
from kvpilot.operator.model_mount import model_mount
from kvpilot.operator.planning.plan import Plan
from kvpilot.operator.planning.profiles import GpuProfile
from kvpilot.operator.planning.sizing import BLOCK_SIZE, GIB
from kvpilot.operator.spec import InferenceServiceSpec

DEFAULT_RUNTIME_IMAGE = "ghcr.io/kvpilot/runtime:0.1.0"
PORT = 8000
DIST_PORT = 29500  # torch.distributed rendezvous on the leader pod (the runtime's default)
DRAFT_VOLUME, DRAFT_DIR = "draft-model", "/draft-models"  # spec.speculative.draftModel's files
GPU_RESOURCE = "nvidia.com/gpu"
STARTUP_PERIOD_S = 10
STARTUP_BASE_S = 1800  # 30 minutes to download and load, plus 10 s per GiB of weights


def served_model_name(spec: InferenceServiceSpec, owner: Owner) -> str:
    """spec.model.servedName, else the Hugging Face repo id, else the InferenceService's name."""
    if spec.model.served_name:
        return spec.model.served_name
    return spec.model.location if spec.model.scheme == "hf" else owner.name


def runtime_image(spec: InferenceServiceSpec, profile: GpuProfile, default: str) -> str:
    return spec.runtime.image or profile.runtime_image or default


def runtime_args(plan: Plan, served_name: str, model_dir: str) -> list[str]:
    """kvpilot-runtime flags (vLLM's names); every planned value is passed, supported or not."""
    args = [
        "--model",
        model_dir,
        "--served-model-name",
        served_name,
        "--host",
        "0.0.0.0",
        "--port",
        str(PORT),
        "--max-model-len",
        str(plan.max_model_len),
        "--max-num-seqs",
        str(plan.max_num_seqs),
        "--max-num-batched-tokens",
        str(plan.max_num_batched_tokens),
        "--block-size",
        str(BLOCK_SIZE),
        "--gpu-memory-utilization",
        f"{plan.gpu_memory_utilization:.2f}",
        "--kv-cache-dtype",
        plan.kv_cache_dtype,
        "--quantization",
        plan.quantization,
        "--tensor-parallel-size",
        str(plan.tensor_parallel),
    ]
    if plan.pipeline_parallel > 1:
        args += ["--pipeline-parallel-size", str(plan.pipeline_parallel)]
    return [*args, "--enable-prefix-caching"]


def pod_template(
    owner: Owner,
    spec: InferenceServiceSpec,
    plan: Plan,
    profile: GpuProfile,
    image: str,
    role: str = "server",
) -> dict[str, Any]:
    """role: server (Deployment pod), leader or worker (LeaderWorkerSet pods)."""
    mount = model_mount(spec.model, image, spec.runtime.env, plan.weight_bytes)
    mounts = [mount]
    args = runtime_args(plan, served_model_name(spec, owner), mount.model_dir)
    if spec.speculative is not None:
        draft_dir = None
        if spec.speculative.draft_model is not None:
            draft = model_mount(
                spec.speculative.draft_model,
                image,
                spec.runtime.env,
                plan.weight_bytes,
                volume_name=DRAFT_VOLUME,
                root=DRAFT_DIR,
            )
            mounts.append(draft)
            draft_dir = draft.model_dir
        args += ["--speculative-config", spec.speculative.runtime_config(draft_dir)]
    container: dict[str, Any] = {
        "name": "runtime",
        "image": image,
        "command": ["kvpilot-runtime"],
        "args": [*args, *spec.runtime.args],
        "resources": resources(spec.runtime.resources, plan.tensor_parallel),
        "volumeMounts": [*(m.mount for m in mounts), {"name": "dshm", "mountPath": "/dev/shm"}],
    }
    env = [*spec.runtime.env, *role_env(role)]
    if env:
        container["env"] = env
    if role != "worker":
        container["ports"] = [{"name": "http", "containerPort": PORT, "protocol": "TCP"}]
        container.update(probes(plan))
    if role == "leader":
        container["ports"].append({"name": "dist", "containerPort": DIST_PORT, "protocol": "TCP"})
    shm = {"medium": "Memory", "sizeLimit": f"{2 * plan.tensor_parallel}Gi"}
    pod_spec: dict[str, Any] = {
        "containers": [container],
        "volumes": [*(v for m in mounts for v in m.volumes), {"name": "dshm", "emptyDir": shm}],
        "terminationGracePeriodSeconds": 120,
    }
    init_containers = [c for m in mounts for c in m.init_containers]
    if init_containers:
        pod_spec["initContainers"] = init_containers
    if profile.node_selector:
        pod_spec["nodeSelector"] = dict(profile.node_selector)
    if profile.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in profile.tolerations]
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(PORT),
        "prometheus.io/path": "/metrics",
    }
    return {
        "metadata": {"labels": {**labels(owner.name), ROLE_LABEL: role}, "annotations": annotations},
        "spec": pod_spec,
    }


def role_env(role: str) -> list[dict[str, str]]:
    """Leader and worker pods learn their peers from the variables LeaderWorkerSet injects into every pod
    of a group: LWS_LEADER_ADDRESS (the rendezvous host), LWS_GROUP_SIZE (nodes = pipeline stages) and
    LWS_WORKER_INDEX (this node's stage; 0 is the leader). KVPILOT_ROLE=worker makes `kvpilot-runtime` run
    its node's ranks instead of the HTTP server; KVPILOT_DIST_PORT is the leader's rendezvous port."""
    if role == "server":
        return []
    return [
        {"name": "KVPILOT_ROLE", "value": role},
        {"name": "KVPILOT_DIST_PORT", "value": str(DIST_PORT)},
    ]


def resources(overrides: dict[str, Any], gpus: int) -> dict[str, Any]:
    """spec.runtime.resources with nvidia.com/gpu set to the plan's GPUs per pod (limits and requests)."""
    out = {key: dict(value) for key, value in overrides.items() if isinstance(value, dict)}
    out.update({k: v for k, v in overrides.items() if not isinstance(v, dict)})
    for kind in ("limits", "requests"):
        out.setdefault(kind, {})[GPU_RESOURCE] = gpus
    return out


def probes(plan: Plan) -> dict[str, Any]:
    """Ready only once /health answers (model loaded); startup tolerates long downloads and loads."""
    budget_s = STARTUP_BASE_S + 10 * math.ceil(plan.weight_bytes / GIB)
    return {
        "startupProbe": health_probe(STARTUP_PERIOD_S, 5, math.ceil(budget_s / STARTUP_PERIOD_S)),
        "readinessProbe": health_probe(5, 5, 3),
        "livenessProbe": health_probe(20, 10, 3),
    }


def health_probe(period_s: int, timeout_s: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": "/health", "port": "http"},
        "periodSeconds": period_s,
        "timeoutSeconds": timeout_s,
        "failureThreshold": failures,
    }
