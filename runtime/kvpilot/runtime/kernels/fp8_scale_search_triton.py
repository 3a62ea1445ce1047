"""The squared e4m3 rounding error of every candidate scale of every weight row, in one launch: the GPU side
of quant/fp8_weight.py's search (its torch loop streams the whole matrix ~8 times per candidate: 15.6 s
for 7e9 weights on the H200 at 129 candidates).

Program (c, b) takes candidate c for rows [b BLOCK_R, (b + 1) BLOCK_R): it reads the rows in K chunks,
rounds w / s to e4m3 arithmetically (the exponent from the bits, then round-to-nearest-even of 3 mantissa
bits by the 1.5 * 2^23 trick; exact, as torch's float8_e4m3fn cast of a value already clamped to ±448),
and stores s² Σ (fp8(w / s) − w / s)². Candidates vary fastest over the grid, so a row block's 129
programs run close together and read it from L2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .quant_reference import FP8_MAX

ROUND = tl.constexpr(
    12582912.0
)  # 1.5 * 2^23: x + ROUND - ROUND rounds |x| < 2^22 to an integer, ties to even


@triton.jit
def _e4m3_round(y):
    """y (float32, |y| <= 448) rounded to the nearest e4m3 value, ties to even; exact."""
    exponent = ((y.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    exponent = tl.maximum(exponent, -6)  # below 2^-6 e4m3 is subnormal: the step stays 2^-9
    step = ((exponent - 3 + 127) << 23).to(tl.float32, bitcast=True)  # 2^(e - 3): 3 mantissa bits
    inv_step = ((127 - exponent + 3) << 23).to(tl.float32, bitcast=True)
    return ((y * inv_step + ROUND) - ROUND) * step


@triton.jit
def _candidate_error_kernel(
    w_ptr,  # [N, K] weight rows, stride_w apart (16- or 32-bit floats)
    scales_ptr,  # [C, N] float32: candidate c's scale of each row
    err_ptr,  # [C, N] float32 out
    N,
    K,
    stride_w,
    BLOCK_R: tl.constexpr,
    BLOCK_K: tl.constexpr,
    QMAX: tl.constexpr,
):
    c = tl.program_id(0)
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < N
    scale = tl.load(scales_ptr + c * N + rows, mask=row_ok, other=1.0)  # [BLOCK_R]
    acc = tl.zeros((BLOCK_R,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        mask = row_ok[:, None] & (cols < K)[None, :]
        w = tl.load(w_ptr + rows[:, None] * stride_w + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        y = tl.math.div_rn(w, scale[:, None])  # [BLOCK_R, BLOCK_K], as torch's w / s
        d = _e4m3_round(tl.clamp(y, -QMAX, QMAX)) - y
        acc += tl.sum(d * d, axis=1)
    tl.store(err_ptr + c * N + rows, acc * scale * scale, mask=row_ok)


def candidate_errors_triton(w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """w [N, K] (last dim dense), scales [C, N] float32 -> float32 [C, N]: Σ_k (fp8(w / s) s − w)² of
    candidate c's scale s for row n."""
    n, k = w.shape
    c = scales.shape[0]
    err = torch.empty(c, n, device=w.device, dtype=torch.float32)
    block_r = max(4, triton.next_power_of_2(triton.cdiv(n, 65535)))  # grid axis 1 holds at most 65535
    block_k = min(1024, triton.next_power_of_2(k))
    grid = (c, triton.cdiv(n, block_r))
    _candidate_error_kernel[grid](
        w, scales, err, n, k, w.stride(0), BLOCK_R=block_r, BLOCK_K=block_k, QMAX=FP8_MAX, num_warps=4
    )
    return err
