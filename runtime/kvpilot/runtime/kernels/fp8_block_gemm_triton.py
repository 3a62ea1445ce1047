"""Block-wise fp8 weights (DeepSeek-V3 / Qwen3-FP8 checkpoints) against 16-bit activations, at every M:
y [M, N] = x [M, K] @ (w [N, K] fp8 * s)^T, with one float32 scale per block of SCALE_N rows and SCALE_K
inputs (s [ceil(N / SCALE_N), ceil(K / SCALE_K)]: the checkpoint's blocks; where fused q/k/v shards do not
each start on a block of rows, the loader repeats every block row over its rows and passes SCALE_N = 1).

Weight-only (W8A16): x stays in its dtype; each fp8 tile times its block scale (float32), rounded once to
x's dtype, is the tensor cores' operand, accumulated in float32: the numbers of dequantizing W to x's dtype,
then multiplying. BLOCK_K divides SCALE_K, so a K tile never straddles two scale blocks and the scale is
one [BLOCK_N] vector per tile.
Decode sizes (M <= 64) split K over programs until the GPU is full (split_k_triton's one-launch fixup:
the weight stream is the whole cost there); prefill sizes take wide tiles and no split.

The reference is quant_reference.fp8_block_gemm_ref (dequantize, then matmul in float32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from kvpilot.runtime.kernels.int_gemv_triton import default_split_k
from kvpilot.runtime.kernels.split_k_triton import split_output, store_split
from kvpilot.runtime.kernels.triton_utils import num_sms

SPLIT_MAX_M = 64  # up to here: split-K with the fixup reduction (split_counters' default max_m)


@triton.jit(do_not_specialize=["M"])  # one build per launch shape, whatever the batch
def _fp8_block_gemm_kernel(
    x_ptr,  # [M, K] bf16/fp16/fp32, rows stride_x apart
    w_ptr,  # float8_e4m3fn [N, K], dense
    s_ptr,  # float32 [N / SCALE_N, s_cols]: (i, j) scales rows i SCALE_N.. and inputs j SCALE_K..
    out_ptr,  # y [M, N] (split_k_triton: or its float32 buffer)
    ws_ptr,  # float32 [SPLIT_K, M, N] (fixup)
    counter_ptr,  # int32 [tiles] (fixup)
    M, N, K, stride_x, s_cols, K_PER_SPLIT, split_k,
    SCALE_N: tl.constexpr,
    SCALE_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,  # divides SCALE_K
    SPLIT_MODE: tl.constexpr,
    DOT_IEEE: tl.constexpr,  # float32 activations: exact products, not tf32
):  # fmt: skip
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask, n_mask = offs_m < M, offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * K_PER_SPLIT
    for k0 in range(k_start, k_start + K_PER_SPLIT, BLOCK_K):
        ks = k0 + offs_k
        x_mask = m_mask[:, None] & (ks < K)[None, :]
        w_mask = n_mask[:, None] & (ks < K)[None, :]
        x = tl.load(x_ptr + offs_m[:, None] * stride_x + ks[None, :], mask=x_mask, other=0.0)  # [BM, BK]
        w = tl.load(w_ptr + offs_n[:, None] * K + ks[None, :], mask=w_mask, other=0.0)  # [BN, BK] fp8
        scale_at = s_ptr + (offs_n // SCALE_N) * s_cols + k0 // SCALE_K
        scale = tl.load(scale_at, mask=n_mask, other=0.0)  # [BLOCK_N]
        # the tile dequantized in registers, rounded once to x's dtype: the dot then accumulates in place
        # (scaling its float32 result instead held a second accumulator and serialized the mmas: prefill
        # ran at a quarter of bf16 cuBLAS on the H100)
        w = (w.to(tl.float32) * scale[:, None]).to(x.dtype)  # [BN, BK]
        if DOT_IEEE:
            acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee", out_dtype=tl.float32)
        else:
            acc = tl.dot(x, tl.trans(w), acc, out_dtype=tl.float32)
    offs = offs_m[:, None] * N + offs_n[None, :]
    store_split(acc, out_ptr, ws_ptr, counter_ptr, offs, m_mask[:, None] & n_mask[None, :], pid_k, split_k,
                M * N, SPLIT_MODE)  # fmt: skip


def block_k_for(scale_k: int) -> int:
    """The K tile: the largest of 128/64/32/16 dividing the scale block's columns."""
    return next(b for b in (128, 64, 32, 16) if scale_k % b == 0)


def launch_shape(m: int, n: int, k: int, scale_k: int, sms: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, split_k, num_warps) at m tokens: 16 or 64 token rows split over K up to
    SPLIT_MAX_M (int_gemv_triton.default_split_k: <= 4 programs per SM, >= 4 K tiles each), then 64 or 128
    rows of 128 columns, whole K."""
    if m <= SPLIT_MAX_M:
        block_m, block_n = (16 if m <= 16 else 64), 64
        tiles = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
        return block_m, block_n, default_split_k(tiles, triton.cdiv(k, block_k_for(scale_k)), sms), 4
    return (64, 128, 1, 4) if m < 256 else (128, 128, 1, 8)


def fp8_block_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    block_scale: torch.Tensor,
    block: tuple[int, int],
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] (dense rows) @ (weight [N, K] fp8 * block_scale [ceil(N / bn), ceil(K / bk)])^T -> [M, N] in
    x's dtype; block = (bn, bk). counters: this weight's persistent fixup counters (split_counters)."""
    m, k = x.shape
    n = weight.shape[0]
    scale_n, scale_k = block
    block_m, block_n, split, warps = launch_shape(m, n, k, scale_k, num_sms(x.device))
    block_k = block_k_for(scale_k)
    steps = triton.cdiv(k, block_k)
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m), split)
    buf = split_output(x, m, n, split, "fixup", counters, grid[0] * grid[1])
    _fp8_block_gemm_kernel[grid](
        x, weight, block_scale, buf.target, buf.workspace, buf.counters, m, n, k, x.stride(0),
        block_scale.shape[1], steps // split * block_k, split,
        SCALE_N=scale_n, SCALE_K=scale_k, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        SPLIT_MODE=buf.mode, DOT_IEEE=x.dtype == torch.float32, num_warps=warps,
        num_stages=3 if block_m > 16 else 4,
    )  # fmt: skip
    return buf.finish()


def warm_up_ms() -> tuple[int, ...]:
    """One token count per launch shape (launch_shape's buckets): running each compiles them all."""
    return (1, 17, 65, 256)
