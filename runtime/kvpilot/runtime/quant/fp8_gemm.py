"""The fp8 W8A8 GEMM on GPUs with fp8 (sm89+): per-token dynamic activation scales, torch._scaled_mm
with row-wise scales (cuBLASLt), bf16 output (the only output type row-wise scaling allows)."""

from __future__ import annotations

import torch
from kvpilot.runtime.kernels.quant_reference import FP8_MAX


def fp8_scaled_mm(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [M, K] (bf16/fp16), weight [N, K] float8_e4m3fn, weight_scale [N] float32 -> [M, N] in x's dtype."""
    absmax = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=1e-12)  # [M, 1]
    x_scale = absmax / FP8_MAX
    xq = (x.float() / x_scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    y = torch._scaled_mm(
        xq,
        weight.t(),  # [K, N] column-major, as cuBLASLt wants the second operand
        scale_a=x_scale,
        scale_b=weight_scale.view(1, -1),
        bias=None if bias is None else bias.to(torch.bfloat16),
        out_dtype=torch.bfloat16,
    )
    return y if x.dtype == torch.bfloat16 else y.to(x.dtype)
