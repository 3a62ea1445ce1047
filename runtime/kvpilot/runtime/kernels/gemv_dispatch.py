"""The "triton" kernel set's GEMM entries (layers/kernel_ops.py): the bf16 GEMV of kernels/gemv_triton.py
at <= GEMV_MAX_M rows (batch-1 decode), with the op before the projection fused into it, and the unfused
ops (RMSNorm / SiLU-and-mul Triton kernels, cuBLAS) otherwise. The token count is a shape, so each captured
CUDA graph bakes in one path."""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F
from kvpilot.runtime.kernels.activation_triton import silu_and_mul_triton
from kvpilot.runtime.kernels.gemv import GEMV_MAX_M, composed_norm_linear, composed_silu_linear
from kvpilot.runtime.kernels.gemv_triton import (
    GemvBf16Config,
    default_gemv_bf16_config,
    gemv_bf16,
    norm_gemv_bf16,
    silu_gemv_bf16,
)
from kvpilot.runtime.kernels.norm_triton import rms_norm_triton
from kvpilot.runtime.kernels.triton_utils import num_sms, pdl_supported

# Programmatic dependent launch for the dispatched GEMVs on sm_90+ (GemvBf16Config.pdl: measured 1.6%
# faster over 36 layers' decode GEMMs in one CUDA graph, outputs identical).
USE_PDL = True

_norm_linear_unfused = composed_norm_linear(rms_norm_triton, F.linear)
_silu_linear_unfused = composed_silu_linear(silu_and_mul_triton, F.linear)


def gemv_supported(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether x [M, K] @ weight [N, K]^T goes to the GEMV: M <= GEMV_MAX_M, K a multiple of 16, dense
    float tensors of one dtype."""
    m, k = x.shape[0], weight.shape[-1]
    dense = x.dim() == 2 and x.stride(-1) == 1 and weight.dim() == 2 and weight.is_contiguous()
    same_float = x.dtype == weight.dtype and x.is_floating_point()
    return 1 <= m <= GEMV_MAX_M and k % 16 == 0 and dense and same_float


def pdl_enabled(device: torch.device) -> bool:
    """Programmatic dependent launch for the decode GEMVs: USE_PDL, on Hopper and newer (also the
    quantized formats' fused GEMVs, quant/fused_gemv.py)."""
    return USE_PDL and pdl_supported(device)


def dispatch_config(prologue: str, m: int, weight: torch.Tensor) -> GemvBf16Config:
    """default_gemv_bf16_config for this weight; a split-K is summed by a second launch (the layers keep
    no fixup counters); PDL on Hopper and newer when USE_PDL."""
    n, k = weight.shape
    cfg = default_gemv_bf16_config(m, n, k, num_sms(weight.device), prologue)
    pdl = pdl_enabled(weight.device)
    return replace(cfg, reduce="workspace" if cfg.split_k > 1 else cfg.reduce, pdl=pdl)


def linear_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """KernelOps.linear: the GEMV for bias-free projections of <= GEMV_MAX_M rows (o_proj and the LM head
    at batch-1 decode), F.linear (cuBLAS) otherwise."""
    if bias is not None or x.dim() != 2 or not gemv_supported(x, weight):
        return F.linear(x, weight, bias)
    return gemv_bf16(x, weight, dispatch_config("plain", x.shape[0], weight))


def norm_linear_triton(
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """KernelOps.norm_linear: one fused GEMV launch when gemv_supported, else RMSNorm then F.linear."""
    if not gemv_supported(hidden, weight):
        return _norm_linear_unfused(hidden, residual, norm_weight, eps, weight)
    cfg = dispatch_config("norm", hidden.shape[0], weight)
    return norm_gemv_bf16(hidden, residual, norm_weight, eps, weight, cfg)


def silu_linear_triton(gate_up: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """KernelOps.silu_linear: one fused GEMV launch when gemv_supported, else SiLU-and-mul, F.linear."""
    if gate_up.dim() != 2 or not gemv_supported(gate_up, weight):
        return _silu_linear_unfused(gate_up, weight)
    return silu_gemv_bf16(gate_up, weight, dispatch_config("silu", gate_up.shape[0], weight))
