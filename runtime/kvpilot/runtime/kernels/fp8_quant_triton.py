"""Dynamic per-token fp8 quantization of activations (the A side of the W8A8 fp8 GEMM) in one launch:
x [M, K] -> (float8_e4m3fn [M, K], float32 scales [M, 1]), scale = absmax(row) / 448. The same row kernel
quantizes to int8 for the W8A8 int8 GEMM (kernels/int8_w8a8_triton.py: QMAX 127, ROUND).

One program per row: a first pass over the row finds its absmax, a second divides and stores. Replaces
the five elementwise torch ops of the reference (kernels/quant_reference.quantize_fp8_rows_ref), which
would add ~700 tiny kernels to a Qwen3-8B decode step.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

FP8_MAX = 448.0


@triton.jit
def quantize_rows_kernel(
    x_ptr,  # [M, K] bf16/fp16/fp32, rows stride_x apart
    out_ptr,  # [M, K] float8_e4m3fn or int8, dense
    scale_ptr,  # [M] float32
    K,
    stride_x,
    BLOCK: tl.constexpr,
    QMAX: tl.constexpr,
    ROUND: tl.constexpr = False,  # int8: round half away from zero (a float -> int cast truncates)
):
    row = tl.program_id(0)
    x_row = x_ptr + row * stride_x
    absmax = tl.zeros((BLOCK,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
        absmax = tl.maximum(absmax, tl.abs(x))
    scale = tl.maximum(tl.max(absmax, axis=0), 1e-12) / QMAX
    tl.store(scale_ptr + row, scale)
    for k0 in range(0, K, BLOCK):
        offs = k0 + tl.arange(0, BLOCK)
        x = tl.load(x_row + offs, mask=offs < K, other=0.0).to(tl.float32)
        q = tl.clamp(x / scale, -QMAX, QMAX)
        if ROUND:
            q = tl.where(q >= 0, tl.floor(q + 0.5), tl.ceil(q - 0.5))
        tl.store(out_ptr + row * K + offs, q.to(out_ptr.dtype.element_ty), mask=offs < K)


def quantize_fp8_rows_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(values [M, K] float8_e4m3fn, scales [M, 1] float32) of x [M, K] (last dim dense)."""
    m, k = x.shape
    out = torch.empty(m, k, device=x.device, dtype=torch.float8_e4m3fn)
    scales = torch.empty(m, 1, device=x.device, dtype=torch.float32)
    block = min(4096, triton.next_power_of_2(k))
    quantize_rows_kernel[(m,)](x, out, scales, k, x.stride(0), BLOCK=block, QMAX=FP8_MAX, num_warps=4)
    return out, scales


@triton.jit(do_not_specialize=["M", "ROWS"])  # one build whatever the token count
def _quantize_groups_kernel(
    x_ptr,  # [M, K] bf16/fp16/fp32, rows stride_x apart
    out_ptr,  # [ROWS, K] float8_e4m3fn, dense
    scale_ptr,  # float32 [K / GROUP, ROWS]: read as [ROWS, K / GROUP] with strides (1, ROWS)
    M,
    K,
    stride_x,
    ROWS,  # M padded (the scales' leading dimension)
    GROUP: tl.constexpr,
    QMAX: tl.constexpr,
):
    row, group = tl.program_id(0), tl.program_id(1)  # rows past M (padding) get zeros
    offs = group * GROUP + tl.arange(0, GROUP)
    real = (offs < K) & (tl.zeros_like(offs) + row < M)  # [GROUP] (a scalar mask would not broadcast)
    x = tl.load(x_ptr + row * stride_x + offs, mask=real, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12) / QMAX
    tl.store(scale_ptr + group * ROWS + row, scale)
    tl.store(out_ptr + row * K + offs, tl.clamp(x / scale, -QMAX, QMAX).to(out_ptr.dtype.element_ty))


def quantize_fp8_groups_triton(
    x: torch.Tensor, group: int = 128, rows: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(values [R, K] float8_e4m3fn, scales [R, K / group] float32 with strides (1, R)) of x [M, K], R =
    max(rows, M) (rows past M are zeros): one absmax scale per token and group of inputs (DeepSeek's
    activation blocks; the column-major scales are the layout torch._scaled_mm's 1 x 128 block scaling
    takes). K must be a multiple of group."""
    m, k = x.shape
    rows = max(rows, m)
    out = torch.empty(rows, k, device=x.device, dtype=torch.float8_e4m3fn)
    scales = torch.empty(k // group, rows, device=x.device, dtype=torch.float32)
    grid = (rows, k // group)
    _quantize_groups_kernel[grid](x, out, scales, m, k, x.stride(0), rows, GROUP=group, QMAX=FP8_MAX)
    return out, scales.t()
