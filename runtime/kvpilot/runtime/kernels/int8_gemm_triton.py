"""W8A8 int8 GEMM on a plain weight: y [M, N] = (xq [M, K] int8 * sx [M]) @ (w [N, K] int8 * sw [N])^T,
summed exactly in int32 on the int8 tensor cores, scaled once in the epilogue.

Both operands are K-major (rows of x, rows of W), the one layout Hopper's int8 wgmma takes from shared
memory for both sides, so the tiles go from global memory to the tensor cores with no unpacking and no
layout conversion. Programs walk the output tiles in groups of GROUP_M row blocks, so a group's weight
columns are read from HBM once and reused from L2 by its row blocks.

Activations: quantize_int8_rows_triton, one absmax scale per token, rounded half away from zero.
int8_linear takes the launch shape by bucket of M (LAUNCHES; benchmarks/bench_int8_w8a8.py).
The reference is quant_reference.int8_gemm_ref.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from kvpilot.runtime.kernels.fp8_quant_triton import quantize_rows_kernel
from kvpilot.runtime.kernels.quant_reference import INT8_MAX


@dataclass(frozen=True)
class Int8GemmConfig:
    """One launch shape (benchmarks/bench_int8_w8a8.py times the alternatives)."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 128
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 4


# (largest M, launch shape), from the H100 run of bench_int8_w8a8.py (BENCHMARKS.md, nineteenth session):
# narrow tiles with long K steps while a few row blocks cannot fill the GPU, wide tiles for prefills.
LAUNCHES: tuple[tuple[int, Int8GemmConfig], ...] = (
    (64, Int8GemmConfig(64, 64, 256, 8, 4, 4)),
    (512, Int8GemmConfig(64, 128, 128, 8, 4, 4)),
    (1 << 62, Int8GemmConfig(128, 256, 128, 8, 8, 3)),
)


@triton.jit(do_not_specialize=["M"])
def _int8_gemm_kernel(
    xq_ptr,  # int8 [M, K], dense
    sx_ptr,  # float32 [M]
    w_ptr,  # int8 [N, K], dense
    sw_ptr,  # [N] per output channel
    out_ptr,  # [M, N]
    M, N, K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * tiles_n)
    first_m = group * GROUP_M
    rows = min(tiles_m - first_m, GROUP_M)  # the last group may hold fewer row blocks
    pid_m = first_m + (pid % (GROUP_M * tiles_n)) % rows
    pid_n = (pid % (GROUP_M * tiles_n)) // rows
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask, n_mask = offs_m < M, offs_n < N
    x_at = xq_ptr + offs_m[:, None] * K + offs_k[None, :]  # [BM, BK]
    w_at = w_ptr + offs_n[:, None] * K + offs_k[None, :]  # [BN, BK]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        k_mask = (k0 + offs_k) < K
        x = tl.load(x_at + k0, mask=m_mask[:, None] & k_mask[None, :], other=0)
        w = tl.load(w_at + k0, mask=n_mask[:, None] & k_mask[None, :], other=0)
        acc = tl.dot(x, tl.trans(w), acc, out_dtype=tl.int32)
    sx = tl.load(sx_ptr + offs_m, mask=m_mask, other=0.0)
    sw = tl.load(sw_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    y = acc.to(tl.float32) * sx[:, None] * sw[None, :]
    offs = offs_m[:, None] * N + offs_n[None, :]
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def int8_gemm(
    xq: torch.Tensor,
    sx: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    out_dtype: torch.dtype,
    config: Int8GemmConfig | None = None,
) -> torch.Tensor:
    """xq [M, K] int8 (dense rows), sx [M] float32, weight [N, K] int8 (dense), weight_scale [N] -> [M, N]."""
    m, k = xq.shape
    n = weight.shape[0]
    cfg = config or Int8GemmConfig()
    out = torch.empty(m, n, device=xq.device, dtype=out_dtype)
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n),)
    _int8_gemm_kernel[grid](
        xq, sx, weight, weight_scale, out, m, n, k,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out


def quantize_int8_rows_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(values int8 [M, K], scales float32 [M]) of x [M, K] (last dim dense): absmax / 127 per row."""
    m, k = x.shape
    out = torch.empty(m, k, device=x.device, dtype=torch.int8)
    scales = torch.empty(m, device=x.device, dtype=torch.float32)
    block = min(4096, triton.next_power_of_2(k))
    quantize_rows_kernel[(m,)](
        x, out, scales, k, x.stride(0), BLOCK=block, QMAX=INT8_MAX, ROUND=True, num_warps=4
    )
    return out, scales


def int8_linear(
    x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [..., K] @ (weight [N, K] int8 * weight_scale [N])^T (+ bias) -> [..., N] in x's dtype, W8A8:
    x quantized per token, then int8_gemm with M's launch shape."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    xq, sx = quantize_int8_rows_triton(x2 if x2.stride(-1) == 1 else x2.contiguous())
    cfg = next(c for top, c in LAUNCHES if xq.shape[0] <= top)
    y = int8_gemm(xq, sx, weight, weight_scale, x.dtype, cfg)
    y = y if bias is None else y + bias
    return y.reshape(*lead, y.shape[-1])


def warm_up_int8_linear(weight: torch.Tensor, weight_scale: torch.Tensor, dtype: torch.dtype) -> None:
    """Run each launch shape once, so Triton compiles them while the model loads."""
    tops = [top for top, _ in LAUNCHES[:-1]]
    for m in (*tops, tops[-1] + 1):
        x = torch.zeros(m, weight.shape[1], device=weight.device, dtype=dtype)
        int8_linear(x, weight, weight_scale, None)
