"""The operator run with kopf against kmock over real HTTP: create, update, scale, infeasible, delete,
restart, profile changes, and a pass run twice."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from typing import Any

import pytest
from kvpilot.contracts.capabilities import EVERYTHING, RUNTIME
from kvpilot.operator.reconcile import reconcile
from kvpilot.operator.runner import OperatorConfig, make_deps

UID = "0b6a3c1e-1d2f-4c1a-9d7e-2f3a4b5c6d7e"
ISVC = {
    "apiVersion": "kvpilot.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "qwen3-8b", "namespace": "ml", "uid": UID, "generation": 1},
    "spec": {"model": {"uri": "hf://Qwen/Qwen3-8B"}, "gpu": {"profile": "h100-80gb"}, "replicas": 2},
}
API, KIND = "kvpilot.dev/v1alpha1", "InferenceService"


@pytest.fixture()
def fake_hub(model_configs: dict[str, dict[str, Any]]) -> Any:
    async def fetch(repo: str, revision: str) -> dict[str, Any]:
        return model_configs[repo]

    return fetch


def isvc(**spec: Any) -> dict[str, Any]:
    body = copy.deepcopy(ISVC)
    body["spec"].update(spec)
    return body


def condition(body: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for cond in ((body or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == kind:
            return cond
    return {}


def arg(deployment: dict[str, Any], flag: str) -> str:
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args[args.index(flag) + 1]


def spec_hash(obj: dict[str, Any]) -> str:
    return obj["metadata"]["annotations"]["kvpilot.dev/spec-hash"]


async def test_create_update_scale_ready_and_delete(kit: Any, fake_hub: Any) -> None:
    async with kit.emulated_cluster() as (k, url, api), kit.running_operator(url, fake_hub):
        await api.create(isvc())
        deployment = await kit.until(lambda: kit.live(k, "deployments", "qwen3-8b"), what="Deployment")
        for plural, name in (
            ("services", "qwen3-8b"),
            ("services", "qwen3-8b-pods"),
            ("configmaps", "qwen3-8b-plan"),
        ):
            obj = await kit.until(lambda p=plural, n=name: kit.live(k, p, n), what=name)
            assert obj["metadata"]["ownerReferences"][0]["uid"] == UID
            assert obj["metadata"]["labels"]["kvpilot.dev/inferenceservice"] == "qwen3-8b"
        assert deployment["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kvpilot"
        assert deployment["spec"]["replicas"] == 2
        assert arg(deployment, "--served-model-name") == "Qwen/Qwen3-8B"
        assert arg(deployment, "--tensor-parallel-size") == "1"
        body = await kit.until(
            lambda: (
                condition(kit.live(k, "inferenceservices", "qwen3-8b"), "Planned")
                and kit.live(k, "inferenceservices", "qwen3-8b")
            ),
            what="status",
        )
        status = body["status"]
        assert condition(body, "Planned")["status"] == "True" and status["plan"]["tensorParallel"] == 1
        assert status["phase"] == "Progressing" and status["ready"] == "0/2"
        assert status["selector"] == (
            "app.kubernetes.io/managed-by=kvpilot,kvpilot.dev/inferenceservice=qwen3-8b"
        )
        assert status["endpoint"] == "http://qwen3-8b.ml.svc:8000"
        await kit.until(lambda: any(e[1] == "Planned" for e in kit.events(k)), what="Planned event")

        # Update: a longer context re-renders the Deployment (new hash); the Services keep theirs.
        first_hash, service_hash = spec_hash(deployment), spec_hash(kit.live(k, "services", "qwen3-8b"))
        longer = {"metadata": {"generation": 2}, "spec": {"workload": {"maxModelLen": 16384}}}
        await api.merge_patch(API, KIND, "ml", "qwen3-8b", longer)
        rolled = await kit.until(
            lambda: (d := kit.live(k, "deployments", "qwen3-8b")) and spec_hash(d) != first_hash and d,
            what="re-rendered Deployment",
        )
        assert arg(rolled, "--max-model-len") == "16384"
        assert spec_hash(kit.live(k, "services", "qwen3-8b")) == service_hash
        await kit.until(lambda: any(e[1] == "Rolled" for e in kit.events(k)), what="Rolled event")

        # Scale through /scale: the Deployment follows, its hash does not change (no pod roll).
        rolled_hash = spec_hash(rolled)
        await api.merge_patch(API, KIND, "ml", "qwen3-8b", {"spec": {"replicas": 3}}, subresource="scale")
        scaled = await kit.until(
            lambda: (d := kit.live(k, "deployments", "qwen3-8b")) and d["spec"]["replicas"] == 3 and d,
            what="scaled Deployment",
        )
        assert spec_hash(scaled) == rolled_hash

        # The Deployment reports ready pods: the InferenceService becomes Ready.
        await api.merge_patch(
            "apps/v1",
            "Deployment",
            "ml",
            "qwen3-8b",
            {"status": {"replicas": 3, "readyReplicas": 3}},
            subresource="status",
        )
        ready = await kit.until(
            lambda: (
                (b := kit.live(k, "inferenceservices", "qwen3-8b"))
                and b["status"].get("phase") == "Ready"
                and b
            ),
            what="Ready",
        )
        assert condition(ready, "Ready")["status"] == "True" and ready["status"]["ready"] == "3/3"
        assert ready["status"]["observedGeneration"] == 2

        # Delete: nothing blocks it (no finalizer); the garbage collector removes the owned children.
        # (Settle first: a pass still in flight may re-create a child; a real garbage collector removes
        # such a child too, because its owner reference points at an object that no longer exists.)
        assert not (ready["metadata"].get("finalizers") or [])
        await kit.settle(k)
        await api.delete(API, KIND, "ml", "qwen3-8b")
        owned = kit.children(k, UID)
        assert owned == [
            ("configmaps", "qwen3-8b-plan"),
            ("deployments", "qwen3-8b"),
            ("services", "qwen3-8b"),
            ("services", "qwen3-8b-pods"),
        ]
        for plural, name in owned:  # what the cluster's garbage collector does with owner references
            api_version, kind = {
                "configmaps": ("v1", "ConfigMap"),
                "services": ("v1", "Service"),
                "deployments": ("apps/v1", "Deployment"),
            }[plural]
            await api.delete(api_version, kind, "ml", name)
        creates_before = len([w for w in kit.writes(k) if w[0] == "POST"])
        await asyncio.sleep(0.5)
        assert kit.children(k, UID) == []
        assert [w for w in kit.writes(k) if w[0] == "POST"][creates_before:] == []


async def test_infeasible_spec_gets_a_condition_and_an_event(kit: Any, fake_hub: Any) -> None:
    body = isvc(model={"uri": "hf://meta-llama/Llama-3.1-405B-Instruct"}, gpu={"profile": "l4", "count": 1})
    async with kit.emulated_cluster() as (k, url, api), kit.running_operator(url, fake_hub):
        await api.create(body)
        failed = await kit.until(
            lambda: (b := kit.live(k, "inferenceservices", "qwen3-8b")) and condition(b, "Planned") and b,
            what="Planned condition",
        )
        planned = condition(failed, "Planned")
        assert (planned["status"], planned["reason"]) == ("False", "Infeasible")
        assert planned["message"].startswith("does not fit:") and "1 x l4 offer" in planned["message"]
        assert failed["status"]["phase"] == "Failed" and failed["status"]["plan"]["feasible"] is False
        warning = await kit.until(lambda: [e for e in kit.events(k) if e[0] == "Warning"], what="Warning")
        assert warning[0][1] == "Infeasible" and "does not fit" in warning[0][2]
        await asyncio.sleep(0.3)  # no crash loop: no retries, no workload
        assert kit.live(k, "deployments", "qwen3-8b") is None
        assert len([e for e in kit.events(k) if e[0] == "Warning"]) == 1


async def test_a_plan_this_runtime_cannot_run_is_not_applied(kit: Any, fake_hub: Any) -> None:
    """70B on 4 H100s fits at tensor parallel 4, which a runtime without tensor parallelism can't run:
    Planned=False with that plan and a Warning, and no workload (a pod that would exit 2 on its flags is
    never created)."""
    body = isvc(
        model={"uri": "hf://meta-llama/Llama-3.3-70B-Instruct"},
        gpu={"profile": "h100-80gb", "count": 4},
        parallelism={"tensor": 4},
    )
    async with kit.emulated_cluster() as (k, _, api):
        await api.create(body)
        deps = make_deps(api, fake_hub, OperatorConfig())
        deps.capabilities = dataclasses.replace(RUNTIME, max_tensor_parallel=1, max_pipeline_parallel=1)
        events: list[tuple[str, str, str]] = []
        deps.record = lambda body, type, reason, message: events.append((type, reason, message))
        result = await reconcile(kit.live(k, "inferenceservices", "qwen3-8b"), deps)
        assert result.applied is None
        live = kit.live(k, "inferenceservices", "qwen3-8b")
        planned = condition(live, "Planned")
        assert (planned["status"], planned["reason"]) == ("False", "UnsupportedByRuntime")
        assert planned["message"].startswith("needs tensor parallel 4, which this runtime cannot run")
        assert live["status"]["plan"]["feasible"] is False
        assert events[0][:2] == ("Warning", "UnsupportedByRuntime")
        assert kit.live(k, "deployments", "qwen3-8b") is None


async def test_restart_resumes_without_duplicates(kit: Any, fake_hub: Any) -> None:
    async with kit.emulated_cluster() as (k, url, api):
        async with kit.running_operator(url, fake_hub):
            await api.create(isvc())
            await kit.until(
                lambda: condition(kit.live(k, "inferenceservices", "qwen3-8b"), "Planned"), what="first run"
            )
            await kit.until(lambda: kit.live(k, "deployments", "qwen3-8b"), what="Deployment")
        before = (
            kit.writes(k, "/namespaces/ml/deployments")
            + kit.writes(k, "/services")
            + kit.writes(k, "/configmaps/")
        )
        gets_before = len([r for r in list(k) if r.url.path.endswith("/deployments/qwen3-8b")])
        async with kit.running_operator(url, fake_hub):
            await kit.until(
                lambda: (
                    len([r for r in list(k) if r.url.path.endswith("/deployments/qwen3-8b")]) > gets_before
                ),
                what="resumed pass",
            )
            await asyncio.sleep(0.2)
        after = (
            kit.writes(k, "/namespaces/ml/deployments")
            + kit.writes(k, "/services")
            + kit.writes(k, "/configmaps/")
        )
        assert after == before
        assert kit.children(k, UID) == [
            ("configmaps", "qwen3-8b-plan"),
            ("deployments", "qwen3-8b"),
            ("services", "qwen3-8b"),
            ("services", "qwen3-8b-pods"),
        ]


async def test_a_pass_run_twice_does_no_harm(kit: Any, fake_hub: Any) -> None:
    """Two passes racing on a new object (AlreadyExists is a normal outcome), then a no-op third."""
    async with kit.emulated_cluster() as (k, _, api):
        await api.create(isvc())
        deps = make_deps(api, fake_hub, OperatorConfig())
        deps.record = lambda body, type, reason, message: None
        body = kit.live(k, "inferenceservices", "qwen3-8b")
        first, second = await asyncio.gather(reconcile(body, deps), reconcile(body, deps))
        assert first.applied is not None and second.applied is not None
        assert sorted(first.applied.created + second.applied.created) == [
            "ConfigMap/qwen3-8b-plan",
            "Deployment/qwen3-8b",
            "Service/qwen3-8b",
            "Service/qwen3-8b-pods",
        ]
        assert kit.children(k, UID) == [
            ("configmaps", "qwen3-8b-plan"),
            ("deployments", "qwen3-8b"),
            ("services", "qwen3-8b"),
            ("services", "qwen3-8b-pods"),
        ]
        writes = len(kit.writes(k))
        third = await reconcile(kit.live(k, "inferenceservices", "qwen3-8b"), deps)
        assert third.applied is not None and not third.applied.changed and third.status_patch is None
        assert len(kit.writes(k)) == writes


async def test_gpu_profile_change_reschedules(kit: Any, fake_hub: Any) -> None:
    profiles = (
        "- {name: h100-80gb, memoryGiB: 79.65, bandwidthGBps: 3350, bf16Tflops: 989, fp8: true,"
        " interconnect: nvlink, nodeSelector: {pool: h100-spot}, tolerations: []}\n"
    )
    async with kit.emulated_cluster() as (k, url, api), kit.running_operator(url, fake_hub):
        await api.create(isvc())
        deployment = await kit.until(lambda: kit.live(k, "deployments", "qwen3-8b"), what="Deployment")
        selector = deployment["spec"]["template"]["spec"]["nodeSelector"]
        assert selector == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
        await api.create(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "kvpilot-gpu-profiles", "namespace": "ml"},
                "data": {"profiles.yaml": profiles},
            }
        )
        applied = await kit.until(lambda: kit.applied_bodies(k, "/deployments/qwen3-8b"), what="re-apply")
        pod = applied[-1]["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"pool": "h100-spot"} and "tolerations" not in pod
        # kmock merges patches instead of applying them, so the old selector key stays there as well.
        moved = kit.live(k, "deployments", "qwen3-8b")
        assert moved is not None and moved["spec"]["template"]["spec"]["nodeSelector"]["pool"] == "h100-spot"


async def test_multi_node_plan_swaps_deployment_for_leader_worker_set(kit: Any, fake_hub: Any) -> None:
    async with kit.emulated_cluster() as (k, _, api):
        await api.create(isvc())
        deps = make_deps(api, fake_hub, OperatorConfig())
        deps.record = lambda body, type, reason, message: None
        deps.capabilities = EVERYTHING  # a runtime with pipeline parallelism (this build has none)
        await reconcile(kit.live(k, "inferenceservices", "qwen3-8b"), deps)
        assert kit.live(k, "deployments", "qwen3-8b") is not None
        bigger = {
            "spec": {
                "model": {"uri": "hf://meta-llama/Llama-3.1-405B-Instruct"},
                "gpu": {"profile": "l4", "count": 16},
            }
        }
        await api.merge_patch(API, KIND, "ml", "qwen3-8b", bigger)
        result = await reconcile(kit.live(k, "inferenceservices", "qwen3-8b"), deps)
        assert result.applied is not None and result.applied.deleted == ["Deployment/qwen3-8b"]
        lws = kit.live(k, "leaderworkersets", "qwen3-8b")
        assert lws is not None and lws["spec"]["leaderWorkerTemplate"]["size"] == 2
        assert kit.live(k, "deployments", "qwen3-8b") is None
        assert kit.live(k, "inferenceservices", "qwen3-8b")["status"]["plan"]["pipelineParallel"] == 2
