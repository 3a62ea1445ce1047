"""Scheduler fast paths (decodes scheduled in their own loop, commits only when a block filled up) make
exactly the batches, preemptions and block tables that the general per-sequence loop makes."""

from __future__ import annotations

import random
from collections.abc import Mapping

import pytest
from kvpilot.runtime.engine.batch import StepBatch
from kvpilot.runtime.engine.block_manager import BlockManager
from kvpilot.runtime.engine.scheduler import Scheduler, SchedulerOutput
from kvpilot.runtime.engine.sequence import Sequence, SequenceStatus
from kvpilot.runtime.sampling_params import SamplingParams

from tests.runtime.fake_model import FakeRunner, greedy_token

BS = 4


class GeneralScheduler(Scheduler):
    """Every running sequence through one loop (decodes first), and a commit attempt for every chunk."""

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput(StepBatch([]))
        budget = self.max_num_batched_tokens
        scheduled_ids: set[int] = set()
        decodes = [s for s in self.running if (s.num_uncomputed_tokens <= 1)]
        prefills = [s for s in self.running if not (s.num_uncomputed_tokens <= 1)]
        for seq in decodes + prefills:
            if budget == 0:
                break
            want = min(seq.num_uncomputed_tokens, budget)
            if seq.status is not SequenceStatus.RUNNING or want == 0:
                continue
            n = self._reserve(seq, want, scheduled_ids, out)
            if n:
                self._add_chunk(out, seq, n, scheduled_ids)
                budget -= n
        while budget and self.waiting and len(self.running) < self.max_running and not out.preempted:
            seq = self.waiting[0]
            n = self.block_manager.admit(seq, budget)
            if n == 0:
                break
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self._add_chunk(out, seq, n, scheduled_ids)
            budget -= n
        return out

    def update(self, out: SchedulerOutput, sampled: Mapping[int, int]) -> None:
        for chunk in out.scheduled:
            seq = chunk.seq
            if seq.status is not SequenceStatus.RUNNING:
                continue
            seq.num_computed_tokens += chunk.num_tokens
            self.block_manager.commit_computed(seq)
            if chunk.sample and seq.seq_id in sampled:
                seq.append_token(sampled[seq.seq_id])


def workload(seed: int) -> list[tuple[int, list[int], int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(1, 200) for _ in range(12)]  # a common prefix: prefix-cache hits
    specs = []
    for i in range(rng.randrange(4, 14)):
        own = [rng.randrange(1, 200) for _ in range(rng.randrange(1, 30))]
        prompt = (shared if rng.random() < 0.5 else []) + own
        specs.append((i, prompt, rng.randrange(1, 12)))
    return specs


def trace(sched: Scheduler, seed: int) -> list[tuple]:
    """Run the workload to the end; record every batch, preemption and block-manager state."""
    runner = FakeRunner(block_size=BS, num_kv_blocks=sched.block_manager.num_blocks)
    rng = random.Random(seed)
    pending = [Sequence(i, p, SamplingParams(max_tokens=m), max_tokens=m) for i, p, m in workload(seed)]
    steps: list[tuple] = []
    while pending or (sched.waiting or sched.running):
        for _ in range(rng.randrange(0, 3)):  # requests arrive while others run
            if pending:
                sched.add(pending.pop(0))
        out = sched.schedule()
        logits = runner.execute(out.batch)
        sampled_chunks = [c for c in out.scheduled if c.sample]
        sampled = {c.seq.seq_id: greedy_token(row) for c, row in zip(sampled_chunks, logits, strict=True)}
        sched.update(out, sampled)
        for c in sampled_chunks:
            if c.seq.num_output_tokens >= c.seq.max_tokens:
                sched.finish(c.seq)
        bm = sched.block_manager
        steps.append(
            (
                [
                    (c.seq_id, c.token_ids, c.start_pos, list(c.block_table), c.sample)
                    for c in out.batch.chunks
                ],
                [(s.seq.seq_id, s.num_tokens, s.sample) for s in out.scheduled],
                [s.seq_id for s in out.preempted],
                bm.num_free_blocks,
                len(bm._cache),
                bm.prefix_cache_hits,
            )
        )
        assert len(steps) < 5_000
    return steps


@pytest.mark.parametrize("prefix_caching", [True, False])
@pytest.mark.parametrize("seed", range(8))
def test_fast_scheduler_equals_the_general_loop(seed: int, prefix_caching: bool) -> None:
    num_blocks, budget = random.Random(seed).choice([(14, 8), (24, 16), (64, 32)])

    def make(cls: type[Scheduler]) -> Scheduler:
        return cls(
            BlockManager(num_blocks, BS, prefix_caching),
            max_num_seqs=6,
            max_num_batched_tokens=budget,
            max_model_len=56,
        )

    fast, general = make(Scheduler), make(GeneralScheduler)
    assert trace(fast, seed) == trace(general, seed)
    if num_blocks == 14:
        assert fast.num_preemptions == general.num_preemptions > 0  # the preemption paths ran


def test_sequence_lengths_follow_appends_and_preemption() -> None:
    seq = Sequence(0, [5, 6, 7], SamplingParams(max_tokens=4), max_tokens=4)
    assert (
        seq.num_prompt_tokens,
        seq.num_output_tokens,
        seq.num_tokens,
        seq.token_slice(seq.num_tokens - 1, seq.num_tokens)[0],
    ) == (3, 0, 3, 7)
    for token in (8, 9):
        seq.append_token(token)
    assert (
        seq.num_prompt_tokens,
        seq.num_output_tokens,
        seq.num_tokens,
        seq.token_slice(seq.num_tokens - 1, seq.num_tokens)[0],
    ) == (3, 2, 5, 9)
    assert seq.num_tokens == len(seq.token_slice(0, seq.num_tokens)) and seq.max_total_tokens == 7
    seq.num_computed_tokens = 4
    seq.reset_for_recompute()
    assert (seq.num_tokens, seq.num_uncomputed_tokens, (seq.num_uncomputed_tokens <= 1)) == (5, 5, False)
