"""The gated MLP activation: silu(gate) * up over a fused [gate | up] input."""

from __future__ import annotations

import torch
from kvpilot.runtime.layers.kernel_ops import KernelOps
from torch import nn


class SiluAndMul(nn.Module):
    def __init__(self, ops: KernelOps) -> None:
        super().__init__()
        self._op = ops.silu_and_mul

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self._op(gate_up)
