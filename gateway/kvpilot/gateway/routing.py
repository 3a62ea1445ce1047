"""Routing policies: pure functions of a request and the observed replica state (no I/O, no mutation).

`choose(request, pool)` returns a :class:`RoutingDecision` naming the replica, or None when no replica is
routable. The caller (the pool) applies the decision: counts the request in flight and records the
request's prefix blocks in the chosen replica's memory.
"""

from __future__ import annotations

import hashlib
from collections.abc import Container, Sequence
from dataclasses import dataclass
from typing import Protocol

from kvpilot.gateway.config import PolicyName, PrefixSettings


@dataclass(frozen=True)
class RequestView:
    block_hashes: tuple[int, ...]
    est_tokens: int


class PrefixMemory(Container[int], Protocol):
    def matched_prefix(self, hashes: Sequence[int]) -> int: ...


@dataclass(frozen=True)
class ReplicaView:
    id: str
    inflight: int
    inflight_tokens: int
    memory: PrefixMemory


@dataclass(frozen=True)
class PoolView:
    replicas: tuple[ReplicaView, ...]  # routable replicas only (ready, not draining, under their cap)
    sequence: int  # decisions made so far in this pool (round-robin's cursor)


@dataclass(frozen=True)
class RoutingDecision:
    replica: str
    reason: str  # prefix_hit | no_prefix_match | load_bound | least_load | round_robin
    matched_blocks: int = 0


class RoutingPolicy(Protocol):
    @property
    def name(self) -> str: ...  # read-only: the policies are frozen dataclasses

    def choose(self, request: RequestView, pool: PoolView) -> RoutingDecision | None: ...


def _affinity(key: int, replica_id: str) -> int:
    """Rendezvous hash: ties between equally loaded replicas go the same way for the same prefix."""
    digest = hashlib.blake2b(f"{key}:{replica_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _least_loaded(request: RequestView, replicas: Sequence[ReplicaView]) -> ReplicaView:
    key = request.block_hashes[0] if request.block_hashes else 0
    return min(replicas, key=lambda r: (r.inflight, r.inflight_tokens, -_affinity(key, r.id)))


@dataclass(frozen=True)
class LeastLoadPolicy:
    name: str = PolicyName.LEAST_LOAD.value

    def choose(self, request: RequestView, pool: PoolView) -> RoutingDecision | None:
        if not pool.replicas:
            return None
        return RoutingDecision(_least_loaded(request, pool.replicas).id, "least_load")


@dataclass(frozen=True)
class RoundRobinPolicy:
    name: str = PolicyName.ROUND_ROBIN.value

    def choose(self, request: RequestView, pool: PoolView) -> RoutingDecision | None:
        if not pool.replicas:
            return None
        ordered = sorted(pool.replicas, key=lambda r: r.id)
        return RoutingDecision(ordered[pool.sequence % len(ordered)].id, "round_robin")


@dataclass(frozen=True)
class PrefixAwarePolicy:
    """Longest remembered prefix wins, among replicas with `inflight <= load_factor * mean + load_slack`.

    Without a match (or when every matching replica is over the bound) it falls back to least-load, with a
    rendezvous-hash tie-break so an idle pool spreads distinct prefixes instead of piling them on one replica.
    """

    load_factor: float = 1.25
    load_slack: float = 1.0
    name: str = PolicyName.PREFIX_AWARE.value

    def choose(self, request: RequestView, pool: PoolView) -> RoutingDecision | None:
        if not pool.replicas:
            return None
        mean = sum(r.inflight for r in pool.replicas) / len(pool.replicas)
        bound = self.load_factor * mean + self.load_slack
        scored = [(r.memory.matched_prefix(request.block_hashes), r) for r in pool.replicas]
        best = max((matched for matched, _ in scored), default=0)
        if best == 0:
            return RoutingDecision(_least_loaded(request, pool.replicas).id, "no_prefix_match")
        under = [(matched, r) for matched, r in scored if r.inflight <= bound]
        best_under = max((matched for matched, _ in under), default=0)
        if best_under == 0:
            return RoutingDecision(_least_loaded(request, pool.replicas).id, "load_bound")
        candidates = [r for matched, r in under if matched == best_under]
        chosen = _least_loaded(request, candidates)
        reason = "prefix_hit" if best_under == best else "load_bound"
        return RoutingDecision(chosen.id, reason, best_under)


def make_policy(name: PolicyName, prefix: PrefixSettings) -> RoutingPolicy:
    if name is PolicyName.PREFIX_AWARE:
        return PrefixAwarePolicy(load_factor=prefix.load_factor, load_slack=prefix.load_slack)
    if name is PolicyName.LEAST_LOAD:
        return LeastLoadPolicy()
    return RoundRobinPolicy()
