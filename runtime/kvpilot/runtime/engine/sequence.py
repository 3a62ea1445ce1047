"""One request's token state as the scheduler and block manager see it (pure Python, no torch)."""

from __future__ import annotations

import enum
import struct

from kvpilot.runtime.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """Prompt + generated tokens, how many of them have KV in the cache, and the blocks holding it.

    `num_computed_tokens` counts the tokens whose KV sits in the blocks of `block_table`; the tokens
    after it still need a forward pass (a prefill chunk, or the one decode token). `block_hashes` caches
    the chained hash of each full block of known tokens; tokens never change once known, so the hashes
    survive preemption.
    """

    def __init__(
        self,
        seq_id: int,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        max_tokens: int,
        arrival_time: float = 0.0,
    ) -> None:
        if not prompt_token_ids:
            raise ValueError("a sequence needs at least one prompt token")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        self.seq_id = seq_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []  # grows only through append_token
        # Lengths kept as plain attributes (read for every sequence in every step), updated on append
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.num_output_tokens = 0
        self.num_tokens = self.num_prompt_tokens
        self.params = params
        self.max_tokens = max_tokens
        self.arrival_time = arrival_time
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self._packed_table: tuple[list[int], bytes] = (self.block_table, b"")  # packed_block_table()
        self.block_hashes: list[int] = []
        self.block_tokens: list[tuple[int, ...]] = []  # the tokens of each hashed block
        self.num_committed_blocks = 0  # leading blocks the prefix cache has already seen
        self.num_cached_tokens: int | None = None  # prefix-cache hit at first admission
        self.num_preemptions = 0

    @property
    def max_total_tokens(self) -> int:
        """Tokens the sequence may reach: its prompt plus every token it is allowed to generate."""
        return self.num_prompt_tokens + self.max_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    def token_slice(self, start: int, stop: int) -> list[int]:
        n = self.num_prompt_tokens
        if stop <= n:
            return self.prompt_token_ids[start:stop]
        if start >= n:
            return self.output_token_ids[start - n : stop - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: stop - n]

    def append_token(self, token_id: int) -> None:
        """Append a sampled token, or a placeholder (a negative id) for one not yet read back."""
        self.output_token_ids.append(token_id)
        self.num_output_tokens += 1
        self.num_tokens += 1

    @property
    def num_resolved_tokens(self) -> int:
        """Tokens whose ids are known: all of them, or all but a trailing placeholder."""
        output = self.output_token_ids
        return self.num_tokens - 1 if output and output[-1] < 0 else self.num_tokens

    def packed_block_table(self) -> bytes:
        """block_table as native int32 bytes, cached: repacked only when blocks were appended or the
        table was replaced (block tables only grow by append, are replaced by a new list, or are cut
        by drop_blocks_after, which resets this cache)."""
        table = self.block_table
        cached_table, packed = self._packed_table
        if cached_table is table and len(packed) == 4 * len(table):
            return packed
        if cached_table is table and len(packed) < 4 * len(table):
            new = table[len(packed) // 4 :]
            packed += struct.pack(f"={len(new)}i", *new)
        else:
            packed = struct.pack(f"={len(table)}i", *table)
        self._packed_table = (table, packed)
        return packed

    def drop_blocks_after(self, keep: int) -> list[int]:
        """Speculative rollback: remove (and return) the block ids after the first `keep`. The packed
        table is repacked at its next use (it only tracks appends by itself)."""
        dropped = self.block_table[keep:]
        del self.block_table[keep:]
        self._packed_table = (self.block_table, b"")
        return dropped

    def reset_for_recompute(self) -> None:
        """Preemption by recompute: the KV is dropped; prompt and output are computed again later."""
        self.num_computed_tokens = 0
        self.block_table = []
        self.num_committed_blocks = 0
        self.status = SequenceStatus.WAITING
        self.num_preemptions += 1

    def __repr__(self) -> str:
        return (
            f"Sequence(id={self.seq_id}, status={self.status.value}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={self.block_table})"
        )
