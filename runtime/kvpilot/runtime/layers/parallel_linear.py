"""Tensor-parallel projections (Megatron's split): a column-parallel layer holds some output rows of its
weight and needs no communication; the row-parallel layer after it holds the matching input columns and
sums the ranks' partial outputs with one all-reduce. So attention (QKV column, O row) and the MLP (gate/up
column, down row) each cost one all-reduce per layer.
"""

from __future__ import annotations

import torch
from kvpilot.runtime.distributed.comm import Comm
from kvpilot.runtime.distributed.sharding import TensorSplit, even_split
from kvpilot.runtime.layers.kernel_ops import KernelOps
from kvpilot.runtime.layers.linear import Linear


class ColumnParallelLinear(Linear):
    """parts: the full output rows of each fused part; each rank holds `splits` of them (default: an even
    1/tp of every part; QKV passes its KV-head splits)."""

    def __init__(
        self,
        in_features: int,
        parts: tuple[int, ...],
        ops: KernelOps,
        comm: Comm,
        *,
        bias: bool = False,
        splits: tuple[TensorSplit | None, ...] | None = None,
    ) -> None:
        if splits is None:
            splits = tuple(even_split(size, comm.tp_size, comm.tp_rank) for size in parts)
        local = tuple(size if s is None else s.length for size, s in zip(parts, splits, strict=True))
        super().__init__(in_features, local, ops, bias=bias)
        self.weight_splits = splits


class RowParallelLinear(Linear):
    """Holds 1/tp of the input columns; the partial products are summed across the stage's ranks. The bias
    is added once (by tensor-parallel rank 0), before the sum."""

    def __init__(
        self, in_features: int, out_features: int, ops: KernelOps, comm: Comm, *, bias: bool = False
    ) -> None:
        super().__init__(in_features // comm.tp_size, out_features, ops, bias=bias)
        self.weight_splits = (even_split(in_features, comm.tp_size, comm.tp_rank, dim=1),)
        self._comm = comm
        self._adds_bias = comm.tp_rank == 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.matmul(x, self.bias if self._adds_bias else None)  # [T, out], partial sum
        return self._comm.all_reduce(y)
