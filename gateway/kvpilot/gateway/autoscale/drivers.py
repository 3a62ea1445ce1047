"""What the autoscaler drives: anything that can report and set a pool's replica count."""

from __future__ import annotations

from typing import Protocol

from kvpilot.gateway.pool import Pool


class ScaleDriver(Protocol):
    def can_write(self) -> bool:
        """False when another gateway replica holds the lease: observe and export, do not write."""

    async def current_replicas(self, pool: Pool) -> int | None:
        """Replicas the pool is set to run (spec.replicas), or None when the pool is not managed here."""

    async def scale(self, pool: Pool, replicas: int, reason: str) -> None: ...
