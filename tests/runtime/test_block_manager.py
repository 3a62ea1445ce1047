"""BlockManager: reference counts, prefix cache (chained hashes, confirmed), LRU reuse, counters."""

from __future__ import annotations

import pytest
from kvpilot.runtime.engine.block_manager import BlockManager
from kvpilot.runtime.engine.sequence import Sequence
from kvpilot.runtime.sampling_params import SamplingParams

BS = 4


def make_seq(seq_id: int, tokens: list[int], max_tokens: int = 8) -> Sequence:
    return Sequence(seq_id, tokens, SamplingParams(max_tokens=max_tokens), max_tokens=max_tokens)


def admit_all(bm: BlockManager, seq: Sequence) -> int:
    """Admit with an unlimited budget and mark the whole prompt computed, as a finished prefill would."""
    n = bm.admit(seq, 10_000)
    assert n > 0
    seq.num_computed_tokens += n
    bm.commit_computed(seq)
    return n


def test_allocation_covers_tokens_and_counts_usage() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS)
    seq = make_seq(0, list(range(10)))
    assert bm.admit(seq, 100) == 10
    assert len(seq.block_table) == 3 and len(set(seq.block_table)) == 3
    assert bm.num_free_blocks == 5 and bm.usage == pytest.approx(3 / 8)
    bm.free(seq)
    assert seq.block_table == [] and bm.num_free_blocks == 8 and bm.usage == 0


def test_append_slots_grows_only_at_block_boundaries_and_is_all_or_nothing() -> None:
    bm = BlockManager(num_blocks=3, block_size=BS)
    seq = make_seq(0, [1, 2, 3])
    assert bm.admit(seq, 100) == 3
    seq.num_computed_tokens = 3
    assert bm.append_slots(seq, 1) and len(seq.block_table) == 1  # position 3 still fits block 0
    seq.num_computed_tokens = 4
    assert bm.append_slots(seq, 1) and len(seq.block_table) == 2
    seq.num_computed_tokens = 5
    assert bm.num_appendable_tokens(seq) == 3 + 4
    assert not bm.append_slots(seq, 8)  # needs 2 more blocks, 1 free
    assert len(seq.block_table) == 2 and bm.num_free_blocks == 1


def test_shared_prefix_is_reference_counted() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS)
    prefix = list(range(100, 108))  # two full blocks
    a, b = make_seq(0, [*prefix, 1, 2]), make_seq(1, [*prefix, 3])
    admit_all(bm, a)
    assert bm.admit(b, 100) == 1  # only the token after the shared prefix is computed
    assert b.block_table[:2] == a.block_table[:2]
    assert [bm.ref_count(x) for x in a.block_table] == [2, 2, 1]
    assert b.num_cached_tokens == 8
    bm.free(a)
    assert [bm.ref_count(x) for x in b.block_table] == [1, 1, 1]
    assert bm.num_used_blocks == 3
    bm.free(b)
    assert bm.num_used_blocks == 0
    with pytest.raises(ValueError, match="freed more often"):
        bm.free_blocks([0])


def test_prefix_hit_after_free_and_counters_in_tokens() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS)
    prompt = list(range(1, 14))  # 13 tokens: 3 full blocks + 1
    a = make_seq(0, prompt)
    admit_all(bm, a)
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (13, 0)
    blocks = list(a.block_table)
    bm.free(a)
    b = make_seq(1, prompt)
    assert bm.admit(b, 100) == 1
    assert b.block_table[:3] == blocks[:3]
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (26, 12)


def test_whole_prompt_hit_still_recomputes_the_last_token() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS)
    prompt = list(range(1, 9))  # exactly two full blocks
    admit_all(bm, make_seq(0, prompt))
    b = make_seq(1, prompt)
    assert bm.admit(b, 100) == 4  # block 1 cannot be reused: its last token needs logits
    assert b.num_computed_tokens == 4 and b.num_cached_tokens == 4


def test_only_full_blocks_are_cached() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS)
    a = make_seq(0, [1, 2, 3, 4, 5, 6])
    admit_all(bm, a)
    assert len(bm._cache) == 1
    a.append_token(7)
    a.append_token(8)
    assert bm.append_slots(a, 2)
    a.num_computed_tokens = 8
    bm.commit_computed(a)
    assert len(bm._cache) == 2
    bm.free(a)
    b = make_seq(1, [1, 2, 3, 4, 5, 6, 7, 8, 9])  # prompt + output of `a`, then more
    assert bm.admit(b, 100) == 1


def test_different_prefix_same_block_tokens_is_a_miss() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS)
    admit_all(bm, make_seq(0, [1, 2, 3, 4, 5, 6, 7, 8, 9]))
    b = make_seq(1, [9, 9, 9, 9, 5, 6, 7, 8, 9])  # second block's tokens equal, parent differs
    assert bm.admit(b, 100) == 9 and b.num_cached_tokens == 0


def test_hash_collisions_never_give_wrong_kv() -> None:
    bm = BlockManager(num_blocks=16, block_size=BS, hash_fn=lambda parent, tokens: 42)
    admit_all(bm, make_seq(0, [1, 2, 3, 4, 5, 6, 7, 8, 9]))
    assert len(bm._cache) == 1  # the second block collides with the first: stays private
    other = make_seq(1, [5, 6, 7, 8, 1, 2, 3, 4, 0])
    assert bm.admit(other, 100) == 9  # same hash everywhere, different tokens: no hit
    bm.free(other)
    same = make_seq(2, [1, 2, 3, 4, 0, 0, 0, 0, 0])
    assert bm.admit(same, 100) == 5  # the one genuinely cached block still hits
    assert same.num_cached_tokens == 4


def test_collision_with_equal_tokens_but_other_parent_is_a_miss() -> None:
    # the hash ignores the parent (a chain-level collision): only the confirmed parent tells them apart
    bm = BlockManager(num_blocks=16, block_size=BS, hash_fn=lambda parent, tokens: hash(tokens))
    admit_all(bm, make_seq(0, [1, 1, 1, 1, 7, 7, 7, 7, 0]))
    admit_all(bm, make_seq(1, [2, 2, 2, 2, 5]))  # caches a root block of 2s
    b = make_seq(2, [2, 2, 2, 2, 7, 7, 7, 7, 0])
    assert [len(bm.match_prefix(b))] == [1]  # the 2s hit; the 7s block belongs under the 1s
    assert bm.admit(b, 100) == 5 and b.num_cached_tokens == 4


def test_lru_evicts_least_recently_freed_first() -> None:
    bm = BlockManager(num_blocks=6, block_size=BS)
    seqs = [make_seq(i, [10 * (i + 1) + j for j in range(4)] + [0]) for i in range(3)]
    for s in seqs:
        admit_all(bm, s)  # 2 blocks each: one full (cached) + one partial
    for s in seqs:
        bm.free(s)  # freed in order 0, 1, 2
    # 3 uncached partial blocks go first, then the cached ones in freeing order: seq 0's, then seq 1's
    filler = make_seq(9, [*list(range(200, 216)), 0])  # 5 blocks
    admit_all(bm, filler)
    bm.free(filler)
    hits = [len(bm.match_prefix(make_seq(20 + s.seq_id, s.prompt_token_ids))) for s in seqs]
    assert hits == [0, 0, 1]


def test_freed_tail_is_evicted_before_head() -> None:
    bm = BlockManager(num_blocks=4, block_size=BS)
    a = make_seq(0, [*list(range(1, 13)), 0])  # 3 full blocks + 1 partial
    admit_all(bm, a)
    bm.free(a)
    taker = make_seq(1, [99] * 5)  # 2 blocks: the uncached partial one, then a's LAST full block
    admit_all(bm, taker)
    assert len(bm.match_prefix(make_seq(2, [*list(range(1, 13)), 0]))) == 2  # the head survived


def test_no_prefix_caching_never_hits() -> None:
    bm = BlockManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    admit_all(bm, a := make_seq(0, list(range(1, 10))))
    bm.free(a)
    b = make_seq(1, list(range(1, 10)))
    assert bm.admit(b, 100) == 9 and b.num_cached_tokens == 0
    assert (bm.prefix_cache_queries, bm.prefix_cache_hits) == (0, 0)


def test_admit_refuses_without_side_effects_when_full() -> None:
    bm = BlockManager(num_blocks=2, block_size=BS)
    a = make_seq(0, [1, 2, 3, 4, 5])
    admit_all(bm, a)
    b = make_seq(1, [7, 7, 7, 7, 7])
    assert bm.admit(b, 100) == 0
    assert b.block_table == [] and bm.num_free_blocks == 0 and bm.prefix_cache_queries == 5
    assert bm.admit(b, 0) == 0
