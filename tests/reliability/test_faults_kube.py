"""The control plane under faults (issue 17): the operator stopped and restarted mid-reconcile while the
Kubernetes API answers 409/500/503 (a fault-injecting proxy in front of kmock), and the gateway's
autoscaler writing /scale through 409s, 500s and an API that does not answer in time.

(Service-account token rotation under the gateway: tests/gateway/test_kube_token.py.)
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
from fault_proxy import FaultProxy
from gateway_testing import ServerThread, wait_until_async
from kmock import resource
from kvpilot.gateway.autoscale.kubernetes import KubernetesScaler
from kvpilot.gateway.autoscale.loop import Autoscaler
from kvpilot.gateway.config import AutoscalerSettings, KubeTarget, Limits, PoolConfig, PrefixSettings
from kvpilot.gateway.kube.client import KubeClient
from kvpilot.gateway.metrics import GatewayMetrics
from kvpilot.gateway.pool import PoolRegistry
from kvpilot.gateway.routing import RequestView

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
import kmock_cluster as kit

UID = "5d0c1b7e-8a3e-4f5e-9a7b-1c2d3e4f5a6b"
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
ISVC_BODY = {
    "apiVersion": "kvpilot.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "qwen3-8b", "namespace": "ml", "uid": UID, "generation": 1},
    "spec": {
        "model": {"uri": "hf://Qwen/Qwen3-8B", "config": QWEN3_8B},
        "gpu": {"profile": "h100-80gb"},
        "replicas": 2,
    },
}
CHILDREN = [
    ("configmaps", "qwen3-8b-plan"),
    ("deployments", "qwen3-8b"),
    ("services", "qwen3-8b"),
    ("services", "qwen3-8b-pods"),
]
RESTARTS = 3


def planned(k: Any) -> bool:
    body = kit.live(k, "inferenceservices", "qwen3-8b") or {}
    conditions = (body.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Planned" and c["status"] == "True" for c in conditions)


def converged(k: Any) -> bool:
    return planned(k) and kit.children(k, UID) == CHILDREN


@pytest.mark.slow
async def test_operator_restarted_mid_reconcile_under_api_faults_converges_without_duplicates() -> None:
    async with kit.emulated_cluster() as (k, url, api):
        proxy = FaultProxy(url)
        proxy.add({"POST", "PATCH", "PUT"}, "/namespaces/ml/", 409, 500, 503, 500, 409)
        with ServerThread(proxy.app()) as front:
            await api.create(ISVC_BODY)
            for _ in range(RESTARTS):  # stopped as soon as it has written something: mid-reconcile
                seen = len(kit.writes(k))
                async with kit.running_operator(front.url, None):
                    await kit.until(
                        lambda s=seen: len(kit.writes(k)) > s or converged(k), timeout=20, what="a write"
                    )
            async with kit.running_operator(front.url, None):
                await kit.until(
                    lambda: planned(k) and kit.children(k, UID) == CHILDREN, timeout=30, what="converged"
                )
                await kit.settle(k)
            assert kit.children(k, UID) == CHILDREN  # one of each: nothing duplicated by the restarts
            assert sum(proxy.injected.values()) == 5  # every injected fault was met and survived


ISVC = resource("kvpilot.dev", "v1alpha1", "inferenceservices")


async def test_autoscaler_writes_scale_through_conflicts_errors_and_timeouts(kmock) -> None:
    kmock.objects[ISVC, "ml", "chat"] = {
        "apiVersion": "kvpilot.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "chat", "namespace": "ml"},
        "spec": {"model": {"uri": "hf://x/y"}, "replicas": 0},
    }
    proxy = FaultProxy(str(kmock.url).rstrip("/"))
    proxy.add({"GET"}, "/scale", 500, 2.0)  # an error, then no answer within the client's timeout
    proxy.add({"PATCH"}, "/scale", 409, 500, 503)
    with ServerThread(proxy.app()) as front:
        client = KubeClient.from_url(front.url, timeout=0.5)
        spec = {"minReplicas": 0, "maxReplicas": 3, "targetQueueDepth": 2}
        config = PoolConfig(autoscaling=spec, inferenceService=KubeTarget(namespace="ml", name="chat"))
        registry = PoolRegistry(
            {"chat": config}, PoolConfig(), PrefixSettings(), Limits(holdTimeoutSeconds=30)
        )
        settings = AutoscalerSettings(intervalSeconds=0.05)
        autoscaler = Autoscaler(registry, KubernetesScaler(client), settings, GatewayMetrics())
        pool = registry.pools["chat"]
        held = asyncio.create_task(pool.acquire(RequestView((), 1)))
        loop = asyncio.create_task(autoscaler.run())
        try:
            await wait_until_async(
                lambda: kmock.objects[ISVC, "ml", "chat"]["spec"]["replicas"] == 1, timeout=30
            )
            assert not loop.done()  # the loop survived every fault
        finally:
            loop.cancel()
            held.cancel()
            await asyncio.gather(loop, held, return_exceptions=True)
            await client.aclose()
    assert proxy.injected == {"500": 2, "delay": 1, "409": 1, "503": 1}
