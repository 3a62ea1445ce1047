"""Paged KV-cache bookkeeping: fixed-size blocks, reference counts, prefix cache, LRU reuse (no torch).

Prefix cache: every FULL block of known tokens gets a chained hash, hash_fn(parent_hash, block_tokens).
A hash only finds a candidate; a hit is confirmed against the tokens stored with the block and against
the identity of its parent (a generation number that changes whenever a block is re-registered), so a
hash collision can never hand a sequence KV computed for other tokens. Freed blocks keep their hash and
stay findable until they are reused; reuse takes never-cached blocks first, then cached ones least
recently freed first. A sequence's blocks are freed last-block-first, so the tail of a prefix is
evicted before its head.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from kvpilot.runtime.engine.sequence import Sequence

HashFn = Callable[[int | None, tuple[int, ...]], int]
_ROOT_GENERATION = 0


def hash_block_tokens(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """Chained block hash. Deterministic across processes (ints and tuples are not salted)."""
    return hash((parent_hash, token_ids))


@dataclass
class _Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None  # set while the block is findable in the prefix cache
    token_ids: tuple[int, ...] = ()
    generation: int = _ROOT_GENERATION  # unique per registration
    parent_generation: int = _ROOT_GENERATION


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        hash_fn: HashFn = hash_block_tokens,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be positive, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._hash_fn = hash_fn
        self._blocks = [_Block(i) for i in range(num_blocks)]
        self._free_uncached: deque[int] = deque(range(num_blocks))
        self._free_cached: OrderedDict[int, None] = OrderedDict()  # oldest-freed first
        self._cache: dict[int, int] = {}  # hash -> block id
        self._next_generation = _ROOT_GENERATION + 1
        self.prefix_cache_queries = 0  # tokens looked up at admission (cumulative)
        self.prefix_cache_hits = 0  # tokens found (cumulative)

    # ---- counters -------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self._free_uncached) + len(self._free_cached)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def ref_count(self, block_id: int) -> int:
        return self._blocks[block_id].ref_count

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- prefix cache ---------------------------------------------------------------------------
    def _update_hashes(self, seq: Sequence, num_full_blocks: int) -> list[int]:
        """Hashes of the first full blocks; their token tuples are kept beside them (seq.block_tokens)."""
        bs = self.block_size
        hashes, tokens = seq.block_hashes, seq.block_tokens
        while len(hashes) < num_full_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            block_tokens = tuple(seq.token_slice(i * bs, (i + 1) * bs))
            hashes.append(self._hash_fn(parent, block_tokens))
            tokens.append(block_tokens)
        return hashes[:num_full_blocks]

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks holding a prefix of `seq`'s tokens. Never the whole sequence: at least its last
        token is left to compute, so the step that finishes the prefill has logits to sample from."""
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        hashes = self._update_hashes(seq, (seq.num_tokens - 1) // bs)
        found: list[int] = []
        parent_generation = _ROOT_GENERATION
        for i, h in enumerate(hashes):
            block_id = self._cache.get(h)
            if block_id is None:
                break
            block = self._blocks[block_id]
            if block.parent_generation != parent_generation or block.token_ids != seq.block_tokens[i]:
                break  # a hash collision: same hash, different prefix
            found.append(block_id)
            parent_generation = block.generation
        return found

    def commit_computed(self, seq: Sequence) -> None:
        """Make the full blocks whose KV is now computed findable by later sequences."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        num_full = min(seq.num_computed_tokens, seq.num_resolved_tokens) // bs  # never a placeholder
        if num_full <= seq.num_committed_blocks:
            return
        hashes = self._update_hashes(seq, num_full)
        start, seq.num_committed_blocks = seq.num_committed_blocks, num_full
        for i in range(start, num_full):
            block = self._blocks[seq.block_table[i]]
            if block.hash is not None:
                continue  # already cached (a hit, or committed by an earlier step)
            if hashes[i] in self._cache:
                continue  # another block already holds this prefix (or collides): leave this one private
            parent = self._blocks[seq.block_table[i - 1]] if i else None
            if parent is not None and parent.hash is None:
                break  # parent not cached: a child would be unreachable
            block.hash = hashes[i]
            block.token_ids = seq.block_tokens[i]
            block.generation = self._next_generation
            block.parent_generation = parent.generation if parent else _ROOT_GENERATION
            self._next_generation += 1
            self._cache[hashes[i]] = block.block_id

    # ---- allocation -----------------------------------------------------------------------------
    def _take_free_block(self) -> int:
        if self._free_uncached:
            block_id = self._free_uncached.popleft()
        else:
            block_id, _ = self._free_cached.popitem(last=False)  # evict the least recently freed
            self._evict(self._blocks[block_id])
        self._blocks[block_id].ref_count = 1
        return block_id

    def _evict(self, block: _Block) -> None:
        if block.hash is not None and self._cache.get(block.hash) == block.block_id:
            del self._cache[block.hash]
        block.hash = None
        block.token_ids = ()

    def _acquire(self, block_id: int) -> None:
        block = self._blocks[block_id]
        if block.ref_count == 0:
            del self._free_cached[block_id]
        block.ref_count += 1

    def num_appendable_tokens(self, seq: Sequence) -> int:
        """Tokens `seq` could still get slots for: room in its last block plus every free block."""
        return (
            len(seq.block_table) * self.block_size
            - seq.num_computed_tokens
            + (self.num_free_blocks * self.block_size)
        )

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Cover positions up to num_computed_tokens + num_new_tokens with blocks. All or nothing."""
        needed = -(-(seq.num_computed_tokens + num_new_tokens) // self.block_size) - len(seq.block_table)
        if needed <= 0:
            return True
        if needed > self.num_free_blocks:
            return False
        for _ in range(needed):
            seq.block_table.append(self._take_free_block())
        return True

    def trim(self, seq: Sequence, num_tokens: int) -> None:
        """Speculative rollback: free the blocks past those covering the first `num_tokens` positions
        (they held rejected draft tokens; such blocks are never in the prefix cache, since only blocks
        full of computed, accepted tokens are committed)."""
        keep = self.blocks_for(num_tokens)
        if keep < len(seq.block_table):
            if keep < seq.num_committed_blocks:
                raise ValueError(f"sequence {seq.seq_id}: cannot trim committed blocks")
            self.free_blocks(seq.drop_blocks_after(keep))

    def admit(self, seq: Sequence, token_budget: int) -> int:
        """Give a waiting sequence its cached prefix and slots for its first chunk.

        Returns how many tokens to compute this step (at most `token_budget`), or 0 when the blocks for
        them are not available (nothing changes then)."""
        if seq.block_table or seq.num_computed_tokens:
            raise ValueError(f"sequence {seq.seq_id} already holds blocks")
        if token_budget < 1:
            return 0
        # prompt logprobs need the logits of every prompt token: no cached prefix (as in vLLM)
        cached = self.match_prefix(seq) if seq.params.prompt_logprobs is None else []
        num_cached = len(cached) * self.block_size
        chunk = min(seq.num_tokens - num_cached, token_budget)
        new_blocks = self.blocks_for(num_cached + chunk) - len(cached)
        revived = sum(1 for b in cached if self._blocks[b].ref_count == 0)
        if new_blocks + revived > self.num_free_blocks:
            return 0
        for block_id in cached:
            self._acquire(block_id)
        seq.block_table = list(cached)
        seq.num_computed_tokens = num_cached
        for _ in range(new_blocks):
            seq.block_table.append(self._take_free_block())
        if seq.num_cached_tokens is None:
            seq.num_cached_tokens = num_cached
        if self.enable_prefix_caching:
            self.prefix_cache_queries += seq.num_tokens
            self.prefix_cache_hits += num_cached
        return chunk

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's references, last block first; blocks nobody holds become reusable."""
        self.free_blocks(seq.block_table)
        seq.block_table = []

    def free_blocks(self, block_ids: Seq[int]) -> None:
        for block_id in reversed(block_ids):
            block = self._blocks[block_id]
            if block.ref_count <= 0:
                raise ValueError(f"block {block_id} freed more often than allocated")
            block.ref_count -= 1
            if block.ref_count == 0:
                if block.hash is not None:
                    self._free_cached[block_id] = None
                else:
                    self._free_uncached.append(block_id)
