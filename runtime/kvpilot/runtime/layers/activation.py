"""The gated MLP activation: silu(gate) * up over a fused [gate | up] input."""

from __future__ import annotations

import torch
from kvpilot.runtime.kernels.activation import silu_and_mul_ref
from kvpilot.runtime.kernels.cpu import silu_and_mul_cpu
from kvpilot.runtime.layers.backend import lazy_op, pick_op
from torch import nn

_SILU_AND_MUL = {
    "torch": silu_and_mul_ref,
    "cpu": silu_and_mul_cpu,
    "triton": lazy_op("kvpilot.runtime.kernels.activation_triton", "silu_and_mul_triton"),
}


class SiluAndMul(nn.Module):
    def __init__(self, *, backend: str = "torch") -> None:
        super().__init__()
        self._op = pick_op(_SILU_AND_MUL, backend, "silu_and_mul")

    def forward(self, gate_up: torch.Tensor) -> torch.Tensor:
        return self._op(gate_up)
