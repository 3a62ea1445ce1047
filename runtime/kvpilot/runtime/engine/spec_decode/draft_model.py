"""Draft-model proposals: a smaller model of the same family (same tokenizer) drafts k tokens greedily.

The draft model runs in its own ModelRunner with its own paged KV cache, bookkept by its own
BlockManager (no prefix caching): per target sequence a shadow holds the draft's block table and the
tokens whose draft KV is in it. Before drafting, the shadow is cut back to the longest prefix it shares
with the sequence (rejected drafts drop out that way, and a preempted sequence keeps its draft KV),
then one forward catches up on the sequence's new tokens and yields the first draft, and k - 1
one-token forwards yield the rest. The drafts are the draft model's argmax: a point-mass proposal, which
rejection.py verifies losslessly for greedy and random requests alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvpilot.runtime.engine.batch import SeqChunk, StepBatch
from kvpilot.runtime.engine.block_manager import BlockManager
from kvpilot.runtime.engine.sequence import Sequence


@dataclass
class _Shadow:
    """The draft model's view of one sequence (duck-typed for BlockManager.append_slots/free)."""

    seq_id: int
    block_table: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # the tokens whose draft KV is computed

    @property
    def num_computed_tokens(self) -> int:
        return len(self.tokens)


class DraftModelProposer:
    def __init__(self, runner: Any, *, max_chunk_tokens: int) -> None:
        self.runner = runner
        self.blocks = BlockManager(runner.num_kv_blocks, runner.block_size, enable_prefix_caching=False)
        self.max_chunk_tokens = max_chunk_tokens  # catch-up chunks are cut to this many tokens
        self._shadows: dict[int, _Shadow] = {}

    def forget(self, seq_ids: set[int]) -> None:
        for seq_id in seq_ids:
            shadow = self._shadows.pop(seq_id, None)
            if shadow is not None:
                self.blocks.free(shadow)  # type: ignore[arg-type]

    def propose(self, seqs: list[Sequence], num_tokens: list[int]) -> list[list[int]]:
        active: list[tuple[int, _Shadow, list[int]]] = []  # (index, shadow, tokens of the sequence)
        for index, (seq, k) in enumerate(zip(seqs, num_tokens, strict=True)):
            tokens = seq.prompt_token_ids + seq.output_token_ids
            shadow = self._shadow_for(seq.seq_id, tokens)
            # slots for the catch-up and the k - 1 drafts fed back
            if self.blocks.append_slots(shadow, len(tokens) - len(shadow.tokens) + k - 1):  # type: ignore[arg-type]
                active.append((index, shadow, tokens))
        drafts: list[list[int]] = [[] for _ in seqs]
        if not active:
            return drafts
        first = self._catch_up([(shadow, tokens) for _, shadow, tokens in active])
        for (index, _, _), token in zip(active, first, strict=True):
            drafts[index].append(token)
        for step in range(1, max(num_tokens[index] for index, _, _ in active)):
            going = [(index, shadow) for index, shadow, _ in active if num_tokens[index] > step]
            chunks = []
            for index, shadow in going:
                chunks.append(self._chunk(shadow, [drafts[index][-1]], sample=True))
                shadow.tokens.append(drafts[index][-1])
            for (index, _), token in zip(going, self._argmax(chunks), strict=True):
                drafts[index].append(token)
        return drafts

    def _shadow_for(self, seq_id: int, tokens: list[int]) -> _Shadow:
        """The sequence's shadow, cut back to the prefix it shares with `tokens`, leaving at least the
        last token to compute (its logits give the first draft)."""
        shadow = self._shadows.get(seq_id)
        if shadow is None:
            shadow = self._shadows[seq_id] = _Shadow(seq_id)
        known = shadow.tokens
        same = 0
        limit = min(len(known), len(tokens) - 1)
        while same < limit and known[same] == tokens[same]:
            same += 1
        del known[same:]
        return shadow

    def _catch_up(self, pending: list[tuple[_Shadow, list[int]]]) -> list[int]:
        """Feed each shadow its sequence's uncomputed tokens (in chunks of at most max_chunk_tokens
        tokens per forward); returns the argmax after each sequence's last token."""
        first: list[int | None] = [None] * len(pending)
        while any(t is None for t in first):
            chunks, owners, budget = [], [], self.max_chunk_tokens
            for i, (shadow, tokens) in enumerate(pending):
                if first[i] is not None or budget <= 0:
                    continue
                todo = tokens[len(shadow.tokens) : len(shadow.tokens) + budget]
                last = len(shadow.tokens) + len(todo) == len(tokens)
                chunks.append(self._chunk(shadow, todo, sample=last))
                shadow.tokens.extend(todo)
                budget -= len(todo)
                if last:
                    owners.append(i)
            for i, token in zip(owners, self._argmax(chunks), strict=True):
                first[i] = token
        return [t for t in first if t is not None]

    def _chunk(self, shadow: _Shadow, token_ids: list[int], *, sample: bool) -> SeqChunk:
        return SeqChunk(shadow.seq_id, token_ids, len(shadow.tokens), shadow.block_table, sample)

    def _argmax(self, chunks: list[SeqChunk]) -> list[int]:
        logits = self.runner.execute(StepBatch(chunks))
        if logits.shape[0] == 0:
            return []
        return logits.argmax(dim=-1).tolist()
