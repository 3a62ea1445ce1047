"""The host-side caches of the engine's hot path give exactly what the uncached computation gives."""

from __future__ import annotations

import random

from kvpilot.runtime.engine.batch import SeqChunk, StepBatch


def _reference_summary(chunks: list[SeqChunk]) -> tuple[int, int, bool]:
    return (sum(len(c.token_ids) for c in chunks), sum(1 for c in chunks if c.sample),
            all(len(c.token_ids) == 1 for c in chunks))


def _summary(batch: StepBatch) -> tuple[int, int, bool]:
    return batch.num_tokens, batch.num_sampled, batch.is_decode_only


def test_step_batch_properties_match_the_uncached_sums_while_the_batch_grows() -> None:
    rng = random.Random(0)
    batch = StepBatch([])
    assert _summary(batch) == (0, 0, True)
    for i in range(60):
        n = rng.choice([1, 1, 1, 0, 2, 7])
        batch.chunks.append(SeqChunk(i, [5] * n, rng.randrange(50), [1, 2, 3, 4], rng.random() < 0.8))
        if rng.random() < 0.5:  # read part-way through building: the summary must follow the growth
            assert _summary(batch) == _reference_summary(batch.chunks)
    assert _summary(batch) == _reference_summary(batch.chunks)


def test_decode_only_needs_exactly_one_token_per_chunk() -> None:
    """Zero- and two-token chunks that sum to one token per chunk are not a decode-only batch."""
    batch = StepBatch([SeqChunk(0, [], 3, [0], False), SeqChunk(1, [4, 5], 3, [1], True)])
    assert _summary(batch) == (2, 1, False) == _reference_summary(batch.chunks)
    assert StepBatch([SeqChunk(0, [9], 3, [0], True)]).is_decode_only
