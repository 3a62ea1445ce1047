"""CUDA graphs for decode and verification steps: one graph per bucketed batch size, replayed with static
input buffers.

A decode step of a small model is hundreds of tiny kernel launches; replaying a captured graph turns them
into one launch. A graph set serves steps in which every sequence has exactly `query_len` query tokens:
1 for decode steps, k + 1 for speculative verification (a sequence with fewer drafts is front-padded, see
model_inputs.prepare_padded_inputs). Inputs are copied into static buffers, padded up to the bucket:
padding sequences store nothing (slot -1) and attend to the first query_len positions of block 0 (every
query row sees at least one position), so they cost almost nothing and touch no live data. The
block-table width is fixed at capture (max_model_len / block_size), which is why the attention kernels'
grids depend only on tensor shapes.

Where no graph can be captured (CPU tests), capture(eager=True) builds stand-ins with the same interface
whose replay runs the forward on the same static buffers: the buffer filling, padding and bucketing are
then exercised exactly as on the GPU.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, Protocol

import torch
from kvpilot.runtime.engine.batch import StepBatch
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


def fits_verify_graph(batch: StepBatch, query_len: int) -> bool:
    """A verification step a graph of query_len rows per sequence can run: some chunk carries drafts,
    no chunk has more rows than that, and every context is long enough for the front padding."""
    spec = False
    for chunk in batch.chunks:
        if len(chunk.token_ids) > query_len or chunk.context_len < query_len:
            return False
        spec = spec or chunk.num_spec > 0
    return spec


class _Replayable(Protocol):
    def replay(self) -> None: ...


class EagerGraph:
    """A stand-in for a captured graph: replay() runs the forward on the static buffers and stores the
    logits where the graph's output would be."""

    def __init__(self, run: Callable[[], torch.Tensor], outputs: dict[int, torch.Tensor], size: int) -> None:
        self._run, self._outputs, self._size = run, outputs, size

    def replay(self) -> None:
        self._outputs[self._size] = self._run()


def capture_graph(run: Callable[[], torch.Tensor], pool: Any) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """One graph of run() in memory pool `pool` (None: a new one; the graph's is graph.pool()), after an
    eager warm-up so Triton compiles and cuBLAS picks its kernels outside the capture; (graph, output)."""
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        output = run()
    return graph, output


class StepGraphs:
    """Captured step graphs for sequences of `query_len` query tokens each. `forward(input_ids, positions,
    meta) -> logits [rows, vocab]` is the model step (embedding to LM head); it must only use the tensors
    it is given."""

    def __init__(
        self,
        forward: ForwardFn,
        *,
        max_num_seqs: int,
        max_blocks_per_seq: int,
        block_size: int,
        device: torch.device,
        query_len: int = 1,
    ) -> None:
        if query_len < 1:
            raise ValueError(f"query_len must be >= 1, got {query_len}")
        self.forward, self.block_size, self.query_len = forward, block_size, query_len
        self.sizes = graph_batch_sizes(max_num_seqs)
        self.max_blocks = max_blocks_per_seq
        n, q = self.sizes[-1], query_len
        i32, i64 = torch.int32, torch.int64
        # per query row [n * q]; per sequence [n]; cu_seqlens_q is fixed: sequence s owns rows s*q .. s*q+q-1
        self.input_ids = torch.zeros(n * q, dtype=i64, device=device)
        self.positions = torch.zeros(n * q, dtype=i64, device=device)
        self.slot_mapping = torch.full((n * q,), -1, dtype=i64, device=device)
        self.context_lens = torch.full((n,), q, dtype=i32, device=device)
        self.block_tables = torch.zeros(n, max_blocks_per_seq, dtype=i32, device=device)
        self.cu_seqlens_q = torch.arange(0, (n + 1) * q, q, dtype=i32, device=device)
        self.graphs: dict[int, _Replayable] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool: Any = None  # the memory pool the graphs share (another graph set may share it too)

    def _meta(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[: size * self.query_len],
            cu_seqlens_q=self.cu_seqlens_q[: size + 1],
            context_lens=self.context_lens[:size],
            block_tables=self.block_tables[:size],
            max_q_len=self.query_len,
            max_context_len=self.max_blocks * self.block_size,
        )

    def _run_eagerly(self, size: int) -> torch.Tensor:
        return self.forward(*self._args(size))

    def _args(self, size: int) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        rows = size * self.query_len
        return self.input_ids[:rows], self.positions[:rows], self._meta(size)

    @torch.inference_mode()
    def capture(self, *, eager: bool = False, pool: Any = None) -> None:
        """Largest first, sharing one memory pool (`pool`, e.g. another graph set's, or a new one), so
        every smaller graph reuses the largest one's memory. eager: stand-ins, no CUDA (see EagerGraph)."""
        if eager:
            for size in self.sizes:
                self.graphs[size] = EagerGraph(functools.partial(self._run_eagerly, size), self.outputs, size)
            return
        for size in reversed(self.sizes):
            graph, self.outputs[size] = capture_graph(functools.partial(self._run_eagerly, size), pool)
            pool = graph.pool()
            self.graphs[size] = graph
        self.pool = pool
        torch.cuda.synchronize()
        log.info("captured CUDA graphs for batch sizes %s, %d query tokens each", self.sizes, self.query_len)

    def bucket(self, num_seqs: int, num_blocks: int) -> int | None:
        """The graph that can run a batch of this many sequences, or None (eager) when none fits."""
        if num_blocks > self.max_blocks or num_seqs > self.sizes[-1] or not self.graphs:
            return None
        return next(s for s in self.sizes if s >= num_seqs)

    def run(self, inputs: ModelInputs, size: int) -> torch.Tensor:
        """Copy a batch (built on the host, query_len rows per sequence) into the static buffers, replay;
        logits [rows, vocab] of its query rows."""
        rows, meta = inputs.input_ids.shape[0], inputs.meta
        seqs, width = meta.block_tables.shape
        if rows != seqs * self.query_len:
            raise ValueError(f"{rows} query rows for {seqs} sequences of {self.query_len} tokens each")
        self.input_ids[:rows].copy_(inputs.input_ids, non_blocking=True)
        self.positions[:rows].copy_(inputs.positions, non_blocking=True)
        self.slot_mapping[:rows].copy_(meta.slot_mapping, non_blocking=True)
        self.context_lens[:seqs].copy_(meta.context_lens, non_blocking=True)
        self.block_tables[:seqs, :width].copy_(meta.block_tables, non_blocking=True)
        if seqs < size:  # padding sequences: store nothing, attend to positions 0.. of block 0
            self.slot_mapping[rows : size * self.query_len].fill_(-1)
            self.context_lens[seqs:size].fill_(self.query_len)
            self.block_tables[seqs:size].fill_(0)
        self.graphs[size].replay()
        return self.outputs[size][:rows]
