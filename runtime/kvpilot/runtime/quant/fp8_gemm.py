"""The fp8 GEMMs on GPUs with fp8 (sm89+), chosen by the token count M (a shape, so CUDA graphs capture
one choice per batch size):
  M <= FP8_GEMV_MAX_M  weight-only: fp8 weights dequantized in registers against 16-bit activations
                       (kernels/fp8_gemv_triton.py), a pure weight stream at decode;
  larger M             W8A8: per-token dynamic activation scales (one Triton launch,
                       kernels/fp8_quant_triton.py), then torch._scaled_mm with row-wise scales (cuBLASLt)
                       and bf16 output (the only output type row-wise scaling allows)."""

from __future__ import annotations

import torch
from kvpilot.runtime.kernels.fp8_gemv_triton import FP8_GEMV_MAX_M, fp8_gemv
from kvpilot.runtime.kernels.fp8_quant_triton import quantize_fp8_rows_triton
from kvpilot.runtime.quant.fused_gemv import FUSED_M, fp8_config


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    gemv: bool = True,
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [..., K] @ (weight [N, K] fp8 * weight_scale [N])^T (+ bias) -> [..., N] in x's dtype; gemv=False
    keeps W8A8 at every M. counters: the weight's persistent split-K counters (split_counters)."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if gemv and x2.shape[0] <= FP8_GEMV_MAX_M:
        x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
        # batch 1: programmatic dependent launch, as the fused GEMVs around it (quant/fused_gemv.py)
        n, k = weight.shape
        cfg = fp8_config(n, k, x.device) if x2.shape[0] == FUSED_M else None
        y = fp8_gemv(x2, weight, weight_scale, cfg, counters)
        y = y if bias is None else y + bias
        return y.reshape(*lead, y.shape[-1])
    return fp8_scaled_mm(x, weight, weight_scale, bias)


def warm_up_fp8_gemv(
    weight: torch.Tensor, weight_scale: torch.Tensor, dtype: torch.dtype, counters: torch.Tensor
) -> None:
    """Run the GEMV once per launch shape it uses (M = 1 multiply-adds with PDL, M > 1 dots), so Triton
    compiles them while the model loads."""
    for m in (1, 2):
        x = torch.zeros(m, weight.shape[1], device=weight.device, dtype=dtype)
        fp8_linear(x, weight, weight_scale, None, counters=counters)


def fp8_scaled_mm(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [M, K] (bf16/fp16), weight [N, K] float8_e4m3fn, weight_scale [N] float32 -> [M, N] in x's dtype."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    xq, x_scale = quantize_fp8_rows_triton(x2 if x2.stride(-1) == 1 else x2.contiguous())  # [M, K], [M, 1]
    y = torch._scaled_mm(
        xq,
        weight.t(),  # [K, N] column-major, as cuBLASLt wants the second operand
        scale_a=x_scale,
        scale_b=weight_scale.view(1, -1),
        out_dtype=torch.bfloat16,
    )  # bias added after: not every torch build fuses a bias into the row-wise scaled GEMM
    y = y if x.dtype == torch.bfloat16 else y.to(x.dtype)
    y = y if bias is None else y + bias
    return y.reshape(*lead, y.shape[-1])
