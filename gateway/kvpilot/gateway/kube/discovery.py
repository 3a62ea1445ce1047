"""Kubernetes discovery: InferenceServices give pools (served name, autoscaling, /scale target); the
EndpointSlices of their per-service Services (labeled by the operator) give the ready endpoints.

`build_pools` is pure; `KubernetesDiscovery` lists and watches both resources and publishes the result.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

from kvpilot.contracts.labels import ISVC_LABEL, MANAGED_BY, MANAGER
from kvpilot.gateway.config import AutoscalingSpec, KubeTarget, PoolConfig
from kvpilot.gateway.discovery import EndpointSink
from kvpilot.gateway.kube.client import KubeClient, isvc_path
from pydantic import ValidationError

log = logging.getLogger(__name__)

# The operator puts these labels on every object it creates, the per-service Services' EndpointSlices
# inherit them from the Service (kvpilot.contracts.labels: one definition for both programs).
SLICE_SELECTOR = f"{MANAGED_BY}={MANAGER},{ISVC_LABEL}"
Key = tuple[str, str]  # (namespace, name)


def served_name(isvc: dict[str, Any]) -> str:
    """The model name the runtime serves: the operator writes it to status.servedModelName (it gives the
    runtime --served-model-name); before its first pass, spec.model.servedName or the object's name."""
    status, spec = isvc.get("status") or {}, isvc.get("spec") or {}
    return (
        status.get("servedModelName")
        or (spec.get("model") or {}).get("servedName")
        or isvc["metadata"]["name"]
    )


def _autoscaling(isvc: dict[str, Any], defaults: dict[str, Any]) -> AutoscalingSpec | None:
    given = (isvc.get("spec") or {}).get("autoscaling")
    if given is None:
        return None
    known = {f.alias or n for n, f in AutoscalingSpec.model_fields.items()}
    try:
        return AutoscalingSpec.model_validate({**defaults, **{k: v for k, v in given.items() if k in known}})
    except ValidationError as exc:  # the operator reports it in the object's status; we just don't scale
        log.warning("ignoring invalid autoscaling of %s: %s", isvc["metadata"]["name"], exc)
        return None


def slice_urls(endpoint_slice: dict[str, Any]) -> list[str]:
    """http://address:port for every ready endpoint (`ready` unset counts as ready, as in Kubernetes)."""
    ports = endpoint_slice.get("ports") or []
    port = next((p.get("port") for p in ports if p.get("name") == "http"), None)
    port = port or (ports[0].get("port") if ports else None)
    if not port:
        return []
    urls = []
    for endpoint in endpoint_slice.get("endpoints") or []:
        if (endpoint.get("conditions") or {}).get("ready", True) is False:
            continue
        for address in (endpoint.get("addresses") or [])[:1]:
            host = f"[{address}]" if ":" in address else address
            urls.append(f"http://{host}:{port}")
    return urls


def build_pools(
    isvcs: Iterable[dict[str, Any]],
    slices: Iterable[dict[str, Any]],
    base: PoolConfig,
    defaults: dict[str, Any],
) -> dict[str, tuple[PoolConfig, list[str]]]:
    """model -> (pool config, endpoint URLs) from the InferenceServices and the operator's EndpointSlices."""
    by_owner: dict[Key, list[str]] = {}
    for endpoint_slice in slices:
        meta = endpoint_slice.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(MANAGED_BY) != MANAGER or ISVC_LABEL not in labels:
            continue  # label selectors may be ignored by the server (and by kmock): check here too
        owner = (meta.get("namespace", ""), labels[ISVC_LABEL])
        by_owner.setdefault(owner, []).extend(slice_urls(endpoint_slice))
    pools: dict[str, tuple[PoolConfig, list[str]]] = {}
    for isvc in isvcs:
        meta = isvc["metadata"]
        key = (meta.get("namespace", ""), meta["name"])
        config = base.model_copy(
            update={
                "autoscaling": _autoscaling(isvc, defaults),
                "inference_service": KubeTarget(namespace=key[0], name=key[1]),
            }
        )
        pools[served_name(isvc)] = (config, sorted(set(by_owner.get(key, []))))
    return pools


class KubernetesDiscovery:
    def __init__(
        self,
        client: KubeClient,
        namespace: str | None,
        base: PoolConfig,
        defaults: dict[str, Any] | None = None,
        retry_seconds: float = 2.0,
    ) -> None:
        self.client, self.namespace, self.base = client, namespace, base
        self.defaults = defaults or {}
        self.retry_seconds = retry_seconds
        self.isvcs: dict[Key, dict[str, Any]] = {}
        self.slices: dict[Key, dict[str, Any]] = {}
        self._published: set[str] = set()

    def _slices_path(self) -> str:
        ns = f"/namespaces/{self.namespace}" if self.namespace else ""
        return f"/apis/discovery.k8s.io/v1{ns}/endpointslices"

    async def run(self, sink: EndpointSink) -> None:
        await asyncio.gather(
            self._follow(isvc_path(self.namespace), None, self.isvcs, sink),
            self._follow(self._slices_path(), SLICE_SELECTOR, self.slices, sink),
        )

    def publish(self, sink: EndpointSink) -> None:
        pools = build_pools(self.isvcs.values(), self.slices.values(), self.base, self.defaults)
        for model, (config, urls) in pools.items():
            sink.ensure(model, config)
            sink.set_endpoints(model, urls)
        for gone in self._published - pools.keys():
            sink.set_endpoints(gone, [])
        self._published = set(pools)

    async def _follow(
        self, path: str, selector: str | None, store: dict[Key, dict[str, Any]], sink: EndpointSink
    ) -> None:
        """List, then watch; on any error or the end of the watch, list again (after a pause)."""
        while True:
            try:
                listing = await self.client.list(path, selector)
                store.clear()
                store.update({_key(obj): obj for obj in listing.get("items") or []})
                self.publish(sink)
                version = (listing.get("metadata") or {}).get("resourceVersion")
                async for event in self.client.watch(path, version, selector):
                    obj = event.get("object") or {}
                    if event.get("type") == "DELETED":
                        store.pop(_key(obj), None)
                    elif event.get("type") in ("ADDED", "MODIFIED"):
                        store[_key(obj)] = obj
                    else:
                        continue  # BOOKMARK, ERROR: nothing to apply
                    self.publish(sink)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("watching %s failed: %r; listing again", path, exc)
            await asyncio.sleep(self.retry_seconds)


def _key(obj: dict[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")
