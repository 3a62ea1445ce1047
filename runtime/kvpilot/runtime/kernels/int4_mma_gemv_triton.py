"""int4 weight-only GEMV for 1 to 16 tokens on the tensor cores, the weight as the mma's A operand straight
from the registers it was loaded into: y [M, N] = x [M, K] @ W^T (the torch reference is
quant_reference.int_gemm_ref; w4a16_triton.int_gemm dispatches here where the H200 measured it ahead,
int4_mma_dispatched; GPU only: inline PTX).

Why: the Triton-dot GEMV (int_gemv_triton) multiplies x [16 (M padded), K] by W^T, so W is the B operand:
every dequantized bf16 value goes through shared memory into the mma layout (4 bytes of shared traffic per
int4 value). Swapped, D^T = W x^T, the weight is the A operand of mma.m16n8k16 (16 columns of W x 16 K
rows) and x the B operand (16 K rows x 8 tokens), and each lane can build its A registers from its own
words when the words sit in the lanes the way the mma wants them.

Lanes and words (one warp per program, BLOCK_N = 64 columns; the layout is Triton's default for the
[R, 128] int32 load below, checked in the compiled TTGIR by the tests):
  lane = 4 g + t (g = lane / 4: the mma row group, t = lane % 4: the K slot), and per row set rs (4 word
  rows of a 128-row pack tile) lane (g, t) holds the 16-byte vector of words at word row 4 rs + t,
  columns n0 + 4 g + c (c = 0..3, "lo") and n0 + 32 + 4 g + c ("hi").
  mma block c: A row g = column n0 + 4 g + c, A row g + 8 = column n0 + 32 + 4 g + c. Word row r holds K
  rows i * 16 + r (value i, quant_reference's interleave), so (word >> 4 i) & 0x000F000F | 0x43004300 is
  the bf16 pair (128 + q_i, 128 + q_{i+4}) of one column: the A register pair of K slots (2t, 2t+1)
  stands for K rows (i*16 + r, (i+4)*16 + r). Any pairing of K is right as long as B pairs x the same way:
  lane (g, t)'s B registers hold x[token g] at exactly those rows (loaded in the asm; tokens >= M zero;
  a second token set, tokens g + 8, for M > 8).
  Step s = 0, 1 of a word takes values (2s, 2s+4) and (2s+1, 2s+5): two mmas per word pair (lo, hi).
  Each pair: (128 + q) - (128 + z) = q - z exactly, then times s (bf16x2): the bf16 weight
  quant_reference.dequantize_int_ref makes, so the float32 sums match the reference's dequantized GEMM.
  D: lane (g, t) holds columns (n0 + 4g + c, + 32) x tokens (2t, 2t + 1), summed over the whole K range
  in the mma accumulators (no per-tile rescaling: the scale is inside the bf16 weight).
Per 8 int4 values: 3 shifts, 4 LOP3, 4 bf16x2 subtract, 4 bf16x2 multiply and one quarter of a
per-warp mma; no shared memory. Split-K fills the SMs; partials combine by split_k_triton's fixup.
Measured (H200, 2026-12-01): correct, but 1.7-2.2 TB/s at best (see MMA_DISPATCH_MAX_M): a warp spends
~2-3 µs per 4 KB step. The SASS shows why in part: ptxas places the next step's word loads after the
step's mmas (the register prefetch is mostly lost) and the deep split-K's reduce is serial. Neither
answer helped in 36 layers' GEMMs at batch 1 (benchmarks/bench_gemv_chain.py, H200, two runs): l2_ahead
1 / 2 moved int4 by -0.04 / +0.04 and +0.01 ms/token (noise), split_k_triton's fixup_wide cost +0.46.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from kvpilot.runtime.kernels.int4_mma_ptx import row_set_asm, row_set_constraints
from kvpilot.runtime.kernels.split_k_triton import REDUCES, split_output, store_split
from kvpilot.runtime.kernels.triton_utils import num_sms

MMA_MAX_M = 16
MMA_BLOCK_N = 64
MMA_TILE = 128  # K rows per pack tile (quant_reference.pack_tile of every real layer)
MMA_WARPS_PER_SM = 8  # the split-K target: one-warp programs per SM (the H200 sweep's best)
# What the dispatch sends here (benchmarks/sweep_quant_gemv.py on the H200, 2026-12-01, µs at M = 1 / 4):
# layers of >= 2 column blocks per SM without splitting, Qwen3-8B's gate_up 24.3 / 25.9 against the
# Triton-dot GEMV's 28.4 / 28.8; with fewer blocks the deep split-K's fixup (the last program of each
# tile sums its partials one split after the other) costs more than the kernel saves: qkv 12.8-19.5
# against 11.1, o 12.1-17.5 against 9.8, down 20.3 against 17.6. At 16 tokens (two mma token sets,
# 255 registers) it lost everywhere (gate_up 46.5 against 32.3).
MMA_DISPATCH_MAX_M = 8
MMA_DISPATCH_MIN_BLOCKS_PER_SM = 2
MMA_SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48)


@dataclass(frozen=True)
class MmaConfig:
    """One launch shape (benchmarks/sweep_quant_gemv.py times them)."""

    split_k: int = 1
    tiles: int = 1  # pack tiles per K step (unrolled)
    prefetch: bool = True  # the next step's words loaded before this step's mmas
    num_warps: int = 1  # the layout above is one warp's: more warps would split the row sets
    reduce: str = "fixup"
    # > 0: the words `l2_ahead` steps ahead prefetched into L2 at the top of every step (prefetch.global.L2:
    # no registers). On sm_90 ptxas sinks the register prefetch above below the step's mmas (it holds 32
    # registers), so without it a warp waits out most of a DRAM latency per step; timed: no gain (doc).
    l2_ahead: int = 0


_ASM_BF16, _ASM_FP16 = tl.constexpr(row_set_asm(False, 1)), tl.constexpr(row_set_asm(True, 1))
_ASM_BF16_2, _ASM_FP16_2 = tl.constexpr(row_set_asm(False, 2)), tl.constexpr(row_set_asm(True, 2))
_CONSTRAINTS_1, _CONSTRAINTS_2 = tl.constexpr(row_set_constraints(1)), tl.constexpr(row_set_constraints(2))


@triton.jit
def _row_set(d0, d1, d2, d3, w_lo, w_hi, z_lo, z_hi, s_lo, s_hi, x_at, valid, FP16: tl.constexpr):
    """The mmas of one row set for tokens 0..7: d0..d3 [R, 128] float32 accumulators in, updated out."""
    return tl.inline_asm_elementwise(
        _ASM_FP16 if FP16 else _ASM_BF16,
        _CONSTRAINTS_1,
        [w_lo, w_hi, z_lo, z_hi, s_lo, s_hi, x_at, valid, d0, d1, d2, d3],
        dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
        is_pure=True,
        pack=4,
    )


@triton.jit
def _row_set2(
    d0, d1, d2, d3, e0, e1, e2, e3, w_lo, w_hi, z_lo, z_hi, s_lo, s_hi, x_at, valid, x_at2, valid2,
    FP16: tl.constexpr,
):  # fmt: skip
    """As _row_set for tokens 0..15: e0..e3 accumulate tokens 8..15 (B from x_at2 / valid2)."""
    return tl.inline_asm_elementwise(
        _ASM_FP16_2 if FP16 else _ASM_BF16_2,
        _CONSTRAINTS_2,
        [w_lo, w_hi, z_lo, z_hi, s_lo, s_hi, x_at, valid, x_at2, valid2, d0, d1, d2, d3, e0, e1, e2, e3],
        dtype=(tl.float32,) * 8,
        is_pure=True,
        pack=4,
    )


@triton.jit
def _prefetch_l2(at):
    """prefetch.global.L2 of each lane's 16-byte vector of words: at [R, 32], one pointer per lane (its own
    default layout: the asm needs no particular lane order)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; mov.b32 $0, 0;", "=r,l", [at], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _pairs(v, OFFSET: tl.constexpr, DTYPE: tl.constexpr):
    """[.., 4] 16-bit values (OFFSET added) -> int32 [.., 4]: each value in both halves (a bf16x2 / f16x2
    operand of one column), made once per pack tile, not once per row set."""
    bits = (v.to(tl.float32) + OFFSET).to(DTYPE).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return bits | (bits << 16)


@triton.jit(do_not_specialize=["M", "split_k"])
def _int4_mma_kernel(
    x_ptr,  # [M, K] bf16 / fp16 activations (rows stride_xm apart)
    qw_ptr,  # int32 [K / 8, N], interleaved per 128 rows (quant_reference.pack_rows)
    s_ptr,  # [K / GROUP, N] in x's dtype
    z_ptr,  # [K / GROUP, N] in x's dtype
    out_ptr,  # y [M, N], or the float32 buffer of atomic_f32 (split_k_triton)
    ws_ptr,  # float32 [SPLIT_K, M, N] (workspace, fixup)
    counter_ptr,  # int32 [tiles] (fixup)
    M, N, stride_xm, K_PER_SPLIT, split_k,
    GROUP: tl.constexpr, TILES: tl.constexpr, PREFETCH: tl.constexpr, L2_AHEAD: tl.constexpr,
    FP16: tl.constexpr,
    SETS: tl.constexpr,  # token sets of 8: 1 (M <= 8) or 2 (M <= 16)
    SPLIT_MODE: tl.constexpr,
):  # fmt: skip
    STEP: tl.constexpr = TILES * 128
    R: tl.constexpr = 4 * TILES  # row sets (4 word rows each) per K step
    ZR: tl.constexpr = 1 if TILES == 1 else R  # rows of the zero / scale operands (broadcast if 1)
    OFFSET: tl.constexpr = 1024.0 if FP16 else 128.0  # the magic number's value (0x6400 / 0x4300)
    DTYPE: tl.constexpr = x_ptr.dtype.element_ty
    pid_n, pid_k = tl.program_id(0), tl.program_id(2)
    n0 = pid_n * 64
    # [R, 128]: row set r (word rows 4r .. 4r + 3 of the step), j = 4 L + c: lane L = 4 g + t (g: the mma
    # row group and B's token, t: the K slot and the word row within the row set) and mma block c (4
    # adjacent columns: one 16-byte vector). Two dimensions, j the contiguous one, so every Triton version
    # lays it out lane = j / 4 with c and r in registers: the mma's lane roles.
    r = tl.arange(0, R)[:, None]
    j = tl.arange(0, 128)[None, :]
    g, t, c = j // 16, (j // 4) % 4, j % 4
    cols = n0 + 4 * g + c  # [1, 128] "lo" columns; "hi" are 32 to the right
    lo_ok, hi_ok = cols < N, cols + 32 < N
    w_at = qw_ptr + (4 * r + t) * N + cols  # [R, 128]: a step starting at word row 0
    zero = r * 0 + j * 0  # [R, 128]: broadcasts the per-lane values below
    lane = tl.arange(0, 32)[None, :]  # [1, 32]: lane 4g + t's own vector, for the L2 prefetch
    l2_at = qw_ptr + (4 * r + lane % 4) * N + n0 + 4 * (lane // 4)  # [R, 32]
    valid = (g < M).to(tl.int32) + zero  # whether this lane's B token exists
    x_row = x_ptr + tl.minimum(g, M - 1) * stride_xm + 128 * (r // 4) + 4 * (r % 4) + t  # value 0's row
    valid2 = (g + 8 < M).to(tl.int32) + zero  # the second token set: tokens g + 8
    x_row2 = x_ptr + tl.minimum(g + 8, M - 1) * stride_xm + 128 * (r // 4) + 4 * (r % 4) + t
    zr = tl.arange(0, ZR)[:, None]  # the zero / scale rows: one per tile (TILES > 1) or one broadcast
    k_start = pid_k * K_PER_SPLIT
    k_end = k_start + K_PER_SPLIT
    d0 = tl.zeros((R, 128), dtype=tl.float32)  # one accumulator per row set: independent mmas
    d1, d2, d3 = d0, d0, d0
    e0, e1, e2, e3 = d0, d0, d0, d0  # tokens 8..15 (SETS = 2)
    if PREFETCH:
        rows = (k_start // 8) * N
        w_lo = tl.load(w_at + rows, mask=lo_ok, other=0, eviction_policy="evict_first")
        w_hi = tl.load(w_at + rows + 32, mask=hi_ok, other=0, eviction_policy="evict_first")
    for k0 in range(k_start, k_end, STEP):
        if L2_AHEAD > 0:  # a later step's words into L2 (clamped to this program's K range)
            ahead = (tl.minimum(k0 + L2_AHEAD * STEP, k_end - STEP) // 8) * N
            _prefetch_l2(l2_at + ahead)
            _prefetch_l2(l2_at + ahead + 32)
        if PREFETCH:  # this step's words came last step; the next step's go out now
            cur_lo, cur_hi = w_lo, w_hi
            rows = (tl.minimum(k0 + STEP, k_end - STEP) // 8) * N  # the last step reloads its own
            w_lo = tl.load(w_at + rows, mask=lo_ok, other=0, eviction_policy="evict_first")
            w_hi = tl.load(w_at + rows + 32, mask=hi_ok, other=0, eviction_policy="evict_first")
        else:
            rows = (k0 // 8) * N
            cur_lo = tl.load(w_at + rows, mask=lo_ok, other=0, eviction_policy="evict_first")
            cur_hi = tl.load(w_at + rows + 32, mask=hi_ok, other=0, eviction_policy="evict_first")
        z_lo, z_hi, s_lo, s_hi = _group_pairs(
            z_ptr, s_ptr, ((k0 + 128 * (zr // 4)) // GROUP) * N + cols, lo_ok, hi_ok, zero, OFFSET, DTYPE
        )
        if SETS == 1:
            d0, d1, d2, d3 = _row_set(
                d0, d1, d2, d3, cur_lo, cur_hi, z_lo, z_hi, s_lo, s_hi, x_row + k0, valid, FP16
            )
        else:
            d0, d1, d2, d3, e0, e1, e2, e3 = _row_set2(
                d0, d1, d2, d3, e0, e1, e2, e3, cur_lo, cur_hi, z_lo, z_hi, s_lo, s_hi, x_row + k0, valid,
                x_row2 + k0, valid2, FP16,
            )  # fmt: skip
    _store_d(
        d0, d1, d2, d3, e0, e1, e2, e3, out_ptr, ws_ptr, counter_ptr, n0, M, N, pid_k, split_k, SPLIT_MODE
    )


@triton.jit
def _group_pairs(z_ptr, s_ptr, g_at, lo_ok, hi_ok, zero, OFFSET: tl.constexpr, DTYPE: tl.constexpr):
    """(OFFSET + z) and s of each tile's group as operand pairs for the lo and hi columns: g_at [ZR, 128]
    like the words (so these loads, and with them the asm, get the words' lane layout), broadcast to
    [R, 128] by `zero`."""
    z_lo = _pairs(tl.load(z_ptr + g_at, mask=lo_ok, other=0.0), OFFSET, DTYPE) + zero
    z_hi = _pairs(tl.load(z_ptr + g_at + 32, mask=hi_ok, other=0.0), OFFSET, DTYPE) + zero
    s_lo = _pairs(tl.load(s_ptr + g_at, mask=lo_ok, other=0.0), 0.0, DTYPE) + zero
    s_hi = _pairs(tl.load(s_ptr + g_at + 32, mask=hi_ok, other=0.0), 0.0, DTYPE) + zero
    return z_lo, z_hi, s_lo, s_hi


@triton.jit
def _store_d(
    d0, d1, d2, d3, e0, e1, e2, e3, out_ptr, ws_ptr, counter_ptr, n0, M, N, pid_k, split_k,
    SPLIT_MODE: tl.constexpr,
):  # fmt: skip
    """The accumulators [R, 128] summed over row sets, stored (split_k_triton). Element j of d0 / d1 /
    d2 / d3: column n0 + 4g + c (+ 32: d2, d3), token 2t (+ 1: d1, d3); e0..e3: tokens + 8."""
    acc = tl.join(tl.join(tl.sum(d0, 0), tl.sum(d1, 0)), tl.join(tl.sum(d2, 0), tl.sum(d3, 0)))
    acc2 = tl.join(tl.join(tl.sum(e0, 0), tl.sum(e1, 0)), tl.join(tl.sum(e2, 0), tl.sum(e3, 0)))
    acc = tl.join(acc, acc2)  # [128, 2 (token parity), 2 (lo / hi), 2 (token set)]
    jj = tl.arange(0, 128)[:, None, None, None]
    parity = tl.arange(0, 2)[None, :, None, None]
    tok = 2 * ((jj // 4) % 4) + parity + 8 * tl.arange(0, 2)[None, None, None, :]
    col = n0 + 4 * (jj // 16) + jj % 4 + 32 * tl.arange(0, 2)[None, None, :, None]
    offs = tok * N + col
    mask = (tok < M) & (col < N)
    store_split(acc, out_ptr, ws_ptr, counter_ptr, offs, mask, pid_k, split_k, M * N, SPLIT_MODE)


def default_mma_config(n: int, k: int, sms: int) -> MmaConfig:
    """The dispatch's launch shape, a function of the layer's shape only (every M <= MMA_MAX_M runs the
    same two compiled variants, SETS 1 and 2): the fewest splits of K's 128-row tiles giving
    >= MMA_WARPS_PER_SM programs per SM, the next tile's words prefetched."""
    tiles, blocks = k // MMA_TILE, -(-n // MMA_BLOCK_N)
    fits = [s for s in MMA_SPLITS if tiles % s == 0]
    split = next((s for s in fits if blocks * s >= MMA_WARPS_PER_SM * sms), fits[-1])
    return MmaConfig(split_k=split)


def int4_mma_dispatched(x: torch.Tensor, n: int, group: int) -> bool:
    """Whether int_gemm sends x [M, K] @ W^T (N outputs) here: see MMA_DISPATCH_MAX_M."""
    m, k = x.shape
    if m > MMA_DISPATCH_MAX_M or not int4_mma_supported(x, k, group):
        return False
    return -(-n // MMA_BLOCK_N) >= MMA_DISPATCH_MIN_BLOCKS_PER_SM * num_sms(x.device)


def int4_mma_supported(x: torch.Tensor, k: int, group: int) -> bool:
    """bf16 / fp16 activations on a GPU, whole 128-row pack tiles, groups spanning them, M <= MMA_MAX_M."""
    return (
        x.is_cuda
        and x.dtype in (torch.bfloat16, torch.float16)
        and x.shape[0] <= MMA_MAX_M
        and k % MMA_TILE == 0
        and group % MMA_TILE == 0
    )


def int4_mma_gemv(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    config: MmaConfig | None = None,
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] (dense rows) @ W^T -> [M, N] in x's dtype; scales / zeros in x's dtype (int4_mma_supported
    holds). counters: the weight's split_k_triton.split_counters."""
    m, k = x.shape
    n = qweight.shape[1]
    cfg = config or default_mma_config(n, k, num_sms(x.device))
    if k % (cfg.split_k * cfg.tiles * MMA_TILE) or cfg.reduce not in REDUCES:
        raise ValueError(f"int4 mma gemv config {cfg} does not fit K {k}")
    grid = (triton.cdiv(n, MMA_BLOCK_N), 1, cfg.split_k)
    buf = split_output(x, m, n, cfg.split_k, cfg.reduce, counters, grid[0])
    _int4_mma_kernel[grid](
        x, qweight, scales.to(x.dtype), zeros.to(x.dtype), buf.target, buf.workspace, buf.counters,
        m, n, x.stride(0), k // cfg.split_k, cfg.split_k,
        GROUP=k // scales.shape[0], TILES=cfg.tiles, PREFETCH=cfg.prefetch, L2_AHEAD=cfg.l2_ahead,
        FP16=x.dtype == torch.float16, SETS=1 if m <= 8 else 2, SPLIT_MODE=buf.mode,
        num_warps=cfg.num_warps, num_stages=1,
    )  # fmt: skip
    return buf.finish()
