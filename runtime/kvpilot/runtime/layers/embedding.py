"""Token embedding and the LM head (which may share the embedding's weight), vocab-parallel.

With tensor parallelism each rank holds one block of ceil(vocab / tp) rows (sharding.vocab_split; the last
block is padded with zero rows): the embedding looks up the ids in its block (zeros elsewhere) and sums
over the ranks; the LM head computes its block's logits and all-gathers them, so every rank ends with the
full [rows, vocab] logits (rank 0 samples them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from kvpilot.runtime.distributed.comm import Comm
from kvpilot.runtime.distributed.sharding import TensorSplit, vocab_rows, vocab_split
from kvpilot.runtime.layers.kernel_ops import KernelOps
from torch import nn


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, comm: Comm | None = None) -> None:
        super().__init__()
        self._comm = comm
        tp, tp_rank = (1, 0) if comm is None else (comm.tp_size, comm.tp_rank)
        self.split = vocab_split(vocab_size, tp, tp_rank)
        self.rows = vocab_rows(vocab_size, tp)
        self.start = 0 if self.split is None else tp_rank * self.rows
        self.weight = nn.Parameter(torch.empty(self.rows, hidden_size))

    def checkpoint_split(self, param: str, shard: int | None) -> TensorSplit | None:
        return self.split

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.split is None or self._comm is None:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.start  # [T]; ids of other ranks' blocks look up row 0, then zeroed
        outside = (local < 0) | (local >= self.rows)
        hidden = F.embedding(local.masked_fill(outside, 0), self.weight)
        hidden.masked_fill_(outside[:, None], 0.0)
        return self._comm.all_reduce(hidden)


class LMHead(nn.Module):
    """hidden -> vocab logits in the GEMM's dtype (bf16 on a GPU: float32 would only widen the same values,
    at 3x the bytes of a [256, 152k] step's logits for the argmax to read back). Only the rows that are
    sampled should be passed in; whatever needs float32 (processing, logprobs) widens its own rows."""

    def __init__(self, vocab_size: int, hidden_size: int, ops: KernelOps, comm: Comm | None = None) -> None:
        super().__init__()
        self._comm = comm
        self.vocab_size = vocab_size
        tp, tp_rank = (1, 0) if comm is None else (comm.tp_size, comm.tp_rank)
        self.split = vocab_split(vocab_size, tp, tp_rank)
        self.weight = nn.Parameter(torch.empty(vocab_rows(vocab_size, tp), hidden_size))
        self._op = ops.linear

    def checkpoint_split(self, param: str, shard: int | None) -> TensorSplit | None:
        return self.split

    def tie_to(self, embedding: VocabEmbedding) -> None:
        self.weight = embedding.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self._op(hidden, self.weight, None)  # [rows, vocab / tp] (this rank's block)
        if self.split is not None and self._comm is not None:
            logits = self._comm.all_gather_columns(logits)[:, : self.vocab_size]  # [rows, vocab]
            return logits.contiguous()
        return logits
