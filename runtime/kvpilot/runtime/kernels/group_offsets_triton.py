"""y += (x's sums over each group of inputs) @ offsets, in place, in one launch: the per-group offsets of a
GGUF grid kept under int4 / int8 (quant/gguf_grid.py; the reference is quant/int_weight.add_offsets, a group
sum and an addmm, which cost 6-11 µs per linear on an H100: BENCHMARKS.md, twenty-first session), after
the GEMMs that do not add them themselves (w4a16_gemm.cu does: +0.7-4 µs against +9-18 for this launch
after it, H100, twenty-second session).

Each program takes BLOCK_M tokens x BLOCK_N outputs and walks the groups GROUPS_PER_STEP at a time: it loads
x [BLOCK_M, GROUPS_PER_STEP * GROUP], sums each group in float32 (one rounding to x's dtype for the dot,
2**-9 of a 32-input sum, on a term of at most half a step per weight) and dots the sums with the offsets
[GROUPS_PER_STEP, BLOCK_N]. x is re-read by every column block: it is M x K 16-bit values, tiny beside the
weight the GEMM before it streamed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from kvpilot.runtime.kernels.int_gemv_triton import _dot
from kvpilot.runtime.kernels.triton_utils import next_power_of_2

GROUPS_PER_STEP = 16  # the smallest tl.dot inner size
BLOCK_N = 64


@triton.jit
def _add_offsets_kernel(
    y_ptr, x_ptr, o_ptr, M, N, GROUPS, stride_y, stride_x,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS_PER_STEP: tl.constexpr,
    DOT_IEEE: tl.constexpr,
):  # fmt: skip
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask, n_mask = offs_m < M, offs_n < N
    offs_g = tl.arange(0, GROUPS_PER_STEP)
    offs_k = tl.arange(0, GROUPS_PER_STEP * GROUP)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for g0 in range(0, GROUPS, GROUPS_PER_STEP):
        k = g0 * GROUP + offs_k
        x = tl.load(  # [BLOCK_M, GROUPS_PER_STEP * GROUP]
            x_ptr + offs_m[:, None] * stride_x + k[None, :],
            mask=m_mask[:, None] & (k < GROUPS * GROUP)[None, :],
            other=0.0,
        )
        sums = tl.sum(tl.reshape(x.to(tl.float32), (BLOCK_M, GROUPS_PER_STEP, GROUP)), axis=2)
        g = g0 + offs_g
        o = tl.load(  # [GROUPS_PER_STEP, BLOCK_N]
            o_ptr + g[:, None] * N + offs_n[None, :], mask=(g < GROUPS)[:, None] & n_mask[None, :], other=0.0
        )
        acc += _dot(sums.to(o.dtype), o, DOT_IEEE)  # float32 x: exact float32 dots, not tf32
    at = y_ptr + offs_m[:, None] * stride_y + offs_n[None, :]
    mask = m_mask[:, None] & n_mask[None, :]
    y = tl.load(at, mask=mask, other=0.0).to(tl.float32)
    tl.store(at, (y + acc).to(y_ptr.dtype.element_ty), mask=mask)


def add_offsets_triton(y: torch.Tensor, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """y [..., N] += (x [..., K]'s group sums) @ offsets [K/G, N], in place; returns y. G (K / the offsets'
    rows) a power of two; x, y and offsets of one 16-bit dtype."""
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    y2 = y.view(-1, y.shape[-1])
    groups, n = offsets.shape
    group = x2.shape[1] // groups
    if group * groups != x2.shape[1] or group != next_power_of_2(group) or offsets.dtype != x2.dtype:
        raise ValueError(f"offsets {tuple(offsets.shape)} {offsets.dtype} do not fit x {tuple(x2.shape)}")
    m = x2.shape[0]
    block_m = 16 if m <= 16 else 32
    grid = (triton.cdiv(n, BLOCK_N), triton.cdiv(m, block_m))
    _add_offsets_kernel[grid](
        y2, x2, offsets, m, n, groups, y2.stride(0), x2.stride(0),
        GROUP=group, BLOCK_M=block_m, BLOCK_N=BLOCK_N, GROUPS_PER_STEP=GROUPS_PER_STEP,
        DOT_IEEE=x2.dtype == torch.float32,
    )  # fmt: skip
    return y


def add_group_offsets(y: torch.Tensor, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """y + (x's group sums) @ offsets: in place by add_offsets_triton where it runs (a GPU, y contiguous,
    one dtype throughout), else by the torch reference (quant/int_weight.add_offsets)."""
    if y.is_cuda and y.is_contiguous() and offsets.dtype == x.dtype == y.dtype:
        return add_offsets_triton(y, x, offsets)
    from kvpilot.runtime.quant.int_weight import add_offsets  # the quant package imports these kernels

    return add_offsets(y, x, offsets)
