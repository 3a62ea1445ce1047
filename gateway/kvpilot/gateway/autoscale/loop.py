"""The autoscaler loop: observe each pool's queue depth, ask the pure policy, apply through a driver."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kvpilot.gateway.autoscale.drivers import ScaleDriver
from kvpilot.gateway.autoscale.policy import Sample, ScaleDecision, ScaleHistory, desired_replicas
from kvpilot.gateway.config import AutoscalerSettings
from kvpilot.gateway.metrics import GatewayMetrics
from kvpilot.gateway.pool import Pool, PoolRegistry

log = logging.getLogger(__name__)


@dataclass
class _PoolTrack:
    samples: deque[Sample] = field(default_factory=deque)
    history: ScaleHistory = field(default_factory=ScaleHistory)


class Autoscaler:
    def __init__(
        self,
        registry: PoolRegistry,
        driver: ScaleDriver,
        settings: AutoscalerSettings,
        metrics: GatewayMetrics,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.registry, self.driver, self.settings, self.metrics = registry, driver, settings, metrics
        self.clock = clock or asyncio.get_running_loop().time
        self._tracks: dict[str, _PoolTrack] = {}
        self._poke = asyncio.Event()
        self.last_decisions: dict[str, ScaleDecision] = {}

    def poke(self, pool: Pool | None = None) -> None:
        """Decide now (a request is held with no replica) instead of at the next tick."""
        self._poke.set()

    async def run(self) -> None:
        while True:
            self._poke.clear()
            for pool in list(self.registry.pools.values()):
                try:
                    await self.tick(pool)
                except Exception:  # one pool's driver error must not stop the others
                    log.exception("autoscaling %s failed", pool.name)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._poke.wait(), self.settings.interval_seconds)

    async def tick(self, pool: Pool) -> ScaleDecision | None:
        spec = pool.config.autoscaling
        depth = pool.queue_depth(self.settings.count_running)
        self.metrics.queue_depth.labels(pool.name).set(depth)
        if spec is None:
            return None
        current = await self.driver.current_replicas(pool)
        if current is None:
            return None
        now = self.clock()
        track = self._tracks.get(pool.name)
        if track is None:  # a fresh gateway must not scale a busy pool down before it has watched it
            track = self._tracks[pool.name] = _PoolTrack(history=ScaleHistory(now, now))
        track.samples.append(Sample(now, depth))
        keep = max(spec.window_seconds, spec.scale_down_delay_seconds)
        while track.samples and track.samples[0].at < now - keep:
            track.samples.popleft()
        if depth > 0:
            track.history = replace(track.history, last_nonzero=now)
        decision = desired_replicas(list(track.samples), current, spec, now, track.history)
        self.metrics.desired_replicas.labels(pool.name).set(decision.desired)
        self.last_decisions[pool.name] = decision
        if decision.desired != current and self.driver.can_write():
            direction = decision.direction(current)
            log.info(
                "scaling %s %s: %d -> %d (%s)",
                pool.name,
                direction,
                current,
                decision.desired,
                decision.reason,
            )
            await self.driver.scale(pool, decision.desired, decision.reason)
            self.metrics.scaling.labels(pool.name, direction).inc()
            if direction == "up":
                track.history = replace(track.history, last_scale_up=now)
        return decision
