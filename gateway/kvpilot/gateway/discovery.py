"""Where replicas come from. A discovery source writes `model -> endpoint URLs` into an EndpointSink.

- StaticDiscovery: the pools' `endpoints` from the config file or flags (local stack, tests).
- kvpilot.gateway.kube.discovery.KubernetesDiscovery: EndpointSlices/pods labeled by the operator.
- kvpilot.gateway.autoscale.local.LocalDriver: the runtime processes it started on this machine.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from kvpilot.gateway.config import GatewayConfig, PoolConfig


class EndpointSink(Protocol):
    def set_endpoints(self, model: str, urls: Iterable[str]) -> None: ...

    def ensure(self, model: str, config: PoolConfig | None = None) -> object: ...


class Discovery(Protocol):
    async def run(self, sink: EndpointSink) -> None:
        """Publish endpoints (and keep publishing changes); may return once nothing more will change."""


class StaticDiscovery:
    def __init__(self, config: GatewayConfig) -> None:
        self.config = config

    async def run(self, sink: EndpointSink) -> None:
        for model, pool in self.config.pools.items():
            if pool.endpoints:
                sink.set_endpoints(model, pool.endpoints)
