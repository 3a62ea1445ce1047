"""Cluster driver: reads and writes an InferenceService's /scale subresource (spec.replicas).

With more than one gateway replica pass a LeaseElector: only the lease holder writes.
"""

from __future__ import annotations

import logging

from kvpilot.gateway.kube.client import KubeClient, isvc_path
from kvpilot.gateway.kube.lease import LeaseElector
from kvpilot.gateway.pool import Pool

log = logging.getLogger(__name__)


class KubernetesScaler:
    def __init__(self, client: KubeClient, elector: LeaseElector | None = None) -> None:
        self.client, self.elector = client, elector

    def can_write(self) -> bool:
        return self.elector is None or self.elector.is_leader()

    async def current_replicas(self, pool: Pool) -> int | None:
        target = pool.config.inference_service
        if target is None:
            return None
        scale = await self.client.get(isvc_path(target.namespace, target.name, "scale"))
        if scale is None:
            return None
        return int((scale.get("spec") or {}).get("replicas") or 0)

    async def scale(self, pool: Pool, replicas: int, reason: str) -> None:
        target = pool.config.inference_service
        if target is None:
            return
        path = isvc_path(target.namespace, target.name, "scale")
        await self.client.merge_patch(path, {"spec": {"replicas": replicas}})
        log.info("scaled InferenceService %s/%s to %d: %s", target.namespace, target.name, replicas, reason)
