"""The contract between the torch-free scheduler and the model runner (pure data, no torch).

One engine step runs one StepBatch: a flattened, variable-length batch in which prefill chunks and
decodes mix freely. For every chunk the runner
  1. writes K/V of `token_ids` into the paged cache at slots derived from `block_table`
     (slot = block_table[pos // block_size] * block_size + pos % block_size, for pos in
     [start_pos, start_pos + len(token_ids))),
  2. lets each new token attend causally to every cached position <= its own,
  3. returns logits for the chunk's last token when `sample` is True (in chunk order).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SeqChunk:
    seq_id: int
    token_ids: list[int]  # tokens whose KV is computed in this step (a prefill chunk, or 1 decode token)
    start_pos: int  # tokens of this sequence already in the KV cache == position of token_ids[0]
    block_table: list[int]  # physical block ids covering positions [0, start_pos + len(token_ids))
    sample: bool  # True when the chunk reaches the sequence's last known token: its logits are needed

    @property
    def context_len(self) -> int:
        return self.start_pos + len(self.token_ids)


@dataclass(frozen=True)
class StepBatch:
    chunks: list[SeqChunk]

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)

    @property
    def num_sampled(self) -> int:
        return sum(1 for c in self.chunks if c.sample)

    @property
    def is_decode_only(self) -> bool:
        return all(len(c.token_ids) == 1 for c in self.chunks)
