"""A per-replica LRU memory of the prefix blocks the gateway has sent to it (an estimate of its cache)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class BlockMemory:
    """Remembers up to `capacity` block hashes; the oldest-used are forgotten first.

    Reading (`matched_prefix`, `in`) never changes recency, so a routing policy can read it without side
    effects; only `record` (called once a request is routed) refreshes and inserts.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: object) -> bool:
        return block_hash in self._blocks

    def matched_prefix(self, hashes: Iterable[int]) -> int:
        """How many leading blocks of a chain are remembered (chained hashes: stop at the first miss)."""
        matched = 0
        for block_hash in hashes:
            if block_hash not in self._blocks:
                break
            matched += 1
        return matched

    def record(self, hashes: Iterable[int]) -> None:
        for block_hash in hashes:
            self._blocks[block_hash] = None
            self._blocks.move_to_end(block_hash)
        while len(self._blocks) > self._capacity:
            self._blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()
