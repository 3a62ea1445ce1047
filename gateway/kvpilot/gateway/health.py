"""Active health checks and load scraping: polls each replica's /health and /metrics.

A replica becomes routable after `healthyThreshold` passing checks and is drained after
`unhealthyThreshold` failing ones (or at once when a request cannot reach it, see Pool.report_failure).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import httpx
from kvpilot.contracts.metrics import NUM_REQUESTS_RUNNING, NUM_REQUESTS_WAITING
from kvpilot.gateway.config import HealthSettings
from kvpilot.gateway.pool import Pool, PoolRegistry, ReplicaState
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger(__name__)


def parse_load(text: str) -> tuple[float, float]:
    """(waiting, running) summed over a runtime's Prometheus exposition."""
    totals = {NUM_REQUESTS_WAITING: 0.0, NUM_REQUESTS_RUNNING: 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
    return totals[NUM_REQUESTS_WAITING], totals[NUM_REQUESTS_RUNNING]


class HealthChecker:
    def __init__(self, registry: PoolRegistry, client: httpx.AsyncClient, settings: HealthSettings) -> None:
        self.registry, self.client, self.settings = registry, client, settings
        self._kick = asyncio.Event()

    def kick(self) -> None:
        """Check now (e.g. new endpoints were discovered) instead of at the next interval."""
        self._kick.set()

    async def run(self) -> None:
        while True:
            await self.check_all()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._kick.wait(), self.settings.interval_seconds)
            self._kick.clear()

    async def check_all(self) -> None:
        checks = [
            self._check(pool, replica)
            for pool in list(self.registry.pools.values())
            for replica in list(pool.replicas.values())
            if not replica.removed
        ]
        await asyncio.gather(*checks)

    async def _check(self, pool: Pool, replica: ReplicaState) -> None:
        timeout = self.settings.timeout_seconds
        try:
            health = await self.client.get(f"{replica.url}/health", timeout=timeout)
            ok = health.status_code == 200
            if ok:
                metrics = await self.client.get(f"{replica.url}/metrics", timeout=timeout)
                if metrics.status_code == 200:
                    replica.waiting, replica.running = parse_load(metrics.text)
        except (httpx.HTTPError, ValueError) as exc:
            log.debug("health check of %s failed: %r", replica.url, exc)
            ok = False
        if not ok:
            replica.waiting = replica.running = 0.0
        s = self.settings
        pool.report_health(replica.url, ok, s.healthy_threshold, s.unhealthy_threshold)
