"""Rendering is pure; rendered manifests pass kubernetes-validate (Kubernetes 1.33 schemas, strict).

Plans come from the planner's full table (capabilities.EVERYTHING) where a test needs what this runtime
build can't run yet (tensor parallel, LeaderWorkerSets): rendering them stays correct for when it can.
tests/contracts/ checks that what the operator renders with this runtime's capabilities is runnable.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
from kvpilot.contracts.capabilities import EVERYTHING
from kvpilot.operator.labels import InvalidNameError, Owner
from kvpilot.operator.planning.plan import Plan
from kvpilot.operator.planning.profiles import ProfileStore, parse_profiles
from kvpilot.operator.render import RenderConfig, render

K8S_VERSION = "1.33.0"
LABELS = {"app.kubernetes.io/managed-by": "kvpilot"}
MULTI_NODE = {
    "apiVersion": "kvpilot.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "llama-405b"},
    "spec": {
        "model": {"uri": "hf://meta-llama/Llama-3.1-405B-Instruct"},
        "gpu": {"profile": "l4", "count": 16},
        "replicas": 2,
    },
}
# The fields of LeaderWorkerSet v1 (sigs.k8s.io/lws) the operator writes; pod templates are checked apart.
LWS_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"enum": ["leaderworkerset.x-k8s.io/v1"]},
        "kind": {"enum": ["LeaderWorkerSet"]},
        "spec": {
            "type": "object",
            "required": ["leaderWorkerTemplate"],
            "additionalProperties": False,
            "properties": {
                "replicas": {"type": "integer", "minimum": 0},
                "startupPolicy": {"enum": ["LeaderCreated", "LeaderReady"]},
                "rolloutStrategy": {"type": "object"},
                "leaderWorkerTemplate": {
                    "type": "object",
                    "required": ["workerTemplate"],
                    "additionalProperties": False,
                    "properties": {
                        "size": {"type": "integer", "minimum": 1},
                        "restartPolicy": {"enum": ["RecreateGroupOnPodRestart", "None"]},
                        "leaderTemplate": {"type": "object"},
                        "workerTemplate": {"type": "object"},
                    },
                },
            },
        },
    },
}

Render = Callable[..., list[dict[str, Any]]]


@pytest.fixture()
def rendered(planned: Callable[..., Any]) -> Render:
    def run(manifest: dict[str, Any], **kwargs: Any) -> list[dict[str, Any]]:
        p = planned(manifest, **kwargs)
        assert p.plan.feasible, p.plan.reason
        return render(p.owner, p.spec, p.plan, p.profile)

    return run


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        o["kind"] + ("/headless" if o["spec"].get("clusterIP") == "None" else ""): o
        for o in objects
        if "spec" in o
    } | {o["kind"]: o for o in objects if "spec" not in o}


def container(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]["containers"][0]


def args_dict(args: list[str]) -> dict[str, str]:
    out, i = {}, 0
    while i < len(args):
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[args[i]] = args[i + 1]
            i += 2
        else:
            out[args[i]] = ""
            i += 1
    return out


def test_every_example_renders_valid_manifests(rendered: Render, examples: dict[str, Any]) -> None:
    for name, manifest in examples.items():
        objects = rendered(manifest, capabilities=EVERYTHING)
        assert [o["kind"] for o in objects] == ["ConfigMap", "Service", "Service", "Deployment"], name
        for obj in objects:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
            meta = obj["metadata"]
            assert meta["labels"] == {**LABELS, "kvpilot.dev/inferenceservice": manifest["metadata"]["name"]}
            assert meta["ownerReferences"] == [
                {
                    "apiVersion": "kvpilot.dev/v1alpha1",
                    "kind": "InferenceService",
                    "uid": "uid-1234",
                    "name": manifest["metadata"]["name"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ]
            assert len(meta["annotations"]["kvpilot.dev/spec-hash"]) == 16


def test_runtime_args_follow_the_plan(
    rendered: Render, planned: Callable[..., Any], examples: dict[str, Any]
) -> None:
    manifest = examples["llama-70b-4xh100"]
    plan: Plan = planned(manifest, capabilities=EVERYTHING).plan
    deployment = by_kind(rendered(manifest, capabilities=EVERYTHING))["Deployment"]
    c = container(deployment)
    assert c["command"] == ["kvpilot-runtime"]
    assert c["args"] == [
        "--model",
        "/models/meta-llama/Llama-3.3-70B-Instruct",
        "--served-model-name",
        "llama-3.3-70b-instruct",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--max-model-len",
        "16384",
        "--max-num-seqs",
        "64",
        "--max-num-batched-tokens",
        str(plan.max_num_batched_tokens),
        "--block-size",
        "16",
        "--gpu-memory-utilization",
        "0.90",
        "--kv-cache-dtype",
        "bf16",
        "--quantization",
        "none",
        "--tensor-parallel-size",
        "4",
        "--enable-prefix-caching",
    ]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": 4}, "requests": {"nvidia.com/gpu": 4}}
    assert deployment["spec"]["replicas"] == 1


def test_scheduling_probes_and_shm(rendered: Render, examples: dict[str, Any]) -> None:
    pod = by_kind(rendered(examples["qwen3-8b-h100"]))["Deployment"]["spec"]["template"]
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    c = spec["containers"][0]
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 1800  # long model loads
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2Gi"}} in spec["volumes"]
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == "8000"


def test_hf_source_downloads_in_an_init_container(rendered: Render, examples: dict[str, Any]) -> None:
    spec = by_kind(rendered(examples["qwen3-8b-h100"]))["Deployment"]["spec"]["template"]["spec"]
    (init,) = spec["initContainers"]
    env = {e["name"]: e.get("value") for e in init["env"]}
    assert init["image"] == "ghcr.io/kvpilot/runtime:0.1.0" and init["command"][:2] == ["python", "-c"]
    assert "snapshot_download" in init["command"][2]
    assert env["HF_REPO"] == "Qwen/Qwen3-8B" and env["HF_REVISION"] == "main"
    assert env["MODEL_DIR"] == "/models/model"
    assert init["volumeMounts"] == [{"name": "model", "mountPath": "/models"}]
    assert spec["volumes"][0]["name"] == "model" and "emptyDir" in spec["volumes"][0]
    c = spec["containers"][0]
    assert args_dict(c["args"])["--model"] == "/models/model"
    assert {"name": "model", "mountPath": "/models", "readOnly": True} in c["volumeMounts"]


def test_pvc_source_is_mounted_read_only(rendered: Render, examples: dict[str, Any]) -> None:
    llama = rendered(examples["llama-70b-4xh100"], capabilities=EVERYTHING)
    spec = by_kind(llama)["Deployment"]["spec"]["template"]["spec"]
    assert "initContainers" not in spec
    assert spec["volumes"][0] == {
        "name": "model",
        "persistentVolumeClaim": {"claimName": "model-store", "readOnly": True},
    }


def test_s3_source_syncs_with_credentials_from_runtime_env(
    rendered: Render, examples: dict[str, Any]
) -> None:
    deployment = by_kind(rendered(examples["scale-to-zero"]))["Deployment"]
    (init,) = deployment["spec"]["template"]["spec"]["initContainers"]
    assert init["command"] == [
        "aws",
        "s3",
        "sync",
        "s3://models/qwen/Qwen3-8B",
        "/models/model",
        "--only-show-errors",
    ]
    assert [e["name"] for e in init["env"]] == ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
    assert [e["name"] for e in container(deployment)["env"]] == ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
    assert deployment["spec"]["replicas"] == 0


def test_services_and_plan_configmap(rendered: Render, examples: dict[str, Any]) -> None:
    objects = by_kind(rendered(examples["small-model-l4"]))
    service, headless = objects["Service"], objects["Service/headless"]
    assert service["metadata"]["name"] == "qwen3-0-6b" and headless["metadata"]["name"] == "qwen3-0-6b-pods"
    assert (
        service["spec"]["selector"]
        == headless["spec"]["selector"]
        == {**LABELS, "kvpilot.dev/inferenceservice": "qwen3-0-6b"}
    )
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}
    ]
    assert service["metadata"]["annotations"]["kvpilot.dev/served-model-name"] == "Qwen/Qwen3-0.6B"
    configmap = objects["ConfigMap"]
    assert configmap["metadata"]["name"] == "qwen3-0-6b-plan"
    assert '"tensorParallel": 1' in configmap["data"]["plan.json"]


def test_multi_node_plan_renders_a_leader_worker_set(rendered: Render) -> None:
    objects = rendered(MULTI_NODE, capabilities=EVERYTHING)
    assert [o["kind"] for o in objects] == ["ConfigMap", "Service", "Service", "LeaderWorkerSet"]
    lws = objects[-1]
    jsonschema.validate(lws, LWS_SCHEMA)
    template = lws["spec"]["leaderWorkerTemplate"]
    assert (lws["spec"]["replicas"], template["size"]) == (2, 2)
    for role in ("leader", "worker"):
        pod = template[f"{role}Template"]
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"lws-{role}"}, "template": pod},
            K8S_VERSION,
            strict=True,
        )
        c = pod["spec"]["containers"][0]
        assert args_dict(c["args"])["--pipeline-parallel-size"] == "2"
        assert args_dict(c["args"])["--tensor-parallel-size"] == "8"
        assert {"name": "KVPILOT_ROLE", "value": role} in c["env"]
        assert {"name": "KVPILOT_DIST_PORT", "value": "29500"} in c["env"]  # the runtime's rendezvous port
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 8  # one stage of tp 8 per pod
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        assert ports == ({"http": 8000, "dist": 29500} if role == "leader" else {})
        assert ("readinessProbe" in c) == (role == "leader")
    assert objects[1]["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    for obj in objects[:3]:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_spec_hash_ignores_replicas_and_follows_the_pod_spec(
    rendered: Render, examples: dict[str, Any]
) -> None:
    base = examples["qwen3-8b-h100"]
    scaled = copy.deepcopy(base)
    scaled["spec"]["replicas"] = 7
    longer = copy.deepcopy(base)
    longer["spec"]["workload"]["maxModelLen"] = 16384

    def hashes(manifest: dict[str, Any]) -> dict[str, str]:
        return {
            o["kind"] + o["metadata"]["name"]: o["metadata"]["annotations"]["kvpilot.dev/spec-hash"]
            for o in rendered(manifest)
        }

    assert hashes(base) == hashes(copy.deepcopy(base))
    assert hashes(scaled) == hashes(base)
    changed = {k for k, v in hashes(longer).items() if hashes(base)[k] != v}
    assert changed == {"Deploymentqwen3-8b", "ConfigMapqwen3-8b-plan"}


def test_runtime_overrides(rendered: Render, examples: dict[str, Any]) -> None:
    manifest = copy.deepcopy(examples["qwen3-8b-h100"])
    manifest["spec"]["runtime"] = {
        "image": "registry.example.com/runtime:dev",
        "args": ["--enforce-eager"],
        "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
        "resources": {"limits": {"memory": "64Gi", "nvidia.com/gpu": 8}, "requests": {"cpu": "8"}},
    }
    deployment = by_kind(rendered(manifest))["Deployment"]
    kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)
    c = container(deployment)
    assert c["image"] == "registry.example.com/runtime:dev" and c["args"][-1] == "--enforce-eager"
    assert c["resources"] == {
        "limits": {"memory": "64Gi", "nvidia.com/gpu": 1},
        "requests": {"cpu": "8", "nvidia.com/gpu": 1},
    }
    (init,) = deployment["spec"]["template"]["spec"]["initContainers"]
    assert init["env"][-1]["name"] == "HF_TOKEN" and init["image"] == "registry.example.com/runtime:dev"


def test_admin_profile_scheduling_and_image(rendered: Render, examples: dict[str, Any]) -> None:
    store = ProfileStore()
    store.load_admin(
        parse_profiles(
            "- {name: h100-80gb, memoryGiB: 79.65, bandwidthGBps: 3350, bf16Tflops: 989, fp8: true,"
            " interconnect: nvlink, nodeSelector: {pool: h100},"
            " tolerations: [{key: dedicated, operator: Exists}],"
            " runtimeImage: registry.example.com/runtime:cu128}",
            "admin",
        )
    )
    spec = by_kind(rendered(examples["qwen3-8b-h100"], store=store))["Deployment"]["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"pool": "h100"}
    assert spec["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert spec["containers"][0]["image"] == "registry.example.com/runtime:cu128"


def test_default_image_is_configurable(planned: Callable[..., Any], examples: dict[str, Any]) -> None:
    p = planned(examples["small-model-l4"])
    objects = render(p.owner, p.spec, p.plan, p.profile, RenderConfig(default_image="mirror.local/rt:1"))
    assert container(objects[-1])["image"] == "mirror.local/rt:1"


def test_refuses_infeasible_plans_and_bad_names(
    planned: Callable[..., Any], examples: dict[str, Any]
) -> None:
    p = planned(examples["small-model-l4"])
    with pytest.raises(ValueError, match="only a feasible plan renders"):
        render(p.owner, p.spec, Plan(feasible=False, gpu_profile="l4", reason="x"), p.profile)
    with pytest.raises(InvalidNameError, match="DNS-1035 label of at most 58"):
        render(Owner("x" * 59, "ml", "u"), p.spec, p.plan, p.profile)
