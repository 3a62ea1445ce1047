"""Pipeline micro-batching (pure arithmetic, no torch): how a step's sequences are split into micro-batches
and in which order the stages work on them.

Without micro-batches a pipeline stage idles while the others work: stage 1 waits for stage 0's whole
batch. Split into M micro-batches (whole sequences: a prefill chunk is one unit), the stages form a
wavefront: at tick t stage s works on micro-batch t - s, so stage 1 runs micro-batch m - 1 while stage 0
runs m. A step of S stages then takes M + S - 1 ticks of one micro-batch each instead of S ticks of the
whole batch.

Splitting only pays when a micro-batch still keeps the device busy. A forward pass over T tokens costs
about max(T, R) "token times", where R (the ridge) is the token count below which streaming the weights,
not the arithmetic, sets the time (about the device's FLOP/s over its memory bandwidth: ~256 tokens on
an H200 in bf16). So a decode step of a few sequences stays whole (each micro-batch would stream every
weight again), and prefill-heavy steps split: micro_batch_count picks the M that minimises
(M + S - 1) * max(largest micro-batch's tokens, R).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from kvpilot.runtime.engine.batch import StepBatch

RIDGE_TOKENS_GPU = 256  # H200 bf16: ~990 TFLOP/s over ~4.8 TB/s is ~200 FLOP per weight byte
RIDGE_TOKENS_CPU = 8  # CPU GEMMs are compute-bound almost at once


@dataclass(frozen=True)
class MicroBatch:
    """Chunks [chunk_start, chunk_end) of the step, their flat token rows [token_start, token_end) and
    their sampled rows [row_start, row_end) among the step's sampled rows (chunk order)."""

    chunk_start: int
    chunk_end: int
    token_start: int
    token_end: int
    row_start: int
    row_end: int
    max_q_len: int
    max_context_len: int

    @property
    def num_tokens(self) -> int:
        return self.token_end - self.token_start


@dataclass(frozen=True)
class ChunkShape:
    """What micro-batching needs of one chunk of the step."""

    num_tokens: int
    context_len: int
    sampled_rows: int  # logits rows it returns (0, or 1 + its speculative tokens)


def contiguous_split(token_counts: Sequence[int], parts: int) -> list[int]:
    """Cut points [0, ..., len] splitting the chunks into `parts` non-empty runs of about equal tokens:
    run i ends at the first chunk whose cumulative tokens reach (i + 1) / parts of the total."""
    n = len(token_counts)
    parts = max(1, min(parts, n))
    total = sum(token_counts)
    cuts, running, chunk = [0], 0, 0
    for part in range(1, parts):
        target = total * part / parts
        # leave at least one chunk for each of the remaining runs
        while chunk < n - (parts - part) and (running < target or chunk == cuts[-1]):
            running += token_counts[chunk]
            chunk += 1
        cuts.append(chunk)
    cuts.append(n)
    return cuts


def _cost(token_counts: Sequence[int], cuts: list[int], stages: int, ridge: int) -> int:
    largest = max(sum(token_counts[a:b]) for a, b in pairwise(cuts))
    return (len(cuts) - 1 + stages - 1) * max(largest, ridge)


def micro_batch_cuts(token_counts: Sequence[int], stages: int, ridge_tokens: int) -> list[int]:
    """The chunk cut points of the cheapest split into 1..stages micro-batches (ties: fewer)."""
    best = [0, len(token_counts)]
    if stages == 1 or len(token_counts) < 2:
        return best
    best_cost = _cost(token_counts, best, stages, ridge_tokens)
    for parts in range(2, min(stages, len(token_counts)) + 1):
        cuts = contiguous_split(token_counts, parts)
        cost = _cost(token_counts, cuts, stages, ridge_tokens)
        if cost < best_cost:
            best, best_cost = cuts, cost
    return best


def plan_micro_batches(chunks: Sequence[ChunkShape], stages: int, ridge_tokens: int) -> list[MicroBatch]:
    """The step's micro-batches, in chunk order (one holding everything when splitting does not pay)."""
    cuts = micro_batch_cuts([c.num_tokens for c in chunks], stages, ridge_tokens)
    out, token, row = [], 0, 0
    for start, end in pairwise(cuts):
        part = chunks[start:end]
        tokens = sum(c.num_tokens for c in part)
        rows = sum(c.sampled_rows for c in part)
        out.append(
            MicroBatch(
                start,
                end,
                token,
                token + tokens,
                row,
                row + rows,
                max(c.num_tokens for c in part),
                max(c.context_len for c in part),
            )
        )
        token, row = token + tokens, row + rows
    return out


def wavefront(stages: int, micro_batches: int) -> list[list[tuple[int, int]]]:
    """The (stage, micro-batch) pairs that run at each tick: stage s works on micro-batch t - s at tick t,
    so every stage is busy once the pipeline has filled (ticks stages - 1 .. micro_batches - 1)."""
    return [
        [(s, t - s) for s in range(stages) if 0 <= t - s < micro_batches]
        for t in range(micro_batches + stages - 1)
    ]


def stage_order(stage: int, stages: int, micro_batches: int) -> list[int]:
    """The micro-batches stage `stage` runs, in its order of the wavefront."""
    return [m for tick in wavefront(stages, micro_batches) for s, m in tick if s == stage]


def plan_step(batch: StepBatch, stages: int, ridge_tokens: int) -> list[MicroBatch]:
    """The micro-batches of one engine step. A step that also returns prompt-logprob rows stays whole
    (those rows index the whole step's tokens)."""
    chunks = [
        ChunkShape(len(c.token_ids), c.start_pos + len(c.token_ids), (1 + c.num_spec) if c.sample else 0)
        for c in batch.chunks
    ]
    return plan_micro_batches(chunks, 1 if batch.prompt_logprob_rows else stages, ridge_tokens)
