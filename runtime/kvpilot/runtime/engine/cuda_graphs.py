"""CUDA graphs for decode steps: one graph per bucketed batch size, replayed with static input buffers.

A decode step of a small model is hundreds of tiny kernel launches; replaying a captured graph turns them
into one launch. Inputs are copied into static buffers (padded up to the bucket: padding rows store nothing,
slot -1, and attend to one position of block 0, so they cost almost nothing and touch no live data). The
block-table width is fixed at capture (max_model_len / block_size), which is why the decode kernel's grid
depends only on tensor shapes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from kvpilot.runtime.engine.model_inputs import ModelInputs
from kvpilot.runtime.layers.attention import AttentionMetadata

log = logging.getLogger(__name__)

ForwardFn = Callable[[torch.Tensor, torch.Tensor, AttentionMetadata], torch.Tensor]


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """1, 2, 4, 8, then every 8 up to max_num_seqs (as vLLM buckets): padding wastes < 8 rows."""
    sizes = [s for s in (1, 2, 4) if s < max_num_seqs] + list(range(8, max_num_seqs + 1, 8))
    if not sizes or sizes[-1] < max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


class DecodeGraphs:
    """Captured decode graphs. `forward(input_ids, positions, meta) -> logits [rows, vocab]` is the model
    step (embedding to LM head); it must only use the tensors it is given."""

    def __init__(
        self,
        forward: ForwardFn,
        *,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        block_size: int,
        device: torch.device,
    ) -> None:
        self.forward, self.block_size = forward, block_size
        self.sizes = graph_batch_sizes(max_num_seqs)
        self.max_blocks = max_blocks_per_seq
        n = self.sizes[-1]
        i32, i64 = {"dtype": torch.int32, "device": device}, {"dtype": torch.int64, "device": device}
        self.input_ids = torch.zeros(n, **i64)
        self.positions = torch.zeros(n, **i64)
        self.slot_mapping = torch.full((n,), -1, **i64)
        self.context_lens = torch.ones(n, **i32)
        self.block_tables = torch.zeros(n, max_blocks_per_seq, **i32)
        self.cu_seqlens_q = torch.arange(n + 1, **i32)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def _meta(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:size],
            cu_seqlens_q=self.cu_seqlens_q[: size + 1],
            context_lens=self.context_lens[:size],
            block_tables=self.block_tables[:size],
            max_q_len=1,
            max_context_len=self.max_blocks * self.block_size,
        )

    @torch.inference_mode()
    def capture(self) -> None:
        """Largest first, sharing one memory pool, so every smaller graph reuses the largest one's memory."""
        pool = None
        for size in reversed(self.sizes):
            args = (self.input_ids[:size], self.positions[:size], self._meta(size))
            self.forward(*args)  # warm-up: triton autotuning/compilation happens outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[size] = self.forward(*args)
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize()
        log.info("captured decode CUDA graphs for batch sizes %s", self.sizes)

    def bucket(self, num_seqs: int, num_blocks: int) -> int | None:
        """The graph that can run this decode batch, or None (eager) when none fits."""
        if num_blocks > self.max_blocks or num_seqs > self.sizes[-1] or not self.graphs:
            return None
        return next(s for s in self.sizes if s >= num_seqs)

    def run(self, inputs: ModelInputs, size: int) -> torch.Tensor:
        """Copy a decode batch (built on the host) into the static buffers, replay; logits [rows, vocab]."""
        rows = inputs.input_ids.shape[0]
        meta = inputs.meta
        width = meta.block_tables.shape[1]
        self.input_ids[:rows].copy_(inputs.input_ids, non_blocking=True)
        self.positions[:rows].copy_(inputs.positions, non_blocking=True)
        self.slot_mapping[:rows].copy_(meta.slot_mapping, non_blocking=True)
        self.context_lens[:rows].copy_(meta.context_lens, non_blocking=True)
        self.block_tables[:rows, :width].copy_(meta.block_tables, non_blocking=True)
        if rows < size:  # padding rows: store nothing, attend to position 0 of block 0
            self.slot_mapping[rows:size].fill_(-1)
            self.context_lens[rows:size].fill_(1)
            self.block_tables[rows:size, 0].fill_(0)
        self.graphs[size].replay()
        return self.outputs[size][:rows]
