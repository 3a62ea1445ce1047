"""RMSNorm layer (optionally fused with the residual add before it)."""

from __future__ import annotations

import torch
from kvpilot.runtime.layers.kernel_ops import KernelOps
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, ops: KernelOps) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self._op = ops.rms_norm

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """norm(x); with residual: (norm(x + residual), x + residual)."""
        return self._op(x, self.weight, self.eps, residual)
