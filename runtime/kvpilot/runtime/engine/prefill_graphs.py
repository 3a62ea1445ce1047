"""CUDA graphs for a lone prompt's prefill: one sequence, no cached prefix, bucketed token counts.

An eager prefill launches ~10 kernels per layer from Python. For an 8B model at 1024 tokens the host needs
about as long to launch them as the device needs to run them (H200: ~20 ms of launches for ~21 ms of
kernels; the device starts each layer ~0.2 ms after the host launches it), so a single request's time to
first token is launch-bound. A graph per bucket (multiples of PREFILL_GRAPH_STEP tokens up to max_tokens)
makes the launches one.

A chunk of L tokens runs in the smallest bucket B >= L as two sequences: B - L padding rows first (a
sequence of their own: slot -1 so they store nothing, block table of block 0, attending only to
themselves), then the chunk at its own positions, with its own causal limits. Only the chunk's last row
reaches the LM head. Graphs serve only what they fit: one sampled chunk starting at position 0 (no prefix
cache hit, no recompute after preemption with a prefix), no prompt logprobs, no speculative rows. Mixed
and multi-prompt steps stay eager: their launches are amortised over more tokens.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch
from kvpilot.runtime.engine.batch import StepBatch
from kvpilot.runtime.engine.cuda_graphs import EagerGraph, _Replayable, capture_graph
from kvpilot.runtime.engine.model_inputs import ModelInputs
from kvpilot.runtime.layers.attention import AttentionMetadata

log = logging.getLogger(__name__)

PREFILL_GRAPH_STEP = 256  # bucket granularity: a prompt pays at most 255 padding rows

# (input_ids, positions, meta, rows) -> logits [len(rows), vocab]: the model on every row, the LM head
# on `rows` only
PrefillForward = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor], torch.Tensor]


def prefill_buckets(max_tokens: int) -> list[int]:
    return list(range(PREFILL_GRAPH_STEP, max_tokens + 1, PREFILL_GRAPH_STEP))


def lone_prefill_tokens(batch: StepBatch) -> int | None:
    """The token count of a batch a prefill graph can run (one sampled chunk from position 0), else None."""
    if len(batch.chunks) != 1 or batch.prompt_logprob_rows:
        return None
    chunk = batch.chunks[0]
    if chunk.start_pos != 0 or not chunk.sample or chunk.num_spec:
        return None
    return len(chunk.token_ids)


class PrefillGraphs:
    """Static buffers sized for the largest bucket; each bucket's graph reads their first B rows."""

    def __init__(
        self,
        forward: PrefillForward,
        *,
        max_tokens: int,
        block_size: int,
        device: torch.device,
    ) -> None:
        self.buckets = prefill_buckets(max_tokens)
        if not self.buckets:
            raise ValueError(f"max_tokens must be >= {PREFILL_GRAPH_STEP}, got {max_tokens}")
        self.forward, self.block_size = forward, block_size
        top = self.buckets[-1]
        # a chunk's table covers its tokens; the scheduler may hold one more block for the next token
        self.max_blocks = -(-top // block_size) + 1
        i32, i64 = torch.int32, torch.int64
        self.input_ids = torch.zeros(top, dtype=i64, device=device)
        self.positions = torch.zeros(top, dtype=i64, device=device)
        self.slot_mapping = torch.full((top,), -1, dtype=i64, device=device)
        self.cu_seqlens_q = torch.zeros(3, dtype=i32, device=device)  # [0, padding rows, B]
        self.context_lens = torch.zeros(2, dtype=i32, device=device)
        self.block_tables = torch.zeros(2, self.max_blocks, dtype=i32, device=device)
        # the chunk's last row, B - 1: a constant per bucket, so one small tensor each
        self.rows = {b: torch.full((1,), b - 1, dtype=i64, device=device) for b in self.buckets}
        self.graphs: dict[int, _Replayable] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def bucket(self, batch: StepBatch) -> int | None:
        """The bucket whose graph runs this batch, or None (eager)."""
        tokens = lone_prefill_tokens(batch)
        if not tokens or not self.graphs or len(batch.chunks[0].block_table) > self.max_blocks:
            return None
        return next((b for b in self.buckets if b >= tokens), None)

    def _meta(self, bucket: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:bucket],
            cu_seqlens_q=self.cu_seqlens_q,
            context_lens=self.context_lens,
            block_tables=self.block_tables,
            max_q_len=bucket,
            max_context_len=self.max_blocks * self.block_size,
            # both sequences (the padding rows, the prompt from position 0) have no cached context: the
            # attention reads the step's K/V rows (PagedAttention.uses_step_kv)
            prefix_free=True,
        )

    def _args(self, bucket: int) -> tuple[Any, ...]:
        return self.input_ids[:bucket], self.positions[:bucket], self._meta(bucket), self.rows[bucket]

    def _run_eagerly(self, bucket: int) -> torch.Tensor:
        return self.forward(*self._args(bucket))

    @torch.inference_mode()
    def capture(self, *, eager: bool = False, pool: Any = None) -> Any:
        """Largest bucket first, all in one memory pool (`pool`: e.g. the decode graphs'); returns it.
        eager: stand-ins that run the forward on the static buffers (CPU tests)."""
        for bucket in reversed(self.buckets):
            # a valid layout to capture with: all rows padding except the last, which is the "chunk"
            self._write_layout(bucket, bucket - 1)
            run = functools.partial(self._run_eagerly, bucket)
            if eager:
                self.graphs[bucket] = EagerGraph(run, self.outputs, bucket)
                continue
            graph, self.outputs[bucket] = capture_graph(run, pool)
            pool = graph.pool()
            self.graphs[bucket] = graph
        if not eager:
            torch.cuda.synchronize()
            log.info("captured prefill CUDA graphs for %s tokens", self.buckets)
        return pool

    def _write_layout(self, bucket: int, padding: int) -> None:
        self.cu_seqlens_q.copy_(torch.tensor([0, padding, bucket], dtype=torch.int32))
        self.context_lens.copy_(torch.tensor([padding, bucket - padding], dtype=torch.int32))

    def run(self, inputs: ModelInputs, bucket: int) -> torch.Tensor:
        """Replay with `inputs` from model_inputs.prepare_prefill_graph_inputs(chunk, bucket, ...);
        logits [1, vocab] of the chunk's last row."""
        meta = inputs.meta
        if inputs.input_ids.shape[0] != bucket or meta.block_tables.shape[0] != 2:
            raise ValueError(f"prefill graph inputs must be a padding sequence and a chunk of {bucket} rows")
        width = meta.block_tables.shape[1]
        self.input_ids[:bucket].copy_(inputs.input_ids, non_blocking=True)
        self.positions[:bucket].copy_(inputs.positions, non_blocking=True)
        self.slot_mapping[:bucket].copy_(meta.slot_mapping, non_blocking=True)
        self.cu_seqlens_q.copy_(meta.cu_seqlens_q, non_blocking=True)
        self.context_lens.copy_(meta.context_lens, non_blocking=True)
        self.block_tables[:, :width].copy_(meta.block_tables, non_blocking=True)
        self.block_tables[:, width:].fill_(0)
        self.graphs[bucket].replay()
        return self.outputs[bucket]
