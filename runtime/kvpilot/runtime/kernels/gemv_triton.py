"""bf16 weight-streaming GEMV for decode (M = 1..4 rows): y [M, N] = x [M, K] @ W[N, K]^T, float32 sums,
optionally with the op before it fused into the load of x (references: kernels/gemv.py; the model's
dispatch: kernels/gemv_dispatch.py).

  plain     x as given.
  norm      x = (hidden, residual): h = hidden + residual (rounded to the dtype, as rms_norm_ref adds),
            y = (rmsnorm(h) * w_norm) W^T. rms(h) is a per-row scalar, so it comes out of the sum: each
            program accumulates sum_k h_k w_norm_k W[n, k] and sum_k h_k^2 over the K it reads anyway and
            scales once at the end (no norm launch, no pre-pass); with split-K each program reads only a
            slice, so it re-reads the whole row (L2 resident, 8 KB at K = 4096) at the end. After the
            weight stream the first programs write h, one K slice each.
  silu_mul  x = [gate | up] [M, 2K]: the input is silu(gate) * up (rounded to the dtype as silu_and_mul
            rounds), computed on the K slice a program reads.
Every program re-reads x from L2 (1, 2 or 3 vectors of K): on the H200 that traffic costs about as much
as weight bytes, so the prologues favour more rows per program (default_gemv_bf16_config).
Bandwidth: each program streams BLOCK_N rows of W (contiguous along K: 16-byte vector loads) in
[BLOCK_N, BLOCK_K] tiles. Two multiply paths (GemvBf16Config.use_dot):
  fma  M <= 4: float32 multiply-adds into one [BLOCK_N, BLOCK_K] accumulator per row (rows unrolled),
       summed over K once at the end (no cross-thread reduction in the loop; x [BLOCK_K] broadcast along
       the W tile's rows, so the W tile stays in its load layout: a 3D [M, BLOCK_N, BLOCK_K] accumulator
       made Triton convert every W tile through shared memory).
  dot  x padded to 16 rows, tensor-core dots against W^T tiles (Triton pipelines their loads through
       shared memory, num_stages deep). Slower than fma and cuBLAS at M <= 4 on the H200; kept for sweeps.
Split-K (kernels/split_k_triton.py) when N / BLOCK_N programs cannot fill the SMs; partials combined by
the deterministic one-launch fixup (or the two-launch workspace sum where no counters are kept).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from kvpilot.runtime.kernels.split_k_triton import REDUCES, split_output, store_split
from kvpilot.runtime.kernels.triton_utils import next_power_of_2, num_sms

GEMV_BF16_MAX_M = 4  # rows the kernel takes (the model's dispatch, gemv_dispatch.py: GEMV_MAX_M)
_PLAIN, _NORM, _SILU = 0, 1, 2


@dataclass(frozen=True)
class GemvBf16Config:
    """One launch shape (benchmarks/bench_gemv.py sweeps them)."""

    block_n: int = 8  # W rows per program
    block_k: int = 512  # K per tile (lowered to a power of two dividing K / split_k)
    split_k: int = 1
    use_dot: bool = False
    prefetch: bool = False  # load W tile i + 1 before using tile i (registers; num_stages pipelines dots)
    num_warps: int = 4
    num_stages: int = 1
    reduce: str = "fixup"  # split_k_triton.REDUCES
    # programmatic dependent launch (sm_90+): the kernel is launched while the previous one drains and
    # waits for it (gdc_wait) before reading anything; it lets the next kernel launch likewise. On the
    # H200, 36 layers' decode GEMMs: 3.585 ms vs 3.643 without (bench_gemv_chain.py). Prefetching the
    # first W tiles into L2 before the wait was slower (3.96 ms for 4 tiles, 4.47 for 8): not kept.
    pdl: bool = False


@triton.jit
def _input_tile(
    x_ptr, r_ptr, rows, row_mask, cols, stride_xm, stride_rm, K,
    PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):  # fmt: skip
    """The GEMV input at (rows, cols) in x's dtype (before the norm's weight and 1 / rms): rows [BM, 1]
    and cols [1, BK] (dot, h writes), or one row and cols [BK] (fma)."""
    x = tl.load(x_ptr + rows * stride_xm + cols, mask=row_mask, other=0.0)
    if PROLOGUE == 2:  # x is [gate | up]: up sits K columns to the right
        up = tl.load(x_ptr + rows * stride_xm + K + cols, mask=row_mask, other=0.0).to(tl.float32)
        g = x.to(tl.float32)
        x = (g * tl.sigmoid(g) * up).to(x_ptr.dtype.element_ty)
    if PROLOGUE == 1 and HAS_RESIDUAL:
        r = tl.load(r_ptr + rows * stride_rm + cols, mask=row_mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
    return x


@triton.jit
def _fma_row(
    acc, ss, w, nw, row, x_ptr, r_ptr, cols, M, stride_xm, stride_rm, K,
    PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):  # fmt: skip
    """One token's multiply-adds: acc [BN, BK] += W tile * x[row] (x broadcast along W's rows, so the
    W tile keeps its load layout); ss [BK] += h^2 for the norm."""
    row_mask = tl.full(cols.shape, row, tl.int32) < M  # a splat: keeps the x load vectorized
    x = _input_tile(x_ptr, r_ptr, row, row_mask, cols, stride_xm, stride_rm, K, PROLOGUE, HAS_RESIDUAL)
    xf = x.to(tl.float32)
    if PROLOGUE == 1:
        ss += xf * xf
        xf = xf * nw  # h w_norm; 1 / rms applied at the end
    return acc + w * xf[None, :], ss


@triton.jit
def _pick_row(acc, ss, acc_i, ss_i, i, offs_m):
    """Row i of [BM, BN] / [BM] from one token's [BN, BK] / [BK] sums."""
    acc = tl.where(offs_m[:, None] == i, tl.sum(acc_i, axis=1)[None, :], acc)
    return acc, tl.where(offs_m == i, tl.sum(ss_i, 0), ss)


@triton.jit
def _row_sum_squares(
    x_ptr, r_ptr, offs_m, m_mask, stride_xm, stride_rm, K,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):  # fmt: skip
    """[BLOCK_M] sum over the whole row of h^2 (split-K norm: a program's own slice is not enough)."""
    cols = tl.arange(0, BLOCK_K)[None, :]
    rows, mask = offs_m[:, None], m_mask[:, None]
    ss = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        h = _input_tile(x_ptr, r_ptr, rows, mask, k0 + cols, stride_xm, stride_rm, K, 1, HAS_RESIDUAL)
        h = h.to(tl.float32)
        ss += h * h
    return tl.sum(ss, axis=1)


@triton.jit
def _write_h(
    x_ptr, r_ptr, h_ptr, offs_m, m_mask, k_start, K_PER_SPLIT, stride_xm, stride_rm, K,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    """h = hidden + residual over this split's K, one BLOCK_K slice per program of the split (after the
    weight stream: a store inside the K loop would order the next tile's loads behind it)."""
    cols = tl.arange(0, BLOCK_K)[None, :]
    rows, mask = offs_m[:, None], m_mask[:, None]
    for j in range(tl.program_id(0), K_PER_SPLIT // BLOCK_K, tl.num_programs(0)):
        ks = k_start + j * BLOCK_K + cols
        h = _input_tile(x_ptr, r_ptr, rows, mask, ks, stride_xm, stride_rm, K, 1, True)
        tl.store(h_ptr + rows * K + ks, h, mask=mask)


@triton.jit(do_not_specialize=["M", "split_k"])
def _gemv_kernel(
    x_ptr,  # [M, K] (plain, norm: hidden) or [M, 2K] (silu_mul: gate | up); rows stride_xm apart
    r_ptr,  # norm: residual [M, K] (rows stride_rm apart)
    nw_ptr,  # norm: RMSNorm weight [K]
    h_ptr,  # norm with residual: h = hidden + residual [M, K], dense (written)
    w_ptr,  # W [N, K], dense
    out_ptr,  # y [M, N], or the float32 buffer of atomic_f32 (split_k_triton)
    ws_ptr,  # float32 [SPLIT_K, M, N] (workspace, fixup)
    counter_ptr,  # int32 [tiles] (fixup)
    M, N, K, stride_xm, stride_rm, K_PER_SPLIT, split_k, eps,
    BLOCK_M: tl.constexpr,  # fma: M rounded up to a power of two (<= 4); dot: 16
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PROLOGUE: tl.constexpr,  # _PLAIN / _NORM / _SILU
    HAS_RESIDUAL: tl.constexpr,
    USE_DOT: tl.constexpr,
    PREFETCH: tl.constexpr,  # fma: register double-buffering of the W tiles
    DOT_IEEE: tl.constexpr,
    PDL: tl.constexpr,
    SPLIT_MODE: tl.constexpr,  # split_k_triton._MODES
):  # fmt: skip
    if PDL:  # the next kernel may launch now: its own gdc_wait orders it after this one's writes
        tl.extra.cuda.gdc_launch_dependents()
    pid_n, pid_k = tl.program_id(0), tl.program_id(2)
    offs_m = tl.arange(0, BLOCK_M)
    m_mask = offs_m < M
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    ss = tl.zeros((BLOCK_M, BLOCK_K), dtype=tl.float32)  # dot, norm: sum h^2 over this program's K
    # fma: one [BN, BK] accumulator per token (rows unrolled), summed over K after the loop
    acc0 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    acc1, acc2, acc3 = acc0, acc0, acc0
    ss0 = tl.zeros((BLOCK_K,), dtype=tl.float32)
    ss1, ss2, ss3 = ss0, ss0, ss0
    nw = tl.zeros((BLOCK_K,), dtype=tl.float32)
    w_at = w_ptr + offs_n[:, None] * K + offs_k[None, :]  # [BN, BK]: rows of W, K contiguous
    w_mask = n_mask[:, None]
    k_start = pid_k * K_PER_SPLIT
    k_end = k_start + K_PER_SPLIT
    if PDL:  # everything below reads x or writes: the previous kernel must have finished
        tl.extra.cuda.gdc_wait()
    if PREFETCH:
        w_next = tl.load(w_at + k_start, mask=w_mask, other=0.0, eviction_policy="evict_first")
    for k0 in range(k_start, k_end, BLOCK_K):
        if PREFETCH:  # the next tile is loaded before this one is used: two tiles in flight per program
            w = w_next
            k_next = tl.minimum(k0 + BLOCK_K, k_end - BLOCK_K)  # the last step reloads its own tile
            w_next = tl.load(w_at + k_next, mask=w_mask, other=0.0, eviction_policy="evict_first")
        else:
            w = tl.load(w_at + k0, mask=w_mask, other=0.0, eviction_policy="evict_first")
        if PROLOGUE == 1:
            nw = tl.load(nw_ptr + k0 + offs_k).to(tl.float32)
        if USE_DOT:
            rows = offs_m[:, None]
            x = _input_tile(
                x_ptr, r_ptr, rows, rows < M, k0 + offs_k[None, :], stride_xm, stride_rm, K, PROLOGUE,
                HAS_RESIDUAL,
            )  # fmt: skip
            if PROLOGUE == 1:
                xf = x.to(tl.float32)
                ss += xf * xf
                x = xf * nw[None, :]
            if DOT_IEEE:  # float32 weights: exact float32 dots, not tf32
                acc += tl.dot(x.to(w.dtype), tl.trans(w), input_precision="ieee", out_dtype=tl.float32)
            else:
                acc += tl.dot(x.to(w.dtype), tl.trans(w), out_dtype=tl.float32)
        else:
            wf, ks = w.to(tl.float32), k0 + offs_k
            acc0, ss0 = _fma_row(
                acc0, ss0, wf, nw, 0, x_ptr, r_ptr, ks, M, stride_xm, stride_rm, K, PROLOGUE, HAS_RESIDUAL
            )
            if BLOCK_M > 1:
                acc1, ss1 = _fma_row(
                    acc1, ss1, wf, nw, 1, x_ptr, r_ptr, ks, M, stride_xm, stride_rm, K, PROLOGUE, HAS_RESIDUAL
                )
            if BLOCK_M > 2:
                acc2, ss2 = _fma_row(
                    acc2, ss2, wf, nw, 2, x_ptr, r_ptr, ks, M, stride_xm, stride_rm, K, PROLOGUE, HAS_RESIDUAL
                )
                acc3, ss3 = _fma_row(
                    acc3, ss3, wf, nw, 3, x_ptr, r_ptr, ks, M, stride_xm, stride_rm, K, PROLOGUE, HAS_RESIDUAL
                )
    row_ss = tl.sum(ss, axis=1)  # [BM]
    if not USE_DOT:
        acc, row_ss = _pick_row(acc, row_ss, acc0, ss0, 0, offs_m)
        if BLOCK_M > 1:
            acc, row_ss = _pick_row(acc, row_ss, acc1, ss1, 1, offs_m)
        if BLOCK_M > 2:
            acc, row_ss = _pick_row(acc, row_ss, acc2, ss2, 2, offs_m)
            acc, row_ss = _pick_row(acc, row_ss, acc3, ss3, 3, offs_m)
    if PROLOGUE == 1:
        if K_PER_SPLIT != K:
            row_ss = _row_sum_squares(
                x_ptr, r_ptr, offs_m, m_mask, stride_xm, stride_rm, K, BLOCK_M, BLOCK_K, HAS_RESIDUAL
            )
        acc = acc * tl.rsqrt(row_ss / K + eps)[:, None]
        if HAS_RESIDUAL:
            _write_h(
                x_ptr, r_ptr, h_ptr, offs_m, m_mask, k_start, K_PER_SPLIT, stride_xm, stride_rm, K, BLOCK_K
            )
    offs = offs_m[:, None] * N + offs_n[None, :]
    mask = m_mask[:, None] & n_mask[None, :]
    store_split(acc, out_ptr, ws_ptr, counter_ptr, offs, mask, pid_k, split_k, M * N, SPLIT_MODE)


def _pow2_divisor(n: int, cap: int) -> int:
    """The largest power of two <= cap dividing n."""
    b = 1
    while b * 2 <= cap and n % (b * 2) == 0:
        b *= 2
    return b


def default_gemv_bf16_config(m: int, n: int, k: int, sms: int, prologue: str = "plain") -> GemvBf16Config:
    """The launch shape, from the H200 sweeps at Qwen3-8B's shapes, M = 1 (benchmarks/bench_gemv.py):
      > 8 waves of 16-row programs (gate_up, the LM head): 16 rows x 256 (gate_up 48.4 us plain, 49.0
             with the norm, vs cuBLAS 49.6 and 52.3 unfused)
      plain  8 rows x 512, next tile prefetched (o_proj 10.7 us vs cuBLAS 13.2)
      norm   16 rows x 512: x is rebuilt from three vectors, so fewer programs re-read it (qkv 14.9 us,
             18.1 unfused)
      silu   8 rows x 1024 (down 27.9 us, 31.8 unfused)
    then fewer rows where N / BLOCK_N programs would not give 2 per SM, then split-K. M > 1: dots (not
    dispatched: cuBLAS was as fast at M = 2 and 4)."""
    if m > 1 or -(-n // 16) > 8 * sms:  # dots; or many waves of programs
        block_n, block_k, prefetch = 16, 256, False
    else:
        first = 16 if prologue == "norm" else 8
        block_n = next((b for b in (first, 8, 4) if b <= first and -(-n // b) >= 2 * sms), 4)
        block_k, prefetch = {"plain": (512, True), "silu": (1024, False)}.get(prologue, (512, False))
    tiles = -(-n // block_n)
    split = next((s for s in (1, 2, 4, 8) if tiles * s >= 2 * sms and k % (s * 64) == 0), 1)
    return GemvBf16Config(
        block_n, block_k, split, use_dot=m > 1, prefetch=prefetch, num_stages=1 if m == 1 else 3
    )


def _launch(
    prologue: int,
    x: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    config: GemvBf16Config | None,
    counters: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    m, n, k = x.shape[0], weight.shape[0], weight.shape[1]
    if weight.stride(1) != 1 or weight.stride(0) != k or x.stride(-1) != 1:
        raise ValueError("gemv: W [N, K] must be dense and x contiguous along K")
    cfg = config or default_gemv_bf16_config(m, n, k, num_sms(x.device), ("plain", "norm", "silu")[prologue])
    if k % cfg.split_k or cfg.reduce not in REDUCES:
        raise ValueError(f"gemv config {cfg} does not fit K {k}")
    k_split = k // cfg.split_k
    block_k = _pow2_divisor(k_split, cfg.block_k)
    if m > 4 and not cfg.use_dot:
        raise ValueError(f"gemv: the multiply-add path takes at most 4 rows (M = {m}): use_dot")
    block_m = 16 if cfg.use_dot else next_power_of_2(m)
    if cfg.use_dot and (block_k < 16 or cfg.block_n < 16):
        raise ValueError(f"gemv: dots need BLOCK_K and BLOCK_N >= 16 (K {k}, {cfg})")
    h = torch.empty(m, k, device=x.device, dtype=x.dtype) if residual is not None else None
    grid = (triton.cdiv(n, cfg.block_n), 1, cfg.split_k)
    buf = split_output(x, m, n, cfg.split_k, cfg.reduce, counters, grid[0])
    r = residual if residual is not None else x
    _gemv_kernel[grid](
        x, r, norm_weight if norm_weight is not None else x, h if h is not None else x, weight,
        buf.target, buf.workspace, buf.counters, m, n, k, x.stride(0), r.stride(0), k_split, cfg.split_k, eps,
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=block_k, PROLOGUE=prologue,
        HAS_RESIDUAL=residual is not None, USE_DOT=cfg.use_dot,
        PREFETCH=cfg.prefetch and not cfg.use_dot, DOT_IEEE=weight.dtype == torch.float32,
        PDL=cfg.pdl, SPLIT_MODE=buf.mode,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **({"launch_pdl": True} if cfg.pdl else {}),
    )  # fmt: skip
    return buf.finish(), h


def gemv_bf16(
    x: torch.Tensor,
    weight: torch.Tensor,
    config: GemvBf16Config | None = None,
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T -> [M, N], M <= GEMV_BF16_MAX_M (counters: split_counters)."""
    return _launch(_PLAIN, x, None, None, weight, 0.0, config, counters)[0]


def norm_gemv_bf16(
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,
    config: GemvBf16Config | None = None,
    counters: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rmsnorm(h) W^T [M, N], h [M, K]), h = hidden + residual (hidden without one): norm_linear_ref."""
    if residual is not None and residual.shape != hidden.shape:
        raise ValueError(f"residual {tuple(residual.shape)} must match hidden {tuple(hidden.shape)}")
    y, h = _launch(_NORM, hidden, residual, norm_weight, weight, eps, config, counters)
    return y, (hidden if h is None else h)


def silu_gemv_bf16(
    gate_up: torch.Tensor,
    weight: torch.Tensor,
    config: GemvBf16Config | None = None,
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """gate_up [M, 2K] -> (silu(gate) * up) [M, K] @ weight [N, K]^T -> [M, N]: silu_linear_ref."""
    if gate_up.shape[1] != 2 * weight.shape[1]:
        raise ValueError(f"gate_up {tuple(gate_up.shape)} must be [M, 2 x {weight.shape[1]}]")
    return _launch(_SILU, gate_up, None, None, weight, 0.0, config, counters)[0]
