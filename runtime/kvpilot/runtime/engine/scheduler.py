"""Continuous batching: which tokens of which sequences run in the next step (pure Python, no torch).

Every step gets at most `max_num_batched_tokens` tokens. Running sequences go first, decodes before
partial prefills, oldest first, so a decode is never starved by a flood of long prompts; what budget is
left continues partial prefills and then admits waiting sequences in arrival order (first come, first
served: a waiting sequence that does not fit blocks the ones behind it). Prompts longer than the budget
are prefilled in chunks over several steps. When a running sequence needs a block and none is free, the
newest running sequence not yet scheduled in this step is preempted: its blocks are freed and it goes
back to the front of the queue, to recompute its prompt and output later (its full blocks usually stay
in the prefix cache, so the recompute is mostly a cache hit).

At most min(max_num_seqs, max_num_batched_tokens) sequences run at once, so every running decode
always fits in the budget.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from kvpilot.runtime.engine.batch import SeqChunk, StepBatch
from kvpilot.runtime.engine.block_manager import BlockManager
from kvpilot.runtime.engine.sequence import Sequence, SequenceStatus


class ScheduledChunk(NamedTuple):  # a tuple: built for every sequence in every step
    seq: Sequence
    num_tokens: int
    sample: bool
    num_spec: int = 0  # draft tokens among num_tokens (speculative decoding)


@dataclass
class SchedulerOutput:
    batch: StepBatch
    scheduled: list[ScheduledChunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_model_len: int,
    ) -> None:
        if min(max_num_seqs, max_num_batched_tokens, max_model_len) < 1:
            raise ValueError("max_num_seqs, max_num_batched_tokens and max_model_len must be positive")
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_model_len = max_model_len
        self.max_running = min(max_num_seqs, max_num_batched_tokens)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # in admission order, oldest first
        self.num_preemptions = 0

    # ---- queue management -----------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a new sequence. It must fit max_model_len and, alone, the whole KV cache."""
        limit = min(self.max_model_len, self.block_manager.num_blocks * self.block_manager.block_size)
        if seq.max_total_tokens > limit:
            raise ValueError(
                f"sequence {seq.seq_id} may reach {seq.max_total_tokens} tokens, "
                f"more than the {limit} this scheduler can hold"
            )
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def abort(self, seq: Sequence) -> bool:
        """Remove a sequence in any state and free its blocks. False if it was not queued or running."""
        if seq.status is SequenceStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        elif seq.status is SequenceStatus.RUNNING and seq in self.running:
            self.running.remove(seq)
        else:
            return False
        self._release(seq)
        return True

    def finish(self, seq: Sequence) -> None:
        """A running sequence is done (stopped, out of tokens, or failed): free its blocks."""
        if not self.abort(seq):
            raise ValueError(f"sequence {seq.seq_id} is not running")

    def _release(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def can_schedule_decodes_only(self) -> bool:
        """True when the next schedule() only decodes one token for every running sequence: nothing
        waits, each running sequence has exactly one token to compute, and the free blocks cover each
        one whose last block is full (so nobody is preempted). The asynchronous engine plans such a step
        before the previous step's tokens are known."""
        if self.waiting or not self.running:
            return False
        block_size, need = self.block_manager.block_size, 0
        for seq in self.running:
            computed = seq.num_computed_tokens
            if seq.num_tokens - computed != 1:
                return False
            if computed >= len(seq.block_table) * block_size:
                need += 1
        return need <= self.block_manager.num_free_blocks

    # ---- one step -------------------------------------------------------------------------------
    def schedule(self, drafts: Mapping[int, list[int]] | None = None) -> SchedulerOutput:
        """The next step. `drafts` (seq id -> draft tokens, speculative decoding) extend the decodes of
        those sequences when the budget and free blocks allow it without preempting anybody."""
        out = SchedulerOutput(StepBatch([]))
        budget = self.max_num_batched_tokens
        scheduled_ids: set[int] = set()
        decodes = [seq for seq in self.running if seq.num_tokens - seq.num_computed_tokens <= 1]
        prefills = (
            [seq for seq in self.running if seq.num_tokens - seq.num_computed_tokens > 1]
            if len(decodes) < len(self.running)
            else []
        )
        if drafts:
            budget = self._schedule_drafts(decodes, drafts, budget, scheduled_ids, out)
            decodes = [seq for seq in decodes if seq.seq_id not in scheduled_ids]
        budget = self._schedule_decodes(decodes, budget, scheduled_ids, out)
        for seq in prefills:
            if budget == 0:
                break
            want = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this step
            n = self._reserve(seq, want, scheduled_ids, out)
            if n:
                self._add_chunk(out, seq, n, scheduled_ids)
                budget -= n
        while budget and self.waiting and len(self.running) < self.max_running and not out.preempted:
            seq = self.waiting[0]
            n = self.block_manager.admit(seq, budget)
            if n == 0:
                break  # first come, first served: nobody overtakes the head of the queue
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            self._add_chunk(out, seq, n, scheduled_ids)
            budget -= n
        return out

    def _schedule_decodes(
        self, decodes: list[Sequence], budget: int, scheduled_ids: set[int], out: SchedulerOutput
    ) -> int:
        """One token for each sequence that just decodes (most steps need no new block for it)."""
        block_size, running = self.block_manager.block_size, SequenceStatus.RUNNING
        add_chunk, add_scheduled, add_id = out.batch.chunks.append, out.scheduled.append, scheduled_ids.add
        for seq in decodes:
            if budget == 0:
                break
            start = seq.num_computed_tokens
            if seq.num_tokens == start or seq.status is not running:
                continue  # nothing to compute, or preempted earlier in this step
            if start >= len(seq.block_table) * block_size and not self._reserve(seq, 1, scheduled_ids, out):
                continue  # the last block is full and no block could be had: preempted itself
            output, seq_id = seq.output_token_ids, seq.seq_id
            token = output[-1] if output else seq.prompt_token_ids[-1]
            add_chunk(SeqChunk(seq_id, [token], start, seq.block_table, True, seq.packed_block_table()))
            add_scheduled(ScheduledChunk(seq, 1, True))
            add_id(seq_id)
            budget -= 1
        return budget

    def _schedule_drafts(
        self,
        decodes: list[Sequence],
        drafts: Mapping[int, list[int]],
        budget: int,
        scheduled_ids: set[int],
        out: SchedulerOutput,
    ) -> int:
        """A decode with its drafts for each sequence that has some, when its 1 + d tokens fit the budget
        and the blocks they need leave one free block for every decode still to schedule."""
        bm, running = self.block_manager, SequenceStatus.RUNNING
        for index, seq in enumerate(decodes):
            draft = drafts.get(seq.seq_id)
            start = seq.num_computed_tokens
            if not draft or seq.status is not running or seq.num_tokens - start != 1:
                continue
            n = 1 + len(draft)
            needed = bm.blocks_for(start + n) - len(seq.block_table)
            if n > budget or needed > bm.num_free_blocks - (len(decodes) - index - 1):
                continue
            if not bm.append_slots(seq, n):
                continue
            token = seq.output_token_ids[-1] if seq.output_token_ids else seq.prompt_token_ids[-1]
            out.batch.chunks.append(
                SeqChunk(
                    seq.seq_id,
                    [token, *draft],
                    start,
                    seq.block_table,
                    True,
                    seq.packed_block_table(),
                    len(draft),
                )
            )
            out.scheduled.append(ScheduledChunk(seq, n, True, len(draft)))
            scheduled_ids.add(seq.seq_id)
            budget -= n
        return budget

    def _reserve(self, seq: Sequence, want: int, scheduled_ids: set[int], out: SchedulerOutput) -> int:
        """Slots for up to `want` tokens of a running sequence, preempting newer sequences if needed.
        Returns the tokens granted, 0 when `seq` itself had to be preempted."""
        bm = self.block_manager
        if bm.append_slots(seq, want):  # the common case: room in the last block or a free block
            return want
        while True:
            n = min(want, bm.num_appendable_tokens(seq))
            if n >= 1:
                if not bm.append_slots(seq, n):
                    raise RuntimeError("block manager refused slots it reported free")
                return n
            victim = self._newest_unscheduled(scheduled_ids)
            self._preempt(victim, out)
            if victim is seq:
                return 0

    def _newest_unscheduled(self, scheduled_ids: set[int]) -> Sequence:
        for seq in reversed(self.running):
            if seq.seq_id not in scheduled_ids:
                return seq
        raise RuntimeError("no sequence left to preempt")

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)
        self.num_preemptions += 1
        out.preempted.append(seq)

    def _add_chunk(self, out: SchedulerOutput, seq: Sequence, n: int, scheduled_ids: set[int]) -> None:
        start = seq.num_computed_tokens
        sample = start + n == seq.num_tokens
        out.batch.chunks.append(
            SeqChunk(
                seq_id=seq.seq_id,
                token_ids=seq.token_slice(start, start + n),
                start_pos=start,
                block_table=seq.block_table,  # live list: unchanged until the step is over
                sample=sample,
                block_table_bytes=seq.packed_block_table(),
            )
        )
        out.scheduled.append(ScheduledChunk(seq, n, sample))
        scheduled_ids.add(seq.seq_id)

    # ---- after the step -------------------------------------------------------------------------
    def update(
        self, out: SchedulerOutput, sampled: Mapping[int, int], rejected: Mapping[int, int] | None = None
    ) -> None:
        """Record the step: the scheduled tokens now have KV, and each sampled token (by seq id) is
        appended. Sequences finished meanwhile (failed, aborted) are skipped. A speculative chunk keeps
        the KV of its accepted tokens only: `rejected` (seq id -> rejected drafts) are rolled back and
        the blocks past the accepted tokens freed (its tokens are appended by the engine)."""
        commit, block_size = self.block_manager.commit_computed, self.block_manager.block_size
        running = SequenceStatus.RUNNING
        for seq, num_tokens, sample, num_spec in out.scheduled:
            if seq.status is not running:
                continue
            if num_spec:
                seq.num_computed_tokens += num_tokens - (rejected or {}).get(seq.seq_id, num_spec)
                self.block_manager.trim(seq, seq.num_computed_tokens)
            else:
                seq.num_computed_tokens += num_tokens
            if seq.num_computed_tokens >= (seq.num_committed_blocks + 1) * block_size:
                commit(seq)  # a block filled up since the last commit
            if sample:
                token = sampled.get(seq.seq_id)
                if token is not None:
                    seq.append_token(token)
