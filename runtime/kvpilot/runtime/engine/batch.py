"""The contract between the torch-free scheduler and the model runner (pure data, no torch).

One engine step runs one StepBatch: a flattened, variable-length batch in which prefill chunks and
decodes mix freely. For every chunk the runner
  1. writes K/V of `token_ids` into the paged cache at slots derived from `block_table`
     (slot = block_table[pos // block_size] * block_size + pos % block_size, for pos in
     [start_pos, start_pos + len(token_ids))),
  2. lets each new token attend causally to every cached position <= its own,
  3. returns logits for the chunk's last 1 + num_spec tokens when `sample` is True (in chunk order;
     num_spec > 0 only for a speculative verification), followed by the logits of the rows named in
     `prompt_logprob_rows` (in that order; usually none).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import NamedTuple

_SAMPLE = attrgetter("sample")


class SeqChunk(NamedTuple):  # a tuple, not a dataclass: one is built for every sequence in every step
    seq_id: int
    token_ids: list[int]  # tokens whose KV is computed in this step (a prefill chunk, or 1 decode token)
    start_pos: int  # tokens of this sequence already in the KV cache == position of token_ids[0]
    block_table: list[int]  # physical block ids covering positions [0, start_pos + len(token_ids))
    sample: bool  # True when the chunk reaches the sequence's last known token: its logits are needed
    # the block table packed as native int32 (None: pack it from block_table); a cache, same values
    block_table_bytes: bytes | None = None
    # speculative decoding: the last num_spec tokens are drafts to verify; the logits of the chunk's
    # last num_spec + 1 rows are returned (each draft's and the one before the drafts)
    num_spec: int = 0

    @property
    def context_len(self) -> int:
        return self.start_pos + len(self.token_ids)


class PromptRows(NamedTuple):
    """Token rows of one chunk whose logits the runner also returns (prompt logprobs)."""

    chunk: int  # index into StepBatch.chunks
    offset: int  # first token of the chunk
    num_rows: int


@dataclass(frozen=True)
class StepBatch:
    """The chunks of one step. The summary properties are computed in one pass over the chunks and
    kept until the list grows (a batch is only appended to while it is built)."""

    chunks: list[SeqChunk]
    # (chunk index, first token offset in the chunk, count): rows whose logits are returned after the
    # sampled ones, for requests that ask for prompt logprobs (filled by the engine, see PromptRows)
    prompt_logprob_rows: list[PromptRows] = field(default_factory=list)
    _summary: list[int] = field(
        default_factory=lambda: [-1, 0, 0, 0], init=False, repr=False, compare=False
    )  # [num chunks summarised, tokens, sampled, decode-only]

    def _summarise(self) -> list[int]:
        summary, chunks = self._summary, self.chunks
        if summary[0] != len(chunks):
            lens = [len(c.token_ids) for c in chunks]
            summary[:] = [
                len(chunks),
                sum(lens),
                list(map(_SAMPLE, chunks)).count(True),
                lens.count(1) == len(lens),
            ]
        return summary

    @property
    def num_tokens(self) -> int:
        return self._summarise()[1]

    @property
    def num_sampled(self) -> int:
        return self._summarise()[2]

    @property
    def num_sample_rows(self) -> int:
        """Logits rows returned for sampling: one per sampled chunk plus one per draft token."""
        return self.num_sampled + sum(c.num_spec for c in self.chunks)

    @property
    def is_decode_only(self) -> bool:
        return bool(self._summarise()[3])
