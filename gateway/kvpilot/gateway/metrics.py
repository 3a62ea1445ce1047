"""Gateway metrics on a per-app CollectorRegistry (never the global one).

Per-pool queue depth and desired replicas are exported so administrators who prefer HPA or KEDA can scale
on them instead of the built-in autoscaler.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_TTFB_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "kvpilot_gateway_requests",
            "Requests answered, by model, route and status",
            ["model", "route", "status"],
            registry=r,
        )
        self.ttfb = Histogram(
            "kvpilot_gateway_time_to_first_byte_seconds",
            "From request arrival to the first upstream byte (queueing included)",
            ["model"],
            buckets=_TTFB_BUCKETS,
            registry=r,
        )
        self.routing = Counter(
            "kvpilot_gateway_routing_decisions",
            "Routing decisions",
            ["model", "policy", "replica", "reason"],
            registry=r,
        )
        self.retries = Counter(
            "kvpilot_gateway_retries",
            "Requests retried on another replica before the first byte",
            ["model"],
            registry=r,
        )
        self.rejected = Counter(
            "kvpilot_gateway_rejected", "Requests refused (429/503)", ["model", "reason"], registry=r
        )
        self.held = Gauge(
            "kvpilot_gateway_held_requests", "Requests held while no replica is ready", ["model"], registry=r
        )
        self.queued = Gauge(
            "kvpilot_gateway_queued_requests", "Requests waiting in the gateway", ["model"], registry=r
        )
        self.inflight = Gauge(
            "kvpilot_gateway_inflight_requests",
            "Requests in flight per replica",
            ["model", "replica"],
            registry=r,
        )
        self.ready_replicas = Gauge(
            "kvpilot_gateway_ready_replicas", "Routable replicas", ["model"], registry=r
        )
        self.queue_depth = Gauge(
            "kvpilot_gateway_pool_queue_depth",
            "Queue depth the autoscaler observes (runtime waiting+running + gateway-held)",
            ["model"],
            registry=r,
        )
        self.desired_replicas = Gauge(
            "kvpilot_gateway_pool_desired_replicas",
            "Replicas the autoscaling policy asks for",
            ["model"],
            registry=r,
        )
        self.scaling = Counter(
            "kvpilot_gateway_scaling_decisions",
            "Scaling decisions applied",
            ["model", "direction"],
            registry=r,
        )
