"""RMSNorm layer (optionally fused with the residual add before it)."""

from __future__ import annotations

import torch
from kvpilot.runtime.kernels.cpu import rms_norm_cpu
from kvpilot.runtime.kernels.norm import rms_norm_ref
from kvpilot.runtime.layers.backend import lazy_op, pick_op
from torch import nn

_RMS_NORM = {
    "torch": rms_norm_ref,
    "cpu": rms_norm_cpu,
    "triton": lazy_op("kvpilot.runtime.kernels.norm_triton", "rms_norm_triton"),
}


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float, *, backend: str = "torch") -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self._op = pick_op(_RMS_NORM, backend, "rms_norm")

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """norm(x); with residual: (norm(x + residual), x + residual)."""
        return self._op(x, self.weight, self.eps, residual)
