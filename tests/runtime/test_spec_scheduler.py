"""Scheduling drafts and rolling back rejected ones (torch-free bookkeeping)."""

from __future__ import annotations

import struct

from kvpilot.runtime.engine.block_manager import BlockManager
from kvpilot.runtime.engine.scheduler import Scheduler
from kvpilot.runtime.engine.sequence import Sequence
from kvpilot.runtime.sampling_params import SamplingParams


def decoding(prompt: list[int], bm: BlockManager, sched: Scheduler, seq_id: int = 0) -> Sequence:
    seq = Sequence(seq_id, prompt, SamplingParams(), max_tokens=8)
    sched.add(seq)
    out = sched.schedule()
    sched.update(out, {seq_id: 100 + seq_id})
    return seq


def unpack(table: bytes) -> list[int]:
    return list(struct.unpack(f"={len(table) // 4}i", table))


def test_drafts_extend_the_decode_and_rejected_blocks_are_freed() -> None:
    bm = BlockManager(16, 4)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    seq = decoding([1, 2, 3], bm, sched)  # 4 tokens, 3 computed, one block
    assert (seq.num_tokens, seq.num_computed_tokens, len(seq.block_table)) == (4, 3, 1)
    out = sched.schedule({0: [7, 8, 9, 10, 11]})
    (chunk,) = out.batch.chunks
    assert chunk.token_ids == [100, 7, 8, 9, 10, 11] and chunk.start_pos == 3 and chunk.num_spec == 5
    assert out.batch.num_sample_rows == 6 and len(seq.block_table) == 3  # positions 3..8
    free_before = bm.num_free_blocks
    sched.update(out, {}, {0: 4})  # one draft accepted: KV of 100 and 7 is kept
    assert seq.num_computed_tokens == 5 and len(seq.block_table) == 2
    assert bm.num_free_blocks == free_before + 1
    for token in (7, 12):  # the engine appends the accepted draft and the target's own token
        seq.append_token(token)
    assert unpack(seq.packed_block_table()) == seq.block_table
    out = sched.schedule()  # position 5 is in the second block
    (chunk,) = out.batch.chunks
    assert chunk.token_ids == [12] and chunk.start_pos == 5 and chunk.num_spec == 0
    sched.update(out, {0: 13})
    out = sched.schedule({0: [1, 2, 3]})  # positions 6..9: a third block again
    assert len(seq.block_table) == 3
    assert unpack(out.batch.chunks[0].block_table_bytes) == seq.block_table


def test_drafts_never_preempt_and_fall_back_to_a_plain_decode() -> None:
    bm = BlockManager(3, 4)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=12)
    first = Sequence(0, [1, 2, 3], SamplingParams(), max_tokens=8)
    second = Sequence(1, [4, 5, 6], SamplingParams(), max_tokens=8)
    sched.add(first)
    sched.add(second)
    sched.update(sched.schedule(), {0: 100, 1: 101})
    assert bm.num_free_blocks == 1
    # 8 drafts would need two more blocks: refused; the plain decode still runs
    out = sched.schedule({0: [9] * 8, 1: [9] * 3})
    spec = {c.seq_id: c.num_spec for c in out.batch.chunks}
    assert spec == {0: 0, 1: 3} and sched.num_preemptions == 0  # the last decode may take the free block
    assert first.status.value == second.status.value == "running"


def test_drafts_respect_the_token_budget() -> None:
    bm = BlockManager(16, 4)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=3, max_model_len=64)
    decoding([1, 2], bm, sched)
    out = sched.schedule({0: [5, 6, 7]})
    assert out.batch.chunks[0].num_spec == 0 and out.batch.num_tokens == 1


def test_commit_only_accepted_full_blocks() -> None:
    bm = BlockManager(16, 4)
    sched = Scheduler(bm, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64)
    seq = decoding([1, 2, 3], bm, sched)
    out = sched.schedule({0: [7, 8, 9, 10]})  # positions 3..7: two blocks
    second = seq.block_table[1]
    sched.update(out, {}, {0: 4})  # every draft rejected
    # block 0 is full of computed, accepted tokens: cached; block 1 held only drafts: freed, uncached
    assert seq.num_committed_blocks == 1 and seq.block_tokens == [(1, 2, 3, 100)]
    assert seq.block_table == [seq.block_table[0]] and bm.ref_count(second) == 0
    other = Sequence(1, [1, 2, 3, 100, 5], SamplingParams(), max_tokens=4)
    assert bm.match_prefix(other) == seq.block_table[:1]
