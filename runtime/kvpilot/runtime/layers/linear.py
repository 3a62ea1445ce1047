"""Dense projections. A fused projection (q|k|v, gate|up) is one weight made of row shards that the
loader fills from the checkpoint's separate tensors, so the GPU path runs one GEMM instead of several.
cuBLAS (F.linear) is the GEMM on every path."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Module):
    """y = x W^T (+ b). shard_sizes: output rows of each fused part, in order (one part when not fused)."""

    def __init__(self, in_features: int, shard_sizes: tuple[int, ...] | int, *, bias: bool = False) -> None:
        super().__init__()
        self.shard_sizes = (shard_sizes,) if isinstance(shard_sizes, int) else tuple(shard_sizes)
        out_features = sum(self.shard_sizes)
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def shard_rows(self, shard: int) -> slice:
        """The rows of the fused weight that hold part `shard`."""
        start = sum(self.shard_sizes[:shard])
        return slice(start, start + self.shard_sizes[shard])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)
