"""Leader election on a coordination.k8s.io/v1 Lease: only the holder's autoscaler writes /scale.

`lease_action` is the pure decision; `LeaseElector` does the I/O (get, then create or update with the
resourceVersion it read, so two gateways racing for an expired lease cannot both win).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import Callable
from typing import Any

from kvpilot.gateway.kube.client import KubeClient, KubeError

log = logging.getLogger(__name__)
_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def _parse(value: str | None) -> dt.datetime | None:
    if not value:
        return None
    for fmt in (_FORMAT, "%Y-%m-%dT%H:%M:%SZ"):
        with contextlib.suppress(ValueError):
            return dt.datetime.strptime(value, fmt).replace(tzinfo=dt.UTC)
    return None


def lease_action(lease: dict[str, Any] | None, identity: str, now: dt.datetime) -> str:
    """create | renew | acquire (expired, someone else's) | follow (held by a live other gateway)."""
    if lease is None:
        return "create"
    spec = lease.get("spec") or {}
    if spec.get("holderIdentity") == identity:
        return "renew"
    renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
    duration = float(spec.get("leaseDurationSeconds") or 0)
    if not spec.get("holderIdentity") or renewed is None or now >= renewed + dt.timedelta(seconds=duration):
        return "acquire"
    return "follow"


class LeaseElector:
    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        name: str,
        identity: str,
        duration_seconds: int = 15,
        renew_seconds: float = 5.0,
        clock: Callable[[], dt.datetime] | None = None,
    ) -> None:
        self.client, self.namespace, self.name, self.identity = client, namespace, name, identity
        self.duration, self.renew_seconds = duration_seconds, renew_seconds
        self.clock = clock or (lambda: dt.datetime.now(dt.UTC))
        self._held_until: dt.datetime | None = None

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases/{self.name}"

    def is_leader(self) -> bool:
        return self._held_until is not None and self.clock() < self._held_until

    async def run(self) -> None:
        while True:
            try:
                await self.try_acquire_or_renew()
            except Exception as exc:  # API hiccup: keep what we have until it expires
                log.warning("lease %s/%s: %r", self.namespace, self.name, exc)
            await asyncio.sleep(self.renew_seconds)

    async def try_acquire_or_renew(self) -> bool:
        now = self.clock()
        lease = await self.client.get(self.path)
        action = lease_action(lease, self.identity, now)
        if action == "follow":
            self._held_until = None
            return False
        stamp = now.strftime(_FORMAT)
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.duration,
            "renewTime": stamp,
        }
        try:
            body: dict[str, Any]
            if action == "create":
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {**spec, "acquireTime": stamp, "leaseTransitions": 0},
                }
                await self.client.create(self.path.rsplit("/", 1)[0], body)
            elif lease is not None:  # renew or acquire
                body = {**lease, "spec": {**(lease.get("spec") or {}), **spec}}
                if action == "acquire":
                    transitions = int(body["spec"].get("leaseTransitions") or 0) + 1
                    body["spec"].update(acquireTime=stamp, leaseTransitions=transitions)
                await self.client.replace(self.path, body)
        except KubeError as exc:
            if exc.status != 409:  # 409: another gateway won the race (resourceVersion changed)
                raise
            self._held_until = None
            return False
        self._held_until = now + dt.timedelta(seconds=self.duration)
        return True
