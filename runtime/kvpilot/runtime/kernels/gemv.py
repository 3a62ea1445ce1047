"""Plain-PyTorch references of the fused decode GEMVs (kernels/gemv_triton.py): the same compositions the
decoder layer runs unfused (residual add + RMSNorm -> linear, SiLU-and-mul -> linear). They are the
oracle for the Triton kernels and the "torch"/"cpu" kernel sets' fused entries."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from kvpilot.runtime.kernels.activation import silu_and_mul_ref
from kvpilot.runtime.kernels.norm import rms_norm_ref

# The decoder layer (and the triton set's linear) take the GEMVs up to this many tokens. The kernels run
# M <= 4, but on the H200 only M = 1 beat cuBLAS (benchmarks/bench_gemv.py: at M = 2 and 4 the fused
# layer was no faster than cuBLAS with the separate norm / SiLU kernels).
GEMV_MAX_M = 1


def norm_linear_ref(
    hidden: torch.Tensor,  # [M, K]
    residual: torch.Tensor | None,  # [M, K]
    norm_weight: torch.Tensor,  # [K]
    eps: float,
    weight: torch.Tensor,  # [N, K]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(h) W^T [M, N], h) with h = hidden + residual (hidden itself without a residual)."""
    h = hidden if residual is None else hidden + residual
    normed = cast(torch.Tensor, rms_norm_ref(h, norm_weight, eps))  # no residual: one tensor back
    return F.linear(normed, weight), h


def silu_linear_ref(gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """gate_up [M, 2K] (gate | up) -> silu(gate) * up [M, K] -> [M, N]."""
    return F.linear(silu_and_mul_ref(gate_up), weight)


def composed_norm_linear(
    rms_norm: Callable[..., Any], linear: Callable[..., torch.Tensor]
) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """norm_linear_ref's contract from a kernel set's own norm and GEMM (the "cpu" set's fused entry)."""

    def norm_linear(
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        norm_weight: torch.Tensor,
        eps: float,
        weight: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return linear(rms_norm(hidden, norm_weight, eps), weight, None), hidden
        normed, h = rms_norm(hidden, norm_weight, eps, residual)
        return linear(normed, weight, None), h

    return norm_linear


def composed_silu_linear(
    silu_and_mul: Callable[..., torch.Tensor], linear: Callable[..., torch.Tensor]
) -> Callable[..., torch.Tensor]:
    """silu_linear_ref's contract from a kernel set's own activation and GEMM."""

    def silu_linear(gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return linear(silu_and_mul(gate_up), weight, None)

    return silu_linear
