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
The multiply-add path takes the op before the projection (norm_fp8_gemv, silu_fp8_gemv; dispatched by
quant/fused_gemv.py at batch 1) from gemv_triton's prologue helpers: the input vector [BLOCK_K] is made
once per step per program (each lane its own columns), then multiplies every weight row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from kvpilot.runtime.kernels.gemv_triton import (
    _NORM,
    _PLAIN,
    _SILU,
    _input_tile,
    _pow2_divisor,
    _row_sum_squares,
    _write_h,
)
from kvpilot.runtime.kernels.int_gemv_triton import GemvConfig, default_split_k, gemv_bucket
from kvpilot.runtime.kernels.quant_reference import FP8_WEIGHT_ONLY_MAX_M
from kvpilot.runtime.kernels.split_k_triton import REDUCES, split_output, store_split
from kvpilot.runtime.kernels.triton_utils import num_sms

FP8_GEMV_MAX_M = FP8_WEIGHT_ONLY_MAX_M
FP8_BLOCK_K = 128  # M > 1 (dots)
FP8_M1_BLOCK_N, FP8_M1_BLOCK_K, FP8_M1_PROGRAMS_PER_SM = 4, 512, 8  # M = 1 (one-warp multiply-adds)


@triton.jit(do_not_specialize=["M", "split_k"])
def _fp8_gemv_kernel(
    x_ptr,  # [M, K] activations (plain, norm: hidden) or [M, 2K] (silu: gate | up); rows stride_xm apart
    r_ptr,  # norm: residual [M, K] (rows stride_rm apart)
    nw_ptr,  # norm: RMSNorm weight [K]
    h_ptr,  # norm with residual: h = hidden + residual [M, K], dense (written)
    w_ptr,  # float8_e4m3fn [N, K], dense
    scale_ptr,  # float32 [N]: per output channel
    out_ptr,  # y [M, N], or the float32 buffer of atomic_f32 (split_k_triton)
    ws_ptr,  # float32 [SPLIT_K, M, N] (workspace, fixup)
    counter_ptr,  # int32 [tiles] (fixup)
    M, N, K, stride_xm, stride_rm, K_PER_SPLIT, split_k, eps,
    BLOCK_M: tl.constexpr,  # dot: 16; fma: 1 (one program row per token)
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_DOT: tl.constexpr,
    SPLIT_MODE: tl.constexpr,  # split_k_triton._MODES
    DOT_IEEE: tl.constexpr,
    PROLOGUE: tl.constexpr,  # fma only: gemv_triton's _PLAIN / _NORM / _SILU
    HAS_RESIDUAL: tl.constexpr,
    PDL: tl.constexpr,  # programmatic dependent launch (gemv_triton.GemvBf16Config.pdl)
    PREFETCH: tl.constexpr,  # fma: the next step's weight tile loaded before this step's math
):  # fmt: skip
    if PDL:  # the next kernel may launch now: its own gdc_wait orders it after this one's writes
        tl.extra.cuda.gdc_launch_dependents()
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    k_start = pid_k * K_PER_SPLIT
    scale = tl.load(scale_ptr + offs_n, mask=n_mask, other=0.0)  # a weight: read before the wait
    if PDL:  # x and the outputs belong to the previous kernel until it has finished
        tl.extra.cuda.gdc_wait()
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
        y = _fma_rows(
            x_ptr, r_ptr, nw_ptr, h_ptr, w_ptr, offs_n, n_mask, pid_m, M, K, stride_xm, stride_rm, k_start,
            K_PER_SPLIT, eps, BLOCK_N, BLOCK_K, PROLOGUE, HAS_RESIDUAL, PREFETCH,
        ) * scale  # fmt: skip
        offs = pid_m * N + offs_n
        mask = n_mask
    store_split(y, out_ptr, ws_ptr, counter_ptr, offs, mask, pid_k, split_k, M * N, SPLIT_MODE)


@triton.jit
def _fma_rows(
    x_ptr, r_ptr, nw_ptr, h_ptr, w_ptr, offs_n, n_mask, pid_m, M, K, stride_xm, stride_rm, k_start,
    K_PER_SPLIT, eps, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PROLOGUE: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, PREFETCH: tl.constexpr,
):  # fmt: skip
    """[BLOCK_N] float32 sums of token pid_m over this split's K (before the channel scale), the input
    made by gemv_triton's prologue helpers: float32 multiply-adds into a [BLOCK_N, BLOCK_K] accumulator
    reduced over K once, at the end. norm: sum h w_norm W scaled by 1 / rms(h) at the end (the whole
    row's h^2 re-read when split), h written after the weight stream.
    The weight tile is loaded before the input's loads: the prologue's arithmetic waits for them, and
    ptxas does not move a load above such a wait, so a later weight load would add an L2 round trip to
    every step (measured: the fused chain lost 0.25 ms per token). PREFETCH: the next step's tile too."""
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    ss = tl.zeros((BLOCK_K,), dtype=tl.float32)  # norm: sum h^2 over this program's K
    w_at = w_ptr + offs_n[:, None] * K + offs_k[None, :]  # [BN, BK]: rows of W, K contiguous
    k_end = k_start + K_PER_SPLIT
    if PREFETCH:
        w_next = tl.load(w_at + k_start, mask=n_mask[:, None], other=0.0, eviction_policy="evict_first")
    for k0 in range(k_start, k_end, BLOCK_K):
        ks = k0 + offs_k
        if PREFETCH:  # whole blocks (the prologues' K); the last step reloads its own tile
            w = w_next
            k_next = tl.minimum(k0 + BLOCK_K, k_end - BLOCK_K)
            w_next = tl.load(w_at + k_next, mask=n_mask[:, None], other=0.0, eviction_policy="evict_first")
        else:
            w_mask = n_mask[:, None] & (ks < K)[None, :]
            w = tl.load(w_at + k0, mask=w_mask, other=0.0, eviction_policy="evict_first")
        x = _input_tile(x_ptr, r_ptr, pid_m, ks < K, ks, stride_xm, stride_rm, K, PROLOGUE, HAS_RESIDUAL).to(
            tl.float32
        )  # [BK]
        if PROLOGUE == 1:
            ss += x * x
            x = x * tl.load(nw_ptr + ks, mask=ks < K, other=0.0).to(tl.float32)
        acc += w.to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1)
    if PROLOGUE == 1:
        offs_m = pid_m + tl.arange(0, 1)  # this token as the [1] rows the shared helpers take
        m_mask = offs_m < M
        if K_PER_SPLIT != K:
            ss_row = tl.sum(
                _row_sum_squares(
                    x_ptr, r_ptr, offs_m, m_mask, stride_xm, stride_rm, K, 1, BLOCK_K, HAS_RESIDUAL
                ),
                axis=0,
            )
        else:
            ss_row = tl.sum(ss, axis=0)
        y = y * tl.rsqrt(ss_row / K + eps)
        if HAS_RESIDUAL:
            _write_h(
                x_ptr, r_ptr, h_ptr, offs_m, m_mask, k_start, K_PER_SPLIT, stride_xm, stride_rm, K, BLOCK_K
            )
    return y


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


def _launch(
    prologue: int,
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    eps: float,
    config: GemvConfig | None,
    counters: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    m, n, k = x.shape[0], weight.shape[0], weight.shape[1]
    cfg = config or default_fp8_gemv_config(m, n, k, num_sms(x.device))
    block_k = cfg.block_k
    if prologue != _PLAIN and (cfg.use_dot or x.stride(-1) != 1):
        raise ValueError(f"fp8 gemv: a fused prologue takes the multiply-add path and dense rows ({cfg})")
    if prologue != _PLAIN or (cfg.prefetch and not cfg.use_dot):  # these walk K in whole blocks
        block_k = _pow2_divisor(k // cfg.split_k, cfg.block_k)
    steps = -(-k // block_k)
    if steps % cfg.split_k or cfg.reduce not in REDUCES:
        raise ValueError(f"fp8 gemv config {cfg} does not fit K {k} (blocks of {block_k})")
    block_m = cfg.block_m if cfg.use_dot else 1
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, block_m), cfg.split_k)
    buf = split_output(x, m, n, cfg.split_k, cfg.reduce, counters, grid[0] * grid[1])
    h = torch.empty(m, k, device=x.device, dtype=x.dtype) if residual is not None else None
    r = residual if residual is not None else x
    _fp8_gemv_kernel[grid](
        x, r, norm_weight if norm_weight is not None else x, h if h is not None else x, weight, weight_scale,
        buf.target, buf.workspace, buf.counters, m, n, k, x.stride(0), r.stride(0),
        steps // cfg.split_k * block_k, cfg.split_k, eps,
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=block_k, USE_DOT=cfg.use_dot,
        SPLIT_MODE=buf.mode, DOT_IEEE=x.dtype == torch.float32, PROLOGUE=prologue,
        HAS_RESIDUAL=residual is not None, PDL=cfg.pdl, PREFETCH=cfg.prefetch and not cfg.use_dot,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **({"launch_pdl": True} if cfg.pdl else {}),
    )  # fmt: skip
    return buf.finish(), h


def fp8_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    config: GemvConfig | None = None,
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] (dense rows, M <= FP8_GEMV_MAX_M) @ (weight [N, K] fp8 * weight_scale [N])^T -> [M, N].
    counters: this weight's persistent fixup counters (split_k_triton.split_counters)."""
    return _launch(_PLAIN, x, None, None, weight, weight_scale, 0.0, config, counters)[0]


def norm_fp8_gemv(
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    config: GemvConfig | None = None,
    counters: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(h) (W * s)^T [M, N], h [M, K]), h = hidden + residual (hidden without one): one launch of
    the multiply-add path (kernels/gemv.py composed_norm_linear with fp8_weight_only_ref is the oracle)."""
    if residual is not None and residual.shape != hidden.shape:
        raise ValueError(f"residual {tuple(residual.shape)} must match hidden {tuple(hidden.shape)}")
    y, h = _launch(_NORM, hidden, residual, norm_weight, weight, weight_scale, eps, config, counters)
    return y, (hidden if h is None else h)


def silu_fp8_gemv(
    gate_up: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    config: GemvConfig | None = None,
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """gate_up [M, 2K] -> (silu(gate) * up) [M, K] @ (W [N, K] * s)^T -> [M, N] in one launch."""
    if gate_up.shape[1] != 2 * weight.shape[1]:
        raise ValueError(f"gate_up {tuple(gate_up.shape)} must be [M, 2 x {weight.shape[1]}]")
    return _launch(_SILU, gate_up, None, None, weight, weight_scale, 0.0, config, counters)[0]
