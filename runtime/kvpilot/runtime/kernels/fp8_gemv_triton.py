"""Decode-size (M <= FP8_GEMV_MAX_M) weight-only fp8 GEMM: y [M, N] = x [M, K] @ (W * s)^T with W
float8_e4m3fn [N, K] and one float32 scale per output channel s [N]; the activations stay in their
dtype (no per-token quantization: at decode the GEMM is a weight stream, and quantizing x costs a launch
and a rounding). The torch reference is quant_reference.fp8_weight_only_ref. Large M keeps W8A8 through
torch._scaled_mm (quant/fp8_gemm.py), where the fp8 tensor cores win.

Each program streams BLOCK_N weight rows (contiguous along K) over K / SPLIT_K, converting fp8 to x's
dtype in registers; the per-channel scale multiplies the float32 sum once at the end. The same two
multiply paths and split-K reductions as kernels/int_gemv_triton.py (GemvConfig): tensor-core dots of
x [16 (M padded), BLOCK_K] against W^T [BLOCK_K, BLOCK_N] for M > 1, float32 multiply-adds into a
[BLOCK_N, BLOCK_K] accumulator for M = 1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from kvpilot.runtime.kernels.int_gemv_triton import GemvConfig, default_split_k, gemv_bucket
from kvpilot.runtime.kernels.quant_reference import FP8_WEIGHT_ONLY_MAX_M
from kvpilot.runtime.kernels.split_k_triton import REDUCES, split_output, store_split
from kvpilot.runtime.kernels.triton_utils import num_sms

FP8_GEMV_MAX_M = FP8_WEIGHT_ONLY_MAX_M
FP8_BLOCK_K = 128  # M > 1 (dots)
FP8_M1_BLOCK_N, FP8_M1_BLOCK_K, FP8_M1_PROGRAMS_PER_SM = 4, 512, 8  # M = 1 (one-warp multiply-adds)


@triton.jit(do_not_specialize=["M", "split_k"])
def _fp8_gemv_kernel(
    x_ptr,  # [M, K] activations (rows stride_xm apart)
    w_ptr,  # float8_e4m3fn [N, K], dense
    scale_ptr,  # float32 [N]: per output channel
    out_ptr,  # y [M, N], or the float32 buffer of atomic_f32 (split_k_triton)
    ws_ptr,  # float32 [SPLIT_K, M, N] (workspace, fixup)
    counter_ptr,  # int32 [tiles] (fixup)
    M,
    N,
    K,
    stride_xm,
    K_PER_SPLIT,
    split_k,
    BLOCK_M: tl.constexpr,  # dot: 16; fma: 1 (one program row per token)
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    SPLIT_MODE: tl.constexpr,  # split_k_triton._MODES
    DOT_IEEE: tl.constexpr,
):
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    k_start = pid_k * K_PER_SPLIT
    scale = tl.load(scale_ptr + offs_n, mask=n_mask, other=0.0)
    if USE_DOT:
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        m_mask = offs_m < M
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(k_start, k_start + K_PER_SPLIT, BLOCK_K):
            ks = k0 + offs_k
            x_at = x_ptr + offs_m[:, None] * stride_xm + ks[None, :]
            x = tl.load(x_at, mask=m_mask[:, None] & (ks < K)[None, :], other=0.0)
            w_at = w_ptr + offs_n[:, None] * K + ks[None, :]  # [BN, BK]: rows of W, K contiguous
            w = tl.load(w_at, mask=n_mask[:, None] & (ks < K)[None, :], other=0.0).to(x.dtype)
            if DOT_IEEE:
                acc += tl.dot(x, tl.trans(w), input_precision="ieee", out_dtype=tl.float32)
            else:
                acc += tl.dot(x, tl.trans(w), out_dtype=tl.float32)
        y = acc * scale[None, :]
        offs = offs_m[:, None] * N + offs_n[None, :]
        mask = m_mask[:, None] & n_mask[None, :]
    else:
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)  # reduced over K once, at the end
        for k0 in range(k_start, k_start + K_PER_SPLIT, BLOCK_K):
            ks = k0 + offs_k
            x = tl.load(x_ptr + pid_m * stride_xm + ks, mask=ks < K, other=0.0).to(tl.float32)  # [BK]
            w_at = w_ptr + offs_n[:, None] * K + ks[None, :]
            w_mask = n_mask[:, None] & (ks < K)[None, :]
            w = tl.load(w_at, mask=w_mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
            acc2 += w * x[None, :]
        y = tl.sum(acc2, axis=1) * scale
        offs = pid_m * N + offs_n
        mask = n_mask
    store_split(y, out_ptr, ws_ptr, counter_ptr, offs, mask, pid_k, split_k, M * N, SPLIT_MODE)


def default_fp8_gemv_config(m: int, n: int, k: int, sms: int) -> GemvConfig:
    """A function of M's bucket (int_gemv_triton.gemv_bucket). M = 1: float32 multiply-adds, one warp
    per program streaming 4 weight rows in K tiles of 512 (16-byte loads; one warp converts x's layout by
    shuffles, not through shared memory behind a barrier), split-K until >= 8 programs per SM: on the
    H200 (benchmarks/sweep_quant_gemv.py, 2026-12-01) Qwen3-8B qkv / o / gate_up / down took 9.8 / 8.0 /
    28.1 / 16.6 µs against 12.8 / 9.0 / 37.1 / 19.3 with 64 rows x 128 and 4 warps. M > 1: dots of x
    padded to 16 tokens against 64 columns, split-K by int_gemv_triton.default_split_k."""
    if m == 1:
        steps, blocks = -(-k // FP8_M1_BLOCK_K), -(-n // FP8_M1_BLOCK_N)
        fits = [s for s in (1, 2, 4, 8) if steps % s == 0]
        split = next((s for s in fits if blocks * s >= FP8_M1_PROGRAMS_PER_SM * sms), 1)
        return GemvConfig(
            use_dot=False, block_n=FP8_M1_BLOCK_N, split_k=split, num_warps=1, num_stages=1, block_m=1,
            block_k=FP8_M1_BLOCK_K,
        )  # fmt: skip
    top, block_m, _ = gemv_bucket(m)
    tiles = -(-n // 64) * -(-top // block_m)
    split = default_split_k(tiles, -(-k // FP8_BLOCK_K), sms)
    return GemvConfig(use_dot=True, block_n=64, split_k=split, num_stages=4, block_m=block_m)


def fp8_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    config: GemvConfig | None = None,
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] (dense rows, M <= FP8_GEMV_MAX_M) @ (weight [N, K] fp8 * weight_scale [N])^T -> [M, N].
    counters: this weight's persistent fixup counters (split_k_triton.split_counters)."""
    m, k = x.shape
    n = weight.shape[0]
    cfg = config or default_fp8_gemv_config(m, n, k, num_sms(x.device))
    steps = -(-k // cfg.block_k)
    if steps % cfg.split_k or cfg.reduce not in REDUCES:
        raise ValueError(f"fp8 gemv config {cfg} does not fit K {k} (blocks of {cfg.block_k})")
    block_m = cfg.block_m if cfg.use_dot else 1
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, block_m), cfg.split_k)
    buf = split_output(x, m, n, cfg.split_k, cfg.reduce, counters, grid[0] * grid[1])
    _fp8_gemv_kernel[grid](
        x, weight, weight_scale, buf.target, buf.workspace, buf.counters, m, n, k, x.stride(0),
        steps // cfg.split_k * cfg.block_k, cfg.split_k,
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, USE_DOT=cfg.use_dot,
        SPLIT_MODE=buf.mode, DOT_IEEE=x.dtype == torch.float32, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )  # fmt: skip
    return buf.finish()
