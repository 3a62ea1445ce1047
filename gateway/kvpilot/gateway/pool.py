"""Pools (one per served model) and their replicas: routing state, admission (queue/hold), health state.

All mutation happens on the event loop; nothing here does I/O. A request gets a :class:`Ticket` from
:meth:`Pool.acquire`; releasing it (idempotent, in `finally`) returns the replica's in-flight counters.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kvpilot.gateway.block_memory import BlockMemory
from kvpilot.gateway.config import Limits, PoolConfig, PrefixSettings
from kvpilot.gateway.openai_errors import NoReplica, Overloaded, UpstreamFailed
from kvpilot.gateway.routing import PoolView, ReplicaView, RequestView, RoutingDecision, make_policy


@dataclass
class ReplicaState:
    url: str
    memory: BlockMemory
    ready: bool = False
    removed: bool = False  # gone from discovery: receives nothing new, forgotten once idle
    inflight: int = 0
    inflight_tokens: int = 0
    failures: int = 0
    successes: int = 0
    waiting: float = 0.0  # the runtime's own queue, from its /metrics
    running: float = 0.0
    # Set when the replica is drained (failed health checks or a request); a fresh one once it is ready
    # again. Attempts on it watch theirs: a frozen replica does not hold requests (see AttemptBounds).
    down: asyncio.Event = field(default_factory=asyncio.Event)

    def view(self) -> ReplicaView:
        return ReplicaView(self.url, self.inflight, self.inflight_tokens, self.memory)


class Ticket:
    """A routed request's claim on a replica; `release()` is idempotent."""

    def __init__(self, pool: Pool, replica: ReplicaState, tokens: int, decision: RoutingDecision) -> None:
        self.pool, self.replica, self.tokens, self.decision = pool, replica, tokens, decision
        self._released = False

    @property
    def url(self) -> str:
        return self.replica.url

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        self.replica.inflight -= 1
        self.replica.inflight_tokens -= self.tokens
        self.pool._forget_if_idle(self.replica)
        self.pool.notify()


class Pool:
    def __init__(self, name: str, config: PoolConfig, prefix: PrefixSettings, limits: Limits) -> None:
        self.name, self.prefix, self.limits = name, prefix, limits
        self.replicas: dict[str, ReplicaState] = {}
        self.sequence = 0
        self.waiting = 0  # requests waiting in the gateway (queued or held)
        self.held = 0  # of those, the ones waiting because no replica is ready
        self.on_hold: Callable[[Pool], None] | None = None  # pokes the autoscaler
        self._changed = asyncio.Event()
        self.configure(config)

    def configure(self, config: PoolConfig) -> None:
        self.config = config
        self.policy = make_policy(config.policy, self.prefix)

    # ---- membership and health -------------------------------------------------------------------
    def set_endpoints(self, urls: Iterable[str]) -> None:
        wanted = set(urls)
        for url in wanted - self.replicas.keys():
            self.replicas[url] = ReplicaState(url, BlockMemory(self.prefix.memory_blocks))
        for url, replica in list(self.replicas.items()):
            replica.removed = url not in wanted
            if replica.removed:
                replica.ready = False
                self._forget_if_idle(replica)
        self.notify()

    def report_health(self, url: str, ok: bool, healthy_threshold: int, unhealthy_threshold: int) -> None:
        replica = self.replicas.get(url)
        if replica is None or replica.removed:
            return
        if ok:
            replica.failures, replica.successes = 0, replica.successes + 1
            if not replica.ready and replica.successes >= healthy_threshold:
                replica.ready = True
                if replica.down.is_set():
                    replica.down = asyncio.Event()
                self.notify()
        else:
            replica.successes, replica.failures = 0, replica.failures + 1
            if replica.ready and replica.failures >= unhealthy_threshold:
                self._drain(replica)

    def report_failure(self, url: str) -> None:
        """A request could not reach the replica: stop routing to it until health checks pass again."""
        replica = self.replicas.get(url)
        if replica is not None and replica.ready:
            replica.successes = 0
            self._drain(replica)

    def _drain(self, replica: ReplicaState) -> None:
        replica.ready = False
        replica.down.set()
        replica.memory.clear()  # a replica that comes back has most likely restarted with an empty cache
        self.notify()

    def _forget_if_idle(self, replica: ReplicaState) -> None:
        if replica.removed and replica.inflight <= 0 and self.replicas.get(replica.url) is replica:
            del self.replicas[replica.url]

    def notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # ---- observation -----------------------------------------------------------------------------
    def ready_replicas(self) -> list[ReplicaState]:
        return [r for r in self.replicas.values() if r.ready and not r.removed]

    def inflight(self) -> int:
        return sum(r.inflight for r in self.replicas.values())

    def queue_depth(self, count_running: bool) -> float:
        """What the autoscaler scales on: the runtimes' queues (or our in-flight count, if larger) + ours."""
        depth = float(self.waiting)
        for replica in self.replicas.values():
            reported = replica.waiting + (replica.running if count_running else 0.0)
            depth += max(reported, float(replica.inflight) if count_running else 0.0)
        return depth

    # ---- admission and routing -------------------------------------------------------------------
    def try_route(self, request: RequestView, exclude: frozenset[str]) -> Ticket | None:
        cap = self.config.max_inflight_per_replica
        routable = [
            r for r in self.ready_replicas() if r.url not in exclude and (cap is None or r.inflight < cap)
        ]
        decision = self.policy.choose(request, PoolView(tuple(r.view() for r in routable), self.sequence))
        if decision is None:
            return None
        replica = self.replicas[decision.replica]
        self.sequence += 1
        replica.inflight += 1
        replica.inflight_tokens += request.est_tokens
        replica.memory.record(request.block_hashes)
        return Ticket(self, replica, request.est_tokens, decision)

    async def acquire(self, request: RequestView, exclude: frozenset[str] = frozenset()) -> Ticket:
        """Route now, or wait (bounded count and time) for a replica: 429 when the queue is full or the
        pool stays saturated, 503 when no replica becomes ready in time."""
        loop = asyncio.get_running_loop()
        start, queued, held = loop.time(), False, False
        retry_after = self.limits.retry_after_seconds
        try:
            while True:
                ticket = self.try_route(request, exclude)
                if ticket is not None:
                    return ticket
                ready = self.ready_replicas()
                if ready and all(r.url in exclude for r in ready):
                    raise UpstreamFailed(f"every ready replica of {self.name!r} failed this request")
                holding = not ready
                if not queued:
                    if self.waiting >= self.limits.max_queued:
                        raise Overloaded(f"too many requests queued for {self.name!r}", retry_after)
                    self.waiting, queued = self.waiting + 1, True
                if holding != held:
                    self.held += 1 if holding else -1
                    held = holding
                timeout = self.limits.hold_timeout_seconds if holding else self.limits.queue_timeout_seconds
                remaining = start + timeout - loop.time()
                if remaining <= 0:
                    if holding:
                        raise NoReplica(f"no ready replica for {self.name!r} after {timeout:g}s", retry_after)
                    raise Overloaded(f"replicas of {self.name!r} saturated for {timeout:g}s", retry_after)
                if holding and self.on_hold is not None:
                    self.on_hold(self)
                changed = self._changed
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(changed.wait(), remaining)
        finally:
            if queued:
                self.waiting -= 1
            if held:
                self.held -= 1


class PoolRegistry:
    """Pools by served model name; discovery sources write endpoints into it (the `EndpointSink`)."""

    def __init__(
        self, pools: dict[str, PoolConfig], default: PoolConfig, prefix: PrefixSettings, limits: Limits
    ) -> None:
        self.default, self.prefix, self.limits = default, prefix, limits
        self.pools: dict[str, Pool] = {}
        self.on_new_pool: Callable[[Pool], None] | None = None
        self.on_endpoints: Callable[[], None] | None = None  # e.g. health-check the new ones now
        for name, config in pools.items():
            self.ensure(name, config)

    def get(self, model: str) -> Pool | None:
        return self.pools.get(model)

    def ensure(self, model: str, config: PoolConfig | None = None) -> Pool:
        pool = self.pools.get(model)
        if pool is None:
            pool = self.pools[model] = Pool(model, config or self.default, self.prefix, self.limits)
            if self.on_new_pool is not None:
                self.on_new_pool(pool)
        elif config is not None and config != pool.config:
            pool.configure(config)
        return pool

    def set_endpoints(self, model: str, urls: Iterable[str]) -> None:
        self.ensure(model).set_endpoints(urls)
        if self.on_endpoints is not None:
            self.on_endpoints()
