"""Prefix hashing and the routing policies (pure), plus the pool's bookkeeping around them."""

from __future__ import annotations

import pytest
from kvpilot.gateway.block_memory import BlockMemory
from kvpilot.gateway.config import Limits, PolicyName, PoolConfig, PrefixSettings
from kvpilot.gateway.pool import Pool
from kvpilot.gateway.prefix import block_hashes, estimate_tokens, prompt_text
from kvpilot.gateway.routing import (
    LeastLoadPolicy,
    PoolView,
    PrefixAwarePolicy,
    ReplicaView,
    RequestView,
    RoundRobinPolicy,
)

SYSTEM = "You are a helpful assistant. " * 20


def chain(text: str) -> tuple[int, ...]:
    return block_hashes(text, 64, 512)


def test_chained_hashes_share_exactly_the_common_full_blocks() -> None:
    a, b = chain(SYSTEM + "question one"), chain(SYSTEM + "another question")
    common = len(SYSTEM) // 64
    assert a[:common] == b[:common] and len(a) == len(b) == len(a)
    assert chain("x" + SYSTEM)[0] != a[0]
    assert chain("y" * 63) == ()  # a partial block is never hashed (never cached either)
    assert len(block_hashes("z" * 6400, 64, 10)) == 10
    # Chaining: the same block text after a different prefix hashes differently.
    assert chain("a" * 64 + "b" * 64)[1] != chain("c" * 64 + "b" * 64)[1]


def test_prompt_text_of_chat_and_completion_bodies() -> None:
    chat = {
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ]
    }
    other_user = {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "bye"}]}
    assert prompt_text(chat).startswith("system") and "hi" in prompt_text(chat)
    assert chain(prompt_text(chat))[:4] == chain(prompt_text(other_user))[:4]
    assert prompt_text({"prompt": ["first", "second"]}) == "first"
    assert len(prompt_text({"prompt": list(range(32))})) == 128  # token ids: 4 characters each
    assert prompt_text({"prompt": None}) == ""
    assert estimate_tokens({"max_tokens": 100}, "x" * 400) == 200


def replica(name: str, inflight: int = 0, blocks: tuple[int, ...] = ()) -> ReplicaView:
    memory = BlockMemory(1000)
    memory.record(blocks)
    return ReplicaView(name, inflight, inflight * 10, memory)


def test_prefix_aware_prefers_longest_match_under_the_load_bound() -> None:
    request = RequestView(chain(SYSTEM + "q"), 50)
    short, long_ = replica("a", blocks=request.block_hashes[:2]), replica("b", blocks=request.block_hashes)
    decision = PrefixAwarePolicy().choose(request, PoolView((short, long_, replica("c")), 0))
    assert (decision.replica, decision.reason) == ("b", "prefix_hit")
    assert decision.matched_blocks == len(request.block_hashes)


def test_prefix_aware_spreads_when_the_match_is_over_the_bound() -> None:
    request = RequestView(chain(SYSTEM), 50)
    # mean inflight = 2, bound = 1.25 * 2 + 1 = 3.5: b (6 in flight) is over it, a holds a shorter match.
    pool = PoolView(
        (replica("a", 0, request.block_hashes[:1]), replica("b", 6, request.block_hashes), replica("c", 0)), 0
    )
    decision = PrefixAwarePolicy().choose(request, pool)
    assert (decision.replica, decision.reason, decision.matched_blocks) == ("a", "load_bound", 1)
    pool = PoolView((replica("b", 6, request.block_hashes), replica("c", 0)), 0)
    assert PrefixAwarePolicy().choose(request, pool).replica == "c"
    # Under the bound (mean 3, bound 4.75) the match wins even though b is busier.
    pool = PoolView((replica("b", 4, request.block_hashes), replica("c", 2)), 0)
    assert PrefixAwarePolicy().choose(request, pool).replica == "b"


def test_cold_prefixes_spread_by_rendezvous_hash_and_least_load() -> None:
    pool = PoolView(tuple(replica(n) for n in "abcd"), 0)
    policy = PrefixAwarePolicy()
    chosen = {policy.choose(RequestView(chain(f"{i} " * 64), 1), pool).replica for i in range(40)}
    assert len(chosen) >= 3
    busy = PoolView((replica("a", 3), replica("b", 1), replica("c", 2)), 0)
    assert LeastLoadPolicy().choose(RequestView((), 1), busy).replica == "b"
    assert PrefixAwarePolicy().choose(RequestView((), 1), busy).reason == "no_prefix_match"


def test_round_robin_cycles_and_empty_pools_give_none() -> None:
    pool = [replica(n) for n in "cab"]
    policy = RoundRobinPolicy()
    picks = [policy.choose(RequestView((), 1), PoolView(tuple(pool), i)).replica for i in range(4)]
    assert picks == ["a", "b", "c", "a"]
    for policy in (RoundRobinPolicy(), LeastLoadPolicy(), PrefixAwarePolicy()):
        assert policy.choose(RequestView((), 1), PoolView((), 0)) is None


def test_block_memory_is_lru_and_reading_does_not_refresh() -> None:
    memory = BlockMemory(3)
    memory.record([1, 2, 3])
    assert memory.matched_prefix([1, 2, 9, 3]) == 2
    memory.record([4])  # evicts 1, the least recently recorded
    assert 1 not in memory and memory.matched_prefix([2, 3, 4]) == 3
    with pytest.raises(ValueError):
        BlockMemory(0)


async def test_pool_routes_same_prefix_together_until_the_bound_then_spreads() -> None:
    pool = Pool("m", PoolConfig(policy=PolicyName.PREFIX_AWARE), PrefixSettings(), Limits())
    pool.set_endpoints(["http://a:1", "http://b:1"])
    for url in pool.replicas:
        pool.report_health(url, True, 1, 1)
    request = RequestView(chain(SYSTEM), 10)
    first = pool.try_route(request, frozenset())
    first.release()
    assert all(pool.try_route(request, frozenset()).url == first.url for _ in range(3))  # held, not released
    # 3 in flight on one replica, mean 1.5, bound 2.875: the next same-prefix request goes elsewhere.
    spilled = pool.try_route(request, frozenset())
    assert spilled.url != first.url and spilled.decision.reason == "load_bound"
    assert pool.inflight() == 4


async def test_pool_membership_drain_and_idle_forget() -> None:
    pool = Pool("m", PoolConfig(), PrefixSettings(), Limits())
    pool.set_endpoints(["http://a:1"])
    pool.report_health("http://a:1", True, 1, 2)
    ticket = pool.try_route(RequestView((7,), 1), frozenset())
    pool.set_endpoints([])  # removed while a request is in flight: kept until it finishes
    assert "http://a:1" in pool.replicas and pool.ready_replicas() == []
    ticket.release()
    ticket.release()  # idempotent
    assert pool.replicas == {}
    pool.set_endpoints(["http://b:1"])
    pool.report_health("http://b:1", True, 1, 2)
    pool.report_health("http://b:1", False, 1, 2)
    assert len(pool.ready_replicas()) == 1  # one failure is under the threshold of 2
    pool.report_health("http://b:1", False, 1, 2)
    assert pool.ready_replicas() == []
