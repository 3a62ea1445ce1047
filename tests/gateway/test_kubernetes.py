"""Cluster mode against kmock over real HTTP: /scale writes, the Lease, EndpointSlice discovery, and the
autoscaler writing /scale for a held request."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from gateway_testing import wait_until_async
from kmock import KubernetesError, Request, resource
from kvpilot.gateway.autoscale.kubernetes import KubernetesScaler
from kvpilot.gateway.autoscale.loop import Autoscaler
from kvpilot.gateway.config import AutoscalerSettings, KubeTarget, Limits, PoolConfig, PrefixSettings
from kvpilot.gateway.kube.client import KubeClient, KubeError
from kvpilot.gateway.kube.discovery import KubernetesDiscovery, build_pools
from kvpilot.gateway.kube.lease import LeaseElector, lease_action
from kvpilot.gateway.metrics import GatewayMetrics
from kvpilot.gateway.pool import Pool, PoolRegistry
from kvpilot.gateway.routing import RequestView

ISVC = resource("kvpilot.dev", "v1alpha1", "inferenceservices")
SLICES = resource("discovery.k8s.io", "v1", "endpointslices")
LEASES = resource("coordination.k8s.io", "v1", "leases")
LABELS = {"app.kubernetes.io/managed-by": "kvpilot", "kvpilot.dev/inferenceservice": "chat"}


def isvc(replicas: int = 0, autoscaling: dict | None = None) -> dict:
    spec = {
        "model": {"uri": "hf://Qwen/Qwen3-8B", "servedName": "qwen3-8b"},
        "replicas": replicas,
        "autoscaling": autoscaling or {"minReplicas": 0, "maxReplicas": 3, "targetQueueDepth": 2},
    }
    return {
        "apiVersion": "kvpilot.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "chat", "namespace": "ml"},
        "spec": spec,
    }


def endpoint_slice(name: str, ips: list[str], ready: bool = True, labels: dict | None = None) -> dict:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "ml", "labels": labels or LABELS},
        "ports": [{"name": "http", "port": 8000}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": ready}} for ip in ips],
    }


@pytest.fixture
async def kube(kmock) -> KubeClient:
    client = KubeClient.from_url(str(kmock.url).rstrip("/"))
    yield client
    await client.aclose()


async def test_scaler_reads_and_patches_the_scale_subresource(kmock, kube) -> None:
    kmock.objects[ISVC, "ml", "chat"] = isvc(replicas=1)
    pool = Pool(
        "qwen3-8b",
        PoolConfig(inferenceService=KubeTarget(namespace="ml", name="chat")),
        PrefixSettings(),
        Limits(),
    )
    scaler = KubernetesScaler(kube)
    assert await scaler.current_replicas(pool) == 1
    await scaler.scale(pool, 3, "test")
    assert kmock.objects[ISVC, "ml", "chat"]["spec"]["replicas"] == 3
    patch = next(r for r in kmock if r.method == "PATCH")
    assert patch.url.path == "/apis/kvpilot.dev/v1alpha1/namespaces/ml/inferenceservices/chat/scale"
    assert patch.headers["Content-Type"] == "application/merge-patch+json"
    assert patch.data == {"spec": {"replicas": 3}}
    assert await scaler.current_replicas(Pool("x", PoolConfig(), PrefixSettings(), Limits())) is None


def _leases_with_update(kmock) -> None:
    """kmock has no PUT (update) nor resourceVersion: emulate both, as the real API server does."""

    def update(request: Request) -> dict:
        stored = kmock.objects[LEASES, request.namespace, request.name]
        version = stored.get("metadata", {}).get("resourceVersion")
        if request.data["metadata"].get("resourceVersion") != version:
            raise KubernetesError(status=409, reason="Conflict", message="resourceVersion changed")
        body = dict(request.data)
        body["metadata"] = {**body["metadata"], "resourceVersion": str(int(version or 0) + 1)}
        kmock.objects[LEASES, request.namespace, request.name] = body
        return body

    kmock["put", LEASES] << update


async def test_lease_create_renew_follow_and_take_over(kmock, kube) -> None:
    _leases_with_update(kmock)
    clock = [dt.datetime(2026, 1, 1, tzinfo=dt.UTC)]
    first = LeaseElector(kube, "gw", "autoscaler", "gw-a", duration_seconds=15, clock=lambda: clock[0])
    second = LeaseElector(kube, "gw", "autoscaler", "gw-b", duration_seconds=15, clock=lambda: clock[0])
    assert await first.try_acquire_or_renew() and first.is_leader()
    assert kmock.objects[LEASES, "gw", "autoscaler"]["spec"]["holderIdentity"] == "gw-a"
    assert not await second.try_acquire_or_renew() and not second.is_leader()
    clock[0] += dt.timedelta(seconds=10)
    assert await first.try_acquire_or_renew()  # renew (an update, not a second create)
    assert kmock.objects[LEASES, "gw", "autoscaler"]["spec"]["renewTime"].startswith("2026-01-01T00:00:10")
    clock[0] += dt.timedelta(seconds=20)  # gw-a stopped renewing: its lease expired
    assert not first.is_leader()
    assert await second.try_acquire_or_renew() and second.is_leader()
    lease = kmock.objects[LEASES, "gw", "autoscaler"]
    assert lease["spec"]["holderIdentity"] == "gw-b" and lease["spec"]["leaseTransitions"] == 1
    assert not await first.try_acquire_or_renew()
    scaler = KubernetesScaler(kube, first)
    assert not scaler.can_write() and KubernetesScaler(kube, second).can_write()


def test_lease_action_table() -> None:
    now = dt.datetime(2026, 1, 1, 0, 1, tzinfo=dt.UTC)
    held = {
        "spec": {
            "holderIdentity": "b",
            "renewTime": "2026-01-01T00:00:55.000000Z",
            "leaseDurationSeconds": 15,
        }
    }
    assert lease_action(None, "a", now) == "create"
    assert lease_action(held, "a", now) == "follow"
    assert lease_action(held, "b", now) == "renew"
    assert lease_action(held, "a", now + dt.timedelta(seconds=11)) == "acquire"
    assert lease_action({"spec": {}}, "a", now) == "acquire"


async def test_lease_race_loser_gets_409_and_follows(kmock, kube) -> None:
    _leases_with_update(kmock)
    kmock.objects[LEASES, "gw", "l"] = {
        "metadata": {"name": "l", "namespace": "gw", "resourceVersion": "5"},
        "spec": {"holderIdentity": "old", "renewTime": "2000-01-01T00:00:00Z", "leaseDurationSeconds": 15},
    }
    elector = LeaseElector(kube, "gw", "l", "me")
    original_get = kube.get

    async def stale_get(path: str) -> dict | None:  # another gateway updates between our read and write
        lease = await original_get(path)
        stored = kmock.objects[LEASES, "gw", "l"]
        stored["metadata"] = {**stored["metadata"], "resourceVersion": "6"}
        return lease

    kube.get = stale_get
    assert not await elector.try_acquire_or_renew() and not elector.is_leader()
    with pytest.raises(KubeError):
        await kube.replace("/apis/coordination.k8s.io/v1/namespaces/gw/leases/l", {"metadata": {}})


def test_build_pools_maps_services_to_ready_endpoints() -> None:
    slices = [
        endpoint_slice("chat-1", ["10.0.0.1", "10.0.0.2"]),
        endpoint_slice("chat-2", ["10.0.0.3"], ready=False),
        endpoint_slice("other", ["10.9.9.9"], labels={"app": "x"}),
    ]
    pools = build_pools([isvc()], slices, PoolConfig(), {"windowSeconds": 20, "targetQueueDepth": 9})
    config, urls = pools["qwen3-8b"]
    assert urls == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert config.inference_service == KubeTarget(namespace="ml", name="chat")
    scaling = config.autoscaling
    assert (scaling.window_seconds, scaling.target_queue_depth, scaling.max_replicas) == (20, 2, 3)
    invalid = isvc(autoscaling={"minReplicas": 5, "maxReplicas": 1})
    assert build_pools([invalid], [], PoolConfig(), {})["qwen3-8b"][0].autoscaling is None


def test_pool_name_is_the_served_model_name_the_operator_wrote() -> None:
    """The operator gives the runtime --served-model-name and writes it to status.servedModelName (for an hf://
    model without spec.model.servedName: the repo id); before its first pass, servedName or the name."""
    body = isvc()
    del body["spec"]["model"]["servedName"]
    assert set(build_pools([body], [], PoolConfig(), {})) == {"chat"}
    body["status"] = {"servedModelName": "Qwen/Qwen3-8B"}
    assert set(build_pools([body], [], PoolConfig(), {})) == {"Qwen/Qwen3-8B"}


async def test_discovery_lists_then_follows_watch_events(kmock, kube) -> None:
    kmock.objects[ISVC, "ml", "chat"] = isvc()
    kmock.objects[SLICES, "ml", "chat-1"] = endpoint_slice("chat-1", ["10.0.0.1"])
    registry = PoolRegistry({}, PoolConfig(), PrefixSettings(), Limits())
    discovery = KubernetesDiscovery(kube, "ml", PoolConfig(), retry_seconds=0.05)
    task = asyncio.create_task(discovery.run(registry))
    try:
        await wait_until_async(
            lambda: (
                "qwen3-8b" in registry.pools
                and set(registry.pools["qwen3-8b"].replicas) == {"http://10.0.0.1:8000"}
            )
        )
        pool = registry.pools["qwen3-8b"]
        assert pool.config.autoscaling.max_replicas == 3
        await kube.create(
            "/apis/discovery.k8s.io/v1/namespaces/ml/endpointslices", endpoint_slice("chat-2", ["10.0.0.2"])
        )
        await wait_until_async(lambda: set(pool.replicas) == {"http://10.0.0.1:8000", "http://10.0.0.2:8000"})
        await kube.http.delete("/apis/discovery.k8s.io/v1/namespaces/ml/endpointslices/chat-1")
        await wait_until_async(lambda: set(pool.replicas) == {"http://10.0.0.2:8000"})
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_autoscaler_scales_from_zero_through_scale_for_a_held_request(kmock, kube) -> None:
    kmock.objects[ISVC, "ml", "chat"] = isvc(replicas=0)
    spec = {"minReplicas": 0, "maxReplicas": 3, "targetQueueDepth": 2}
    config = PoolConfig(autoscaling=spec, inferenceService=KubeTarget(namespace="ml", name="chat"))
    limits = Limits(holdTimeoutSeconds=0.5)
    registry = PoolRegistry({"qwen3-8b": config}, PoolConfig(), PrefixSettings(), limits)
    autoscaler = Autoscaler(registry, KubernetesScaler(kube), AutoscalerSettings(), GatewayMetrics())
    pool = registry.pools["qwen3-8b"]
    assert (await autoscaler.tick(pool)).desired == 0  # idle at zero: nothing to do
    held = asyncio.create_task(pool.acquire(RequestView((), 1)))
    await wait_until_async(lambda: pool.held == 1)
    decision = await autoscaler.tick(pool)
    assert decision.desired == 1 and "queue depth 1" in decision.reason
    assert kmock.objects[ISVC, "ml", "chat"]["spec"]["replicas"] == 1
    assert (await autoscaler.tick(pool)).desired == 1  # still held, already scaled: no second write
    assert sum(1 for r in kmock if r.method == "PATCH") == 1
    with pytest.raises(Exception, match="no ready replica"):
        await held  # no replica came within the hold timeout: 503
