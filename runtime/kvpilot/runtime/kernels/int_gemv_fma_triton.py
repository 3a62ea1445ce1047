"""Weight-only integer GEMV for 1 to 4 tokens (decode): y [M, N] = x [M, K] @ W^T with float32
multiply-adds, no tensor cores and no shared memory. The torch reference is quant_reference.int_gemm_ref;
w4a16_triton.int_gemm dispatches here at M <= FMA_MAX_M.

Why not the tensor-core GEMV (int_gemv_triton) at M = 1: its 16-token dots pad x 16-fold and send every
dequantized bf16 value through shared memory into the mma operand layout (4 bytes of shared traffic per
int4 value, 8x the weight bytes), and its programs hold one 4 KB tile each: on the H200 it streamed at
0.9-1.9 TB/s. Here every value stays in the register it was loaded into:
  words    [TILES, CHUNK, BLOCK_N] int32 per K step (16-byte vector loads along N, the layout kept to the
           end), optionally the next step's words loaded before this one's math (PREFETCH: two steps of
           bytes in flight per program, as the bf16 GEMV's register double-buffering).
  values   (word & (15 << 4j)) | 0x4B000000 read as float32 is 2**23 + q 16**j (exact, no conversion
           instruction), minus 2**23, times x 16**-j (x scaled once per row, not per value): x q from one
           LOP3, one FADD and one FFMA per weight value; values above bit 23 - BITS from the word shifted
           once.
  zeros    a group spanning the tile: sum x (q - z) s = s (sum x q - z sum x), applied once per tile and
           column; smaller groups once per CHUNK rows.
  tokens   one accumulator per token (unrolled, <= 4): the dequantized value is shared, only the FFMA
           is per token.
Split-K (kernels/split_k_triton.py) fills the SMs when N / BLOCK_N programs cannot; the partials combine
by the one-launch deterministic fixup.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from kvpilot.runtime.kernels.quant_reference import pack_tile
from kvpilot.runtime.kernels.split_k_triton import REDUCES, split_output, store_split

FMA_MAX_M = 4


@dataclass(frozen=True)
class FmaConfig:
    """One launch shape of the multiply-add GEMV (benchmarks/sweep_quant_gemv.py times them)."""

    block_n: int = 64
    tiles: int = 1  # pack tiles (TILE rows of K each) per K step
    split_k: int = 1
    prefetch: bool = True
    num_warps: int = 4
    num_stages: int = 1
    reduce: str = "fixup"  # split_k_triton.REDUCES
    l2_ahead: int = 0  # > 0: the words that many steps ahead prefetched into L2 (untimed, not a default)


@triton.jit
def _token_fma(part, x_sum, v, x_at, J: tl.constexpr, LOW: tl.constexpr, BITS: tl.constexpr):
    """One token's multiply-adds of value slot J: part [T, C, BN] += v x [T, C, 1] 2**-SHIFT (x_at: the
    value's K rows of the token; rows past M read row M - 1, their outputs are masked at the store)."""
    SHIFT: tl.constexpr = (J if J < LOW else J - LOW) * BITS  # v = q 2**SHIFT
    x = tl.load(x_at).to(tl.float32)  # [T, C, 1]
    return part + v * (x * (1.0 / (1 << SHIFT))), x_sum + x


@triton.jit
def _prefetch_l2(at):
    """prefetch.global.L2 of every address in `at` (no registers, no result)."""
    tl.inline_asm_elementwise(
        "prefetch.global.L2 [$1]; mov.b32 $0, 0;", "=r,l", [at], dtype=tl.int32, is_pure=False, pack=1
    )


@triton.jit
def _value(words, high, J: tl.constexpr, LOW: tl.constexpr, BITS: tl.constexpr):
    """Value slot J of the words as float32 q 2**shift, exact: (word & mask) | 0x4B000000 is 2**23 + q
    2**shift as float32; slots from LOW on come from the shifted words (`high`)."""
    MASK: tl.constexpr = (1 << BITS) - 1
    if J < LOW:
        f = ((words & (MASK << (J * BITS))) | 0x4B000000).to(tl.float32, bitcast=True)
    else:
        f = ((high & (MASK << ((J - LOW) * BITS))) | 0x4B000000).to(tl.float32, bitcast=True)
    return f - 8388608.0


@triton.jit
def _slot(
    p0, p1, p2, p3, s0, s1, s2, s3, v, x_at, row1, row2, row3,
    J: tl.constexpr, LOW: tl.constexpr, BITS: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    """Every token's multiply-adds of value v (x_at: token 0's K rows of the slot; rowN: token N's
    offset): the partial sums p* [T, C, BN] and x sums s* [T, C, 1]."""
    p0, s0 = _token_fma(p0, s0, v, x_at, J, LOW, BITS)
    if BLOCK_M > 1:
        p1, s1 = _token_fma(p1, s1, v, x_at + row1, J, LOW, BITS)
    if BLOCK_M > 2:
        p2, s2 = _token_fma(p2, s2, v, x_at + row2, J, LOW, BITS)
        p3, s3 = _token_fma(p3, s3, v, x_at + row3, J, LOW, BITS)
    return p0, p1, p2, p3, s0, s1, s2, s3


@triton.jit
def _flush(a0, a1, a2, a3, p0, p1, p2, p3, s0, s1, s2, s3, z_ptr, s_ptr, g, mask, BLOCK_M: tl.constexpr):
    """acc += s (sum x q - z sum x) per token: the zero point and scale of one group (at g [T, 1, BN])."""
    z = tl.load(z_ptr + g, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(s_ptr + g, mask=mask, other=0.0).to(tl.float32)
    a0 = a0 + (p0 - s0 * z) * s
    if BLOCK_M > 1:
        a1 = a1 + (p1 - s1 * z) * s
    if BLOCK_M > 2:
        a2 = a2 + (p2 - s2 * z) * s
        a3 = a3 + (p3 - s3 * z) * s
    return a0, a1, a2, a3


@triton.jit
def _rows(a0, a1, a2, a3, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """[BLOCK_M, BLOCK_N]: each token's [T, C, BN] accumulator summed over K, one row per token."""
    offs_m = tl.arange(0, BLOCK_M)[:, None]
    out = tl.where(offs_m == 0, tl.sum(tl.sum(a0, axis=1), axis=0)[None, :], 0.0)
    if BLOCK_M > 1:
        out = tl.where(offs_m == 1, tl.sum(tl.sum(a1, axis=1), axis=0)[None, :], out)
    if BLOCK_M > 2:
        out = tl.where(offs_m == 2, tl.sum(tl.sum(a2, axis=1), axis=0)[None, :], out)
        out = tl.where(offs_m == 3, tl.sum(tl.sum(a3, axis=1), axis=0)[None, :], out)
    return out


@triton.jit(do_not_specialize=["M", "split_k"])
def _int_fma_kernel(
    x_ptr,  # [M, K] activations (rows stride_xm apart)
    qw_ptr,  # int32 [K / PER_WORD, N], interleaved per TILE rows (quant_reference.pack_rows)
    s_ptr,  # [K / GROUP, N]
    z_ptr,  # [K / GROUP, N]
    out_ptr,  # y [M, N], or the float32 buffer of atomic_f32 (split_k_triton)
    ws_ptr,  # float32 [SPLIT_K, M, N] (workspace, fixup)
    counter_ptr,  # int32 [tiles] (fixup)
    M, N, stride_xm, K_PER_SPLIT, split_k,
    GROUP: tl.constexpr, BITS: tl.constexpr,
    BLOCK_M: tl.constexpr,  # 1, 2 or 4: tokens, each its own accumulator
    BLOCK_N: tl.constexpr, TILE: tl.constexpr, TILES: tl.constexpr,
    PREFETCH: tl.constexpr, L2_AHEAD: tl.constexpr, SPLIT_MODE: tl.constexpr,
):  # fmt: skip
    PER_WORD: tl.constexpr = 32 // BITS
    CHUNK: tl.constexpr = TILE // PER_WORD  # word rows per tile; value j of them = rows j*CHUNK..
    STEP: tl.constexpr = TILES * TILE
    ONE_GROUP: tl.constexpr = GROUP % TILE == 0
    LOW: tl.constexpr = (23 - BITS) // BITS + 1  # values 0 .. LOW-1 read in place (int4: 5, int8: 2)
    pid_n, pid_k = tl.program_id(0), tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_t = tl.arange(0, TILES)[:, None, None]  # [T, 1, 1]
    offs_c = tl.arange(0, CHUNK)[None, :, None]  # [1, C, 1]
    cols = offs_n[None, None, :]  # [1, 1, BN]
    mask = n_mask[None, None, :]
    w_at = qw_ptr + (offs_t * CHUNK + offs_c) * N + cols  # [T, C, BN]: one K step's words
    k_start = pid_k * K_PER_SPLIT
    k_end = k_start + K_PER_SPLIT
    # offsets of tokens 1..3 in x; a token past M reads the last row (its output is not stored)
    row1 = tl.minimum(1, M - 1) * stride_xm
    row2, row3 = tl.minimum(2, M - 1) * stride_xm, tl.minimum(3, M - 1) * stride_xm
    a0 = tl.zeros((TILES, CHUNK, BLOCK_N), dtype=tl.float32)
    a1, a2, a3 = a0, a0, a0
    if PREFETCH:
        w_next = tl.load(w_at + (k_start // PER_WORD) * N, mask=mask, other=0, eviction_policy="evict_first")
    # one pointer per 16-byte vector of a step's words, for the L2 prefetch: [T, C, BN / 4]
    l2_at = (
        qw_ptr
        + (offs_t * CHUNK + offs_c) * N
        + (pid_n * BLOCK_N + 4 * tl.arange(0, BLOCK_N // 4))[None, None, :]
    )
    for k0 in range(k_start, k_end, STEP):
        if L2_AHEAD > 0:  # ptxas places the register prefetch below part of the math: L2 goes further
            _prefetch_l2(l2_at + (tl.minimum(k0 + L2_AHEAD * STEP, k_end - STEP) // PER_WORD) * N)
        if PREFETCH:  # this step's words were loaded last step; the next step's go out now
            words = w_next
            k_next = tl.minimum(k0 + STEP, k_end - STEP)  # the last step reloads its own words
            w_next = tl.load(
                w_at + (k_next // PER_WORD) * N, mask=mask, other=0, eviction_policy="evict_first"
            )
        else:
            words = tl.load(w_at + (k0 // PER_WORD) * N, mask=mask, other=0, eviction_policy="evict_first")
        high = words >> (LOW * BITS)  # values LOW.. at the bottom (sign bits above them, masked off)
        tile_k = k0 + offs_t * TILE  # [T, 1, 1]
        x_at = x_ptr + tile_k + offs_c  # [T, C, 1]: token 0's rows of value 0
        p0 = tl.zeros((TILES, CHUNK, BLOCK_N), dtype=tl.float32)
        p1, p2, p3 = p0, p0, p0
        s0 = tl.zeros((TILES, CHUNK, 1), dtype=tl.float32)
        s1, s2, s3 = s0, s0, s0
        for j in tl.static_range(PER_WORD):
            v = _value(words, high, j, LOW, BITS)
            p0, p1, p2, p3, s0, s1, s2, s3 = _slot(
                p0, p1, p2, p3, s0, s1, s2, s3, v, x_at + j * CHUNK, row1, row2, row3, j, LOW, BITS, BLOCK_M
            )
            if not ONE_GROUP:  # this value's CHUNK rows are one group: zero point and scale now
                g = ((tile_k + j * CHUNK) // GROUP) * N + cols  # [T, 1, BN]
                a0, a1, a2, a3 = _flush(
                    a0, a1, a2, a3, p0, p1, p2, p3, s0, s1, s2, s3, z_ptr, s_ptr, g, mask, BLOCK_M
                )
                p0, p1, p2, p3 = tl.zeros_like(p0), tl.zeros_like(p1), tl.zeros_like(p2), tl.zeros_like(p3)
                s0, s1, s2, s3 = tl.zeros_like(s0), tl.zeros_like(s1), tl.zeros_like(s2), tl.zeros_like(s3)
        if ONE_GROUP:  # the whole tile is one group
            g = (tile_k // GROUP) * N + cols  # [T, 1, BN]
            a0, a1, a2, a3 = _flush(
                a0, a1, a2, a3, p0, p1, p2, p3, s0, s1, s2, s3, z_ptr, s_ptr, g, mask, BLOCK_M
            )
    offs_m = tl.arange(0, BLOCK_M)
    offs = offs_m[:, None] * N + offs_n[None, :]
    out_mask = (offs_m < M)[:, None] & n_mask[None, :]
    out = _rows(a0, a1, a2, a3, BLOCK_M, BLOCK_N)
    store_split(out, out_ptr, ws_ptr, counter_ptr, offs, out_mask, pid_k, split_k, M * N, SPLIT_MODE)


def default_fma_split(n: int, k: int, bits: int, cfg: FmaConfig, sms: int, per_sm: int = 2) -> int:
    """The fewest splits (dividing K's steps, each program >= 2 steps) giving >= per_sm programs per SM."""
    steps = k // (pack_tile(k, bits) * cfg.tiles)
    blocks = -(-n // cfg.block_n)
    fits = [s for s in (1, 2, 3, 4, 6, 8, 12, 16) if steps % s == 0 and steps // s >= 2]
    return next((s for s in fits if blocks * s >= per_sm * sms), max(fits, default=1))


def default_fma_config(n: int, k: int, bits: int, sms: int) -> FmaConfig:
    """The dispatch's shape (int8 at M = 1): 64 columns, one pack tile per step, the next step's words
    prefetched, split-K for >= 2 programs per SM. On the H200 (benchmarks/sweep_quant_gemv.py,
    2026-12-01) Qwen3-8B int8 qkv / o / gate_up / down took 12.8 / 9.7 / 38.1 / 21.9 µs against the
    Triton-dot GEMV's 13.4 / 11.3 / 37.8 / 21.9; int4 (0.5 byte per value: 3+ instructions per value
    bind) lost on three of four layers, and 4 tokens (four FFMA chains per value) doubled the time."""
    cfg = FmaConfig(block_n=64, tiles=1, prefetch=True, num_warps=4)
    return FmaConfig(64, 1, default_fma_split(n, k, bits, cfg, sms, per_sm=2), True, 4)


def int_gemv_fma(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    bits: int,
    config: FmaConfig,
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] (dense rows, M <= FMA_MAX_M) @ W^T -> [M, N] in x's dtype (counters: split_counters)."""
    m, k = x.shape
    n = qweight.shape[1]
    tile = pack_tile(k, bits)
    cfg = config
    if m > FMA_MAX_M or k % (cfg.split_k * tile * cfg.tiles) or cfg.reduce not in REDUCES:
        raise ValueError(f"fma gemv config {cfg} does not fit M {m}, K {k} (tiles of {tile} rows)")
    grid = (triton.cdiv(n, cfg.block_n), 1, cfg.split_k)
    buf = split_output(x, m, n, cfg.split_k, cfg.reduce, counters, grid[0])
    _int_fma_kernel[grid](
        x, qweight, scales, zeros, buf.target, buf.workspace, buf.counters, m, n, x.stride(0),
        k // cfg.split_k, cfg.split_k,
        GROUP=k // scales.shape[0], BITS=bits, BLOCK_M=triton.next_power_of_2(m), BLOCK_N=cfg.block_n,
        TILE=tile, TILES=cfg.tiles, PREFETCH=cfg.prefetch, L2_AHEAD=cfg.l2_ahead, SPLIT_MODE=buf.mode,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return buf.finish()
