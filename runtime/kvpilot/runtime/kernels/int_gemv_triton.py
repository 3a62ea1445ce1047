"""Weight-only integer GEMMs for M below a few hundred tokens (decode, short prefills): y [M, N] =
x [M, K] @ W^T, W^T streamed once from the canonical interleaved layout (kernels/quant_reference.py) and
dequantized in registers. The torch reference is quant_reference.int_gemm_ref; w4a16_triton.int_gemm
dispatches here below DEQUANT_CUBLAS_MIN_M.

Why a new kernel: the previous one (w4a16_triton._int_gemm_kernel) makes each weight's dot operand with
two conversions (int32 -> float32 -> bf16, 16 per clock per SM on Hopper), which caps an int4 stream near
1.4 TB/s whatever the launch shape. Here no value goes through a conversion instruction:
  magic numbers  (q | 0x4300) read as bf16 is 128 + q exactly (q < 128; fp16: 0x6400, 1024 + q), and
                 (q | 0x4B000000) read as float32 is 2**23 + q: one OR and a bit cast.
  zero points    a pack tile inside one group subtracts (offset + z) from the 16-bit operand (two per
                 packed bf16x2 instruction; q - z is a small integer, exact); groups smaller than a tile
                 take z out after each dot: s (dot(x, off + q) - (off + z) sum_k x_k).
  pair_asm       int4 + bf16: inline PTX pairs two words' halves first (prmt) and shifts once per pair,
                 1.5 instructions per value instead of ~2 (GemvConfig.pair_asm; GPU only).
Two ways to multiply, chosen per launch (GemvConfig.use_dot):
  dot  x [BLOCK_M (16, 32 or 64 tokens; M padded), CHUNK] @ (q - z) [CHUNK, BLOCK_N] on the tensor cores.
  fma  M = 1: float32 multiply-adds into a [TILES, CHUNK, BLOCK_N] accumulator summed over K once at the
       end; values read in place ((word & (15 << 4j)) | 0x4B000000 = 2**23 + q 16**j, x scaled by
       16**-j), zero points out per tile with sum x. About twice the instructions per byte of `dot` on
       sm_90 (counted in the SASS): kept for the sweep.
No fused prologue: the norm or SiLU before the projection runs as its own kernel. Fused into this
GEMV they lost on the H200 (quant/fused_gemv.py has the numbers): the dot path pads one token to 16 rows, so
any work on x's tile costs 16 times the token's (removed 2026-12-01, fifth session).
Split-K (kernels/split_k_triton.py): SPLIT_K programs share each output tile; by default the last of them
sums the float32 partials in split order (one launch, deterministic).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from kvpilot.runtime.kernels.quant_reference import pack_tile
from kvpilot.runtime.kernels.split_k_triton import REDUCES, split_output, store_split
from kvpilot.runtime.kernels.triton_utils import num_sms

# The dispatch's launch shapes by bucket of M: (largest M, tokens per program, columns per program).
# A shape depends on the bucket only (never on M itself, which changes every serving step), so Triton
# compiles few variants and warm_up_m() compiles them all at load. From the H200 sweep (BENCHMARKS.md):
# 64 columns at M <= 16 (qkv 11.1 µs vs 13.2 at 128), two row blocks of 32 at M = 64.
GEMV_BUCKETS = ((16, 16, 64), (32, 32, 128), (64, 32, 128))
GEMV_MAX_M = GEMV_BUCKETS[-1][0]  # above: dequantize + cuBLAS (w4a16_triton.int_gemm)
SPLITS = (1, 2, 4, 8, 12, 16)  # the split-K counts the sweep measured
_MAGIC16 = {torch.bfloat16: (0x4300, 128.0), torch.float16: (0x6400, 1024.0)}  # (bits, value offset)
# int4 -> bf16 for two words at once (GemvConfig.pair_asm, GPU only): the low (or high) halves of both
# words side by side in one register (prmt), shifted once ($3 = 4 * value index within the half), masked
# and ORed with the magic number: two bf16 operands per three instructions, the pair already in the
# 32-bit register a tensor-core operand wants when the two words are K-neighbours (and still right,
# element for element, when they are not).
_PAIRS_LOW = tl.constexpr(
    "{ .reg .b32 t; prmt.b32 t, $1, $2, 0x5410; shr.b32 t, t, $3; "
    "lop3.b32 $0, t, 0x000F000F, 0x43004300, 0xEA; }"
)
_PAIRS_HIGH = tl.constexpr(
    "{ .reg .b32 t; prmt.b32 t, $1, $2, 0x7632; shr.b32 t, t, $3; "
    "lop3.b32 $0, t, 0x000F000F, 0x43004300, 0xEA; }"
)


@dataclass(frozen=True)
class GemvConfig:
    """One decode launch shape (benchmarks/bench_w4a16.py --sweep times the alternatives)."""

    use_dot: bool = True
    block_n: int = 64
    split_k: int = 1
    tiles: int = 1  # fma: pack tiles per K step
    reduce: str = "fixup"  # split_k_triton.REDUCES
    num_warps: int = 4
    num_stages: int = 4
    pair_asm: bool = False  # dot, int4, bf16 on a GPU: operands built by inline PTX (_PAIRS_LOW)
    block_m: int = 16  # dot: tokens per program (M padded to it; 32 or 64 for 16 < M <= 64)
    block_k: int = 128  # fp8_gemv_triton only: K per tile
    pdl: bool = False  # programmatic dependent launch (sm_90+; gemv_triton.GemvBf16Config.pdl)
    prefetch: bool = False  # fp8_gemv_triton's multiply-adds only: the next weight tile loaded early


@triton.jit(do_not_specialize=["M", "split_k"])
def _int_gemv_kernel(
    x_ptr,  # [M, K] activations, rows stride_xm apart
    qw_ptr,  # int32 [K / PER_WORD, N], interleaved per TILE rows (quant_reference.pack_rows)
    s_ptr,  # [K / GROUP, N]
    z_ptr,  # [K / GROUP, N]
    out_ptr,  # y [M, N], or the float32 buffer of atomic_f32 (split_k_triton)
    ws_ptr,  # float32 [SPLIT_K, M, N] (workspace, fixup)
    counter_ptr,  # int32 [tiles] (fixup)
    M, N, K, stride_xm, K_PER_SPLIT, split_k,
    GROUP: tl.constexpr,
    BITS: tl.constexpr,
    BLOCK_M: tl.constexpr,  # dot: 16; fma: 1 (one program row per token)
    BLOCK_N: tl.constexpr,
    TILE: tl.constexpr,  # = pack_tile(K, BITS)
    TILES: tl.constexpr,  # fma: tiles per K step
    USE_DOT: tl.constexpr,
    MAGIC16: tl.constexpr,  # dot with 16-bit x: 0x4300 (bf16) / 0x6400 (fp16), 0: float32 magic
    OFFSET: tl.constexpr,  # the value MAGIC16 adds (128 / 1024), 0.0 without it
    SPLIT_MODE: tl.constexpr,  # split_k_triton._MODES
    DOT_IEEE: tl.constexpr,  # float32 activations: exact float32 dots, not tf32
    PAIR_ASM: tl.constexpr,  # int4 + bf16 dots: operands from _PAIRS_LOW / _PAIRS_HIGH
    PDL: tl.constexpr,  # programmatic dependent launch (gemv_triton.GemvBf16Config.pdl)
):  # fmt: skip
    if PDL:  # the next kernel may launch now: its own gdc_wait orders it after this one's writes
        tl.extra.cuda.gdc_launch_dependents()
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    k_start = pid_k * K_PER_SPLIT
    if PDL:  # x and the outputs belong to the previous kernel until it has finished
        tl.extra.cuda.gdc_wait()
    if USE_DOT:
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        m_mask = offs_m < M
        acc = _dot_partial(
            x_ptr, qw_ptr, s_ptr, z_ptr, offs_m, m_mask, offs_n, n_mask, N, stride_xm, k_start,
            K_PER_SPLIT, GROUP, BITS, BLOCK_M, BLOCK_N, TILE, MAGIC16, OFFSET, DOT_IEEE, PAIR_ASM,
        )  # fmt: skip
        offs = offs_m[:, None] * N + offs_n[None, :]
        mask = m_mask[:, None] & n_mask[None, :]
    else:
        acc = _fma_partial(
            x_ptr + pid_m * stride_xm, qw_ptr, s_ptr, z_ptr, offs_n, n_mask, N, k_start, K_PER_SPLIT,
            GROUP, BITS, BLOCK_N, TILE, TILES,
        )  # fmt: skip
        offs = pid_m * N + offs_n
        mask = n_mask
    store_split(acc, out_ptr, ws_ptr, counter_ptr, offs, mask, pid_k, split_k, M * N, SPLIT_MODE)


@triton.jit
def _dot_partial(
    x_ptr, qw_ptr, s_ptr, z_ptr, offs_m, m_mask, offs_n, n_mask, N, stride_xm, k_start, K_PER_SPLIT,
    GROUP: tl.constexpr, BITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    TILE: tl.constexpr, MAGIC16: tl.constexpr, OFFSET: tl.constexpr, DOT_IEEE: tl.constexpr,
    PAIR_ASM: tl.constexpr,
):  # fmt: skip
    """[BLOCK_M, BLOCK_N] float32 sum over this split's K rows, tensor-core dots of CHUNK rows. A tile
    inside one group subtracts OFFSET + z from the 16-bit operand (packed two per instruction; q - z is a
    small integer, exact); smaller groups take z out after each dot with sum x."""
    PER_WORD: tl.constexpr = 32 // BITS
    CHUNK: tl.constexpr = TILE // PER_WORD  # word rows per tile; value j of them = rows j*CHUNK..
    ONE_GROUP: tl.constexpr = GROUP % TILE == 0
    offs_c = tl.arange(0, CHUNK)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_start + K_PER_SPLIT, TILE):
        words_at = qw_ptr + (k0 // PER_WORD + offs_c)[:, None] * N + offs_n[None, :]
        words = tl.load(words_at, mask=n_mask[None, :], other=0)  # [CHUNK, BN]
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # sum x (q - z), this tile
        if ONE_GROUP:
            g = (k0 // GROUP) * N + offs_n
            z = tl.load(z_ptr + g, mask=n_mask, other=0.0).to(tl.float32) + OFFSET
            z_x = z.to(x_ptr.dtype.element_ty)  # OFFSET + z: an integer below 2**8, exact
        for j in tl.static_range(PER_WORD):
            kj = k0 + j * CHUNK  # rows kj .. kj + CHUNK of W^T, all in group kj // GROUP
            rows, cols = offs_m[:, None], (kj + offs_c)[None, :]
            x = tl.load(x_ptr + rows * stride_xm + cols, mask=m_mask[:, None], other=0.0)
            w = _operand(words, j, BITS, CHUNK, BLOCK_N, MAGIC16, PAIR_ASM, x.dtype)  # OFFSET + q
            if ONE_GROUP:
                w = w - z_x[None, :]
            d = _dot(x, w, DOT_IEEE)
            if ONE_GROUP:
                part += d
            else:  # z out with sum x
                gj = (kj // GROUP) * N + offs_n
                sj = tl.load(s_ptr + gj, mask=n_mask, other=0.0).to(tl.float32)
                zj = tl.load(z_ptr + gj, mask=n_mask, other=0.0).to(tl.float32) + OFFSET
                d = d - tl.sum(x.to(tl.float32), axis=1)[:, None] * zj[None, :]
                acc += d * sj[None, :]
        if ONE_GROUP:
            acc += part * tl.load(s_ptr + g, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    return acc


@triton.jit
def _operand(words, J: tl.constexpr, BITS: tl.constexpr, CHUNK: tl.constexpr, BLOCK_N: tl.constexpr,
             MAGIC16: tl.constexpr, PAIR_ASM: tl.constexpr, DTYPE: tl.constexpr):  # fmt: skip
    """Value J of the words [CHUNK, BN] as OFFSET + q in x's dtype (DTYPE), in the words' layout."""
    if PAIR_ASM:  # 128 + q as bf16, built two at a time (words shifted after pairing)
        shift = tl.full((CHUNK, BLOCK_N), (J % 4) * 4, tl.int32)
        if J < 4:
            w = tl.inline_asm_elementwise(
                _PAIRS_LOW, "=r,r,r,r,r", [words, shift], dtype=tl.bfloat16, is_pure=True, pack=2
            )
        else:
            w = tl.inline_asm_elementwise(
                _PAIRS_HIGH, "=r,r,r,r,r", [words, shift], dtype=tl.bfloat16, is_pure=True, pack=2
            )
    else:
        q = (words >> (J * BITS)) & ((1 << BITS) - 1)  # [CHUNK, BN], the words' layout kept
        if MAGIC16 != 0:  # (MAGIC16 | q) as 16 bits is exactly OFFSET + q in x's dtype
            w = (q | MAGIC16).to(tl.int16).to(DTYPE, bitcast=True)
        else:  # (2**23 + q) - 2**23: exact, no int -> float conversion; x's dtype holds q exactly
            w = ((q | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0).to(DTYPE)
    return w


@triton.jit
def _dot(x, w, DOT_IEEE: tl.constexpr):
    """x [BM, C] @ w [C, BN] in float32 (exact float32 dots for float32 x, not tf32)."""
    if DOT_IEEE:
        return tl.dot(x, w, input_precision="ieee", out_dtype=tl.float32)
    return tl.dot(x, w, out_dtype=tl.float32)


@triton.jit
def _fma_partial(
    x_row, qw_ptr, s_ptr, z_ptr, offs_n, n_mask, N, k_start, K_PER_SPLIT,
    GROUP: tl.constexpr, BITS: tl.constexpr, BLOCK_N: tl.constexpr, TILE: tl.constexpr,
    TILES: tl.constexpr,
):  # fmt: skip
    """[BLOCK_N] float32 sum over this split's K rows for one token: float32 multiply-adds into a
    [TILES, CHUNK, BLOCK_N] accumulator (word rows x columns), reduced over K only at the end.

    Values are not shifted down: (word & (MASK << shift)) | 0x4B000000 read as float32 is 2**23 + q * 2**shift
    (exact while q * 2**shift < 2**23), so one AND-OR, one subtraction of 2**23 and one multiply-add by
    x * 2**-shift (scaled once per x) give x q. Values above bit 23 - BITS come from the word shifted right
    once. The zero point is taken out per tile: sum x (q - z) = sum x q - z sum x."""
    PER_WORD: tl.constexpr = 32 // BITS
    CHUNK: tl.constexpr = TILE // PER_WORD
    ONE_GROUP: tl.constexpr = GROUP % TILE == 0
    LOW: tl.constexpr = (23 - BITS) // BITS + 1  # values 0 .. LOW-1 read in place (int4: 5, int8: 2)
    MASK: tl.constexpr = (1 << BITS) - 1
    offs_t = tl.arange(0, TILES)[:, None, None]  # [TILES, 1, 1]
    offs_c = tl.arange(0, CHUNK)[None, :, None]  # [1, CHUNK, 1]
    cols = offs_n[None, None, :]  # [1, 1, BN]
    mask = n_mask[None, None, :]
    acc = tl.zeros((TILES, CHUNK, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_start, k_start + K_PER_SPLIT, TILES * TILE):
        tile_k = k0 + offs_t * TILE  # [TILES, 1, 1]: first row of each tile
        words = tl.load(qw_ptr + (tile_k // PER_WORD + offs_c) * N + cols, mask=mask, other=0)  # [T, C, BN]
        high = words >> (LOW * BITS)  # values LOW.. at the bottom (sign bits land above them, masked off)
        part = tl.zeros((TILES, CHUNK, BLOCK_N), dtype=tl.float32)  # sum x q (ONE_GROUP)
        x_sum = tl.zeros((TILES, CHUNK, 1), dtype=tl.float32)
        for j in tl.static_range(PER_WORD):
            x = tl.load(x_row + tile_k + j * CHUNK + offs_c).to(tl.float32)  # [TILES, CHUNK, 1]
            if j < LOW:
                f = ((words & (MASK << (j * BITS))) | 0x4B000000).to(tl.float32, bitcast=True)
                xq = (f - 8388608.0) * (x * (1.0 / (1 << (j * BITS))))  # x q, x scaled once at its shape
            else:
                f = ((high & (MASK << ((j - LOW) * BITS))) | 0x4B000000).to(tl.float32, bitcast=True)
                xq = (f - 8388608.0) * (x * (1.0 / (1 << ((j - LOW) * BITS))))
            if ONE_GROUP:
                part += xq
                x_sum += x
            else:
                gj = ((tile_k + j * CHUNK) // GROUP) * N + cols
                zj = tl.load(z_ptr + gj, mask=mask, other=0.0).to(tl.float32)
                sj = tl.load(s_ptr + gj, mask=mask, other=0.0).to(tl.float32)
                acc += (xq - x * zj) * sj
        if ONE_GROUP:
            g = (tile_k // GROUP) * N + cols  # [TILES, 1, BN]
            z = tl.load(z_ptr + g, mask=mask, other=0.0).to(tl.float32)
            s = tl.load(s_ptr + g, mask=mask, other=0.0).to(tl.float32)
            acc += (part - x_sum * z) * s
    return tl.sum(tl.sum(acc, axis=1), axis=0)


def gemv_bucket(m: int) -> tuple[int, int, int]:
    """(largest M, tokens per program, columns per program) of M's bucket (GEMV_BUCKETS)."""
    return next((b for b in GEMV_BUCKETS if m <= b[0]), GEMV_BUCKETS[-1])


def warm_up_m() -> tuple[int, ...]:
    """One M per launch shape the dispatch uses: running each once compiles every variant at load."""
    return (1, *(b[0] + 1 for b in GEMV_BUCKETS[:-1]))


def default_split_k(tiles: int, steps: int, sms: int) -> int:
    """Split-K for `tiles` output tiles over `steps` K blocks: the most splits (of SPLITS, dividing the
    steps) that keep the programs within 4 per SM and each program >= 4 K blocks long. On the H200 sweep
    this picked the best measured split of every Qwen3-8B layer at M = 1, 16 and 64 (qkv 4, o 4-8,
    gate_up 1, down 8)."""
    fits = [s for s in SPLITS if steps % s == 0 and tiles * s <= 4 * sms and steps // s >= 4]
    return max(fits, default=1)


def default_gemv_config(m: int, n: int, k: int, bits: int, sms: int) -> GemvConfig:
    """The launch shape of the dispatch, a function of M's bucket: tensor-core dots at every M (at M = 1
    too: the float32 multiply-add path was slower on the H200 and issues about twice the instructions per
    weight byte), int4 operands built by the paired PTX (bf16), split-K by default_split_k counting every
    row block, partials combined by the one-launch fixup."""
    top, block_m, block_n = gemv_bucket(m)
    tiles = -(-n // block_n) * -(-top // block_m)
    split = default_split_k(tiles, k // pack_tile(k, bits), sms)
    stages = 4 if block_m == 16 else 3  # as swept: 4 at M <= 16, 3 at M = 64
    return GemvConfig(True, block_n, split, num_stages=stages, pair_asm=True, block_m=block_m)


def _launch(
    x: torch.Tensor,
    w: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    bits: int,
    config: GemvConfig | None,
    counters: torch.Tensor | None,
) -> torch.Tensor:
    """The kernel on x [M, K]; w = (qweight, scales, zeros)."""
    qweight, scales, zeros = w
    m, n = x.shape[0], qweight.shape[1]
    k = qweight.shape[0] * (32 // bits)
    group = k // scales.shape[0]
    tile = pack_tile(k, bits)
    cfg = config or default_gemv_config(m, n, k, bits, num_sms(x.device))
    step = tile * (1 if cfg.use_dot else cfg.tiles)
    if k % (cfg.split_k * step) or cfg.reduce not in REDUCES:
        raise ValueError(f"gemv config {cfg} does not fit K {k} (tiles of {tile} rows)")
    magic, offset = _MAGIC16.get(x.dtype, (0, 0.0)) if bits == 4 else (0, 0.0)
    if x.dtype == torch.float16 and bits == 8:
        magic, offset = _MAGIC16[torch.float16]  # 1024 + q holds every 8-bit q
    block_m = cfg.block_m if cfg.use_dot else 1
    pair_asm = cfg.pair_asm and cfg.use_dot and bits == 4 and x.dtype == torch.bfloat16 and x.is_cuda
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, block_m), cfg.split_k)
    buf = split_output(x, m, n, cfg.split_k, cfg.reduce, counters, grid[0] * grid[1])
    _int_gemv_kernel[grid](
        x, qweight, scales, zeros, buf.target, buf.workspace, buf.counters, m, n, k, x.stride(0),
        k // cfg.split_k, cfg.split_k,
        GROUP=group, BITS=bits, BLOCK_M=block_m, BLOCK_N=cfg.block_n, TILE=tile, TILES=cfg.tiles,
        USE_DOT=cfg.use_dot, MAGIC16=magic, OFFSET=offset, SPLIT_MODE=buf.mode,
        DOT_IEEE=x.dtype == torch.float32, PAIR_ASM=pair_asm, PDL=cfg.pdl,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        **({"launch_pdl": True} if cfg.pdl else {}),
    )  # fmt: skip
    return buf.finish()


def int_gemv(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    bits: int,
    config: GemvConfig | None = None,
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] (dense rows) @ W^T -> [M, N] in x's dtype; int_gemm sends M <= GEMV_MAX_M here.
    Every K must be a whole number of pack tiles whose 32/bits dots span >= 16 rows inside one group
    (w4a16_triton.fused_supported).
    counters: this weight's persistent fixup counters (split_k_triton.split_counters)."""
    return _launch(x, (qweight, scales, zeros), bits, config, counters)
