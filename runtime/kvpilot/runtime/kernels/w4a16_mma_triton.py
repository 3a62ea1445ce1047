"""Weight-only integer GEMM for 16 < M <= a few hundred tokens (short prefills, big decode batches):
y [M, N] = x [M, K] @ W^T, each weight tile dequantized in registers ONCE for all BLOCK_M rows (up to
128) and fed to the tensor cores. The torch reference is quant_reference.int_gemm_ref.

Why beside the GEMV (int_gemv_triton): the GEMV pads M to 16 and, above 32 tokens, runs two row blocks
that each unpack the same weight tile; and it keeps two float32 accumulators (the tile's partial sum and
the scaled total). Here the scale is put on the dequantized operand: w = ((OFFSET + q) - (OFFSET + z)) * s
in x's dtype, exactly the reference's bf16((q - z) * s) (q - z is a small integer, the product of two
bf16 values rounds once), so one accumulator takes acc = dot(x, w, acc) for any group that holds whole
dots (per-tile partial sums scaled afterwards were slower on the H200 at every M).
Layout: the canonical interleaved one (quant_reference.pack_rows), unchanged: a K step is one pack tile of
TILE rows whose [CHUNK, BLOCK_N] words give, in value j, W^T rows j*CHUNK .. (j+1)*CHUNK: PER_WORD dots
of CHUNK rows (16 for int4, 32 for int8) against the matching x columns. (One dot of all TILE rows, the
values stacked and merged with the word rows by a reshape, compiled to a layout conversion per tile and
ran 2-4x slower on the H200 with Triton 3.6: removed.)
SWAP: the dot taken transposed (acc [BLOCK_N, BLOCK_M] = W x^T): the dequantized weight is the left
operand, which Hopper's wgmma reads from registers (the other way round it is stored to shared memory
first, one round trip per dot), and the tokens are the MMA's narrow side.
Split-K (kernels/split_k_triton.py) when the output tiles alone do not fill the SMs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from kvpilot.runtime.kernels.group_offsets_triton import add_group_offsets
from kvpilot.runtime.kernels.int_gemv_triton import _MAGIC16, _PAIRS_HIGH, _PAIRS_LOW
from kvpilot.runtime.kernels.quant_reference import pack_tile
from kvpilot.runtime.kernels.split_k_triton import REDUCES, split_output, store_split
from kvpilot.runtime.kernels.triton_utils import num_sms
from kvpilot.runtime.kernels.w4a16_gemm_cuda import gemm_if_taken


@dataclass(frozen=True)
class MmaGemmConfig:
    """One launch shape (benchmarks/sweep_w4_mma.py times the alternatives)."""

    block_m: int = 64
    block_n: int = 128
    split_k: int = 0  # 0: auto_split_k with per_sm programs per SM
    per_sm: int = 2
    min_steps: int = 4  # auto_split_k: pack tiles per split at least
    num_warps: int = 4
    num_stages: int = 3
    swap: bool = False  # acc [BLOCK_N, BLOCK_M]: the weight as the dot's left operand
    pair_asm: bool = True  # int4 + bf16 on a GPU: operands by the GEMV's inline PTX pairs
    reduce: str = "fixup"


@triton.jit
def _operand(words, j: tl.constexpr, BITS: tl.constexpr, MAGIC16: tl.constexpr, PAIR_ASM: tl.constexpr,
             dtype: tl.constexpr):  # fmt: skip
    """Value j of each word as OFFSET + q in `dtype` (the words' shape and layout kept)."""
    if PAIR_ASM:  # int4 + bf16: 128 + q built two at a time (int_gemv_triton._PAIRS_LOW)
        shift = tl.full(words.shape, (j % 4) * 4, tl.int32)
        if j < 4:
            w = tl.inline_asm_elementwise(
                _PAIRS_LOW, "=r,r,r,r,r", [words, shift], dtype=tl.bfloat16, is_pure=True, pack=2
            )
        else:
            w = tl.inline_asm_elementwise(
                _PAIRS_HIGH, "=r,r,r,r,r", [words, shift], dtype=tl.bfloat16, is_pure=True, pack=2
            )
    elif MAGIC16 != 0:  # (MAGIC16 | q) as 16 bits is OFFSET + q
        w = (((words >> (j * BITS)) & ((1 << BITS) - 1)) | MAGIC16).to(tl.int16).to(dtype, bitcast=True)
    else:  # (2**23 + q) - 2**23 in float32, exact; OFFSET is 0
        q = (words >> (j * BITS)) & ((1 << BITS) - 1)
        w = ((q | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0).to(dtype)
    return w


@triton.jit
def _by_values(acc, words, x_at, x_mask, s_ptr, z_ptr, offs_n, n_mask, N, k0, GROUP: tl.constexpr,
               BITS: tl.constexpr, TILE: tl.constexpr, MAGIC16: tl.constexpr, OFFSET: tl.constexpr,
               SWAP: tl.constexpr, PAIR_ASM: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """acc + one pack tile as PER_WORD dots of CHUNK rows, value j of the words against x's columns
    k0 + j*CHUNK .. (each dot inside one group). SWAP: acc, words and x (x_at) transposed."""
    PER_WORD: tl.constexpr = 32 // BITS
    CHUNK: tl.constexpr = TILE // PER_WORD
    ONE_GROUP: tl.constexpr = GROUP % TILE == 0  # one scale row per tile: loaded (and laid out) once
    dtype = x_at.dtype.element_ty
    g = (k0 // GROUP) * N + offs_n
    z = (tl.load(z_ptr + g, mask=n_mask, other=0.0).to(tl.float32) + OFFSET).to(dtype)
    s = tl.load(s_ptr + g, mask=n_mask, other=0.0).to(dtype)
    for j in tl.static_range(PER_WORD):
        kj = k0 + j * CHUNK  # rows kj .. kj + CHUNK of W^T, all in group kj // GROUP
        x = tl.load(x_at + kj, mask=x_mask, other=0.0)
        w = _operand(words, j, BITS, MAGIC16, PAIR_ASM, dtype)
        if not ONE_GROUP:
            gj = (kj // GROUP) * N + offs_n
            z = (tl.load(z_ptr + gj, mask=n_mask, other=0.0).to(tl.float32) + OFFSET).to(dtype)
            s = tl.load(s_ptr + gj, mask=n_mask, other=0.0).to(dtype)
        if SWAP:
            acc = tl.dot((w - z[:, None]) * s[:, None], x, acc, input_precision=PREC)
        else:
            acc = tl.dot(x, (w - z[None, :]) * s[None, :], acc, input_precision=PREC)
    return acc


@triton.jit(do_not_specialize=["M", "split_k"])
def _w4_mma_kernel(
    x_ptr,  # [M, K] activations (rows stride_xm apart)
    qw_ptr,  # int32 [K / PER_WORD, N], interleaved per TILE rows (quant_reference.pack_rows)
    s_ptr,  # [K / GROUP, N]
    z_ptr,  # [K / GROUP, N]
    out_ptr,  # y [M, N] (or the float32 buffer of atomic_f32)
    ws_ptr,  # float32 [SPLIT_K, M, N] (workspace, fixup)
    counter_ptr,  # int32 [tiles] (fixup)
    M,
    N,
    stride_xm,
    K_PER_SPLIT,
    split_k,
    GROUP: tl.constexpr,
    BITS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TILE: tl.constexpr,  # = pack_tile(K, BITS)
    MAGIC16: tl.constexpr,  # 0x4300 (bf16) / 0x6400 (fp16) when OFFSET + q fits x's dtype, else 0
    OFFSET: tl.constexpr,  # the value MAGIC16 adds (128 / 1024), 0.0 without it
    SWAP: tl.constexpr,
    PAIR_ASM: tl.constexpr,
    SPLIT_MODE: tl.constexpr,  # split_k_triton._MODES
    PREC: tl.constexpr,  # "ieee" for float32 activations (exact float32 dots, not tf32), else None
):
    PER_WORD: tl.constexpr = 32 // BITS
    CHUNK: tl.constexpr = TILE // PER_WORD  # word rows per tile; value j of them = rows j*CHUNK..
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, CHUNK)
    m_mask, n_mask = offs_m < M, offs_n < N
    if SWAP:  # [BLOCK_N, BLOCK_M]: acc^T, words^T, x^T
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        w_at = qw_ptr + offs_c[None, :] * N + offs_n[:, None]  # [BN, CHUNK]
        x_at = x_ptr + offs_m[None, :] * stride_xm + offs_c[:, None]  # [CHUNK, BM]
        w_mask, x_mask = n_mask[:, None], m_mask[None, :]
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        w_at = qw_ptr + offs_c[:, None] * N + offs_n[None, :]  # [CHUNK, BN]
        x_at = x_ptr + offs_m[:, None] * stride_xm + offs_c[None, :]  # [BM, CHUNK]
        w_mask, x_mask = n_mask[None, :], m_mask[:, None]
    k_start = pid_k * K_PER_SPLIT
    for k0 in range(k_start, k_start + K_PER_SPLIT, TILE):
        words = tl.load(w_at + (k0 // PER_WORD) * N, mask=w_mask, other=0)
        acc = _by_values(
            acc, words, x_at, x_mask, s_ptr, z_ptr, offs_n, n_mask, N, k0, GROUP, BITS, TILE, MAGIC16, OFFSET,
            SWAP, PAIR_ASM, PREC,
        )  # fmt: skip
    if SWAP:
        offs = offs_m[None, :] * N + offs_n[:, None]
        mask = m_mask[None, :] & n_mask[:, None]
    else:
        offs = offs_m[:, None] * N + offs_n[None, :]
        mask = m_mask[:, None] & n_mask[None, :]
    store_split(acc, out_ptr, ws_ptr, counter_ptr, offs, mask, pid_k, split_k, M * N, SPLIT_MODE)


def auto_split_k(tiles: int, steps: int, sms: int, per_sm: int, min_steps: int = 4) -> int:
    """The fewest K splits (dividing the `steps` pack tiles, each split >= min_steps of them) giving
    >= per_sm programs per SM; the most allowed when none does. (Each split adds a float32 [M, N]
    partial to write and sum: at M = 64, 8 splits move as many bytes as the int4 weight of K = 4096.)"""
    fits = [s for s in (1, 2, 3, 4, 6, 8, 12, 16) if steps % s == 0 and steps // s >= min_steps]
    return next((s for s in fits if tiles * s >= per_sm * sms), fits[-1] if fits else 1)


def mma_supported(k: int, group: int, bits: int) -> bool:
    """Every dot of CHUNK rows lies inside one group and is >= 16 rows (the smallest tl.dot)."""
    chunk = pack_tile(k, bits) // (32 // bits)
    return chunk >= 16 and group % chunk == 0


def w4a16_mma(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    bits: int,
    config: MmaGemmConfig | None = None,
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] (dense rows) @ W^T -> [M, N] in x's dtype. counters: the weight's persistent split-K
    counters (split_k_triton.split_counters; made per call when too few)."""
    m, k = x.shape
    n = qweight.shape[1]
    group = k // scales.shape[0]
    cfg = config or MmaGemmConfig()
    tile = pack_tile(k, bits)
    if not mma_supported(k, group, bits) or cfg.reduce not in REDUCES:
        raise ValueError(f"w4a16_mma cannot take K {k}, {bits}-bit groups of {group}, config {cfg}")
    grid_nm = triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m)
    split = cfg.split_k or auto_split_k(
        grid_nm[0] * grid_nm[1], k // tile, num_sms(x.device), cfg.per_sm, cfg.min_steps
    )
    if (k // tile) % split:
        raise ValueError(f"split_k {split} must divide the {k // tile} pack tiles of K {k}")
    magic, offset = _MAGIC16.get(x.dtype, (0, 0.0)) if bits == 4 else (0, 0.0)
    if x.dtype == torch.float16 and bits == 8:
        magic, offset = _MAGIC16[torch.float16]  # 1024 + q holds every 8-bit q
    pair_asm = cfg.pair_asm and bits == 4 and x.dtype == torch.bfloat16 and x.is_cuda
    buf = split_output(x, m, n, split, cfg.reduce, counters, grid_nm[0] * grid_nm[1])
    _w4_mma_kernel[(*grid_nm, split)](
        x, qweight, scales, zeros, buf.target, buf.workspace, buf.counters, m, n, x.stride(0),
        k // split, split,
        GROUP=group, BITS=bits, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, TILE=tile, MAGIC16=magic,
        OFFSET=offset, SWAP=cfg.swap, PAIR_ASM=pair_asm,
        SPLIT_MODE=buf.mode, PREC="ieee" if x.dtype == torch.float32 else None, num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )  # fmt: skip
    return buf.finish()


# The dispatch's launch shape by bits and bucket of M: (largest M, config; None: not dispatched here,
# w4a16_triton.int_gemm runs it). A shape depends on the bucket only (split-K counted at the bucket's
# largest M), so warm_up_mma compiles every variant at load. From the H200 sweep (benchmarks/
# sweep_w4_mma.py, commit 8094540), sums of Qwen3-8B's four layer GEMMs, µs (bf16 cuBLAS / before / here):
#   int4  M=32 110.3 / 94.4 (GEMV) / 89.8    M=64 111.7 / 140.1 (GEMV) / 129.3
#         M=128 119.2 / 263.3 (dequantize + cuBLAS) / 196.3    M=256 155.6 / 293.0 / 340.0 (not taken)
#   int8  M=32 110.3 / 117.6 / 102.4        M=64 111.7 / 180.8 / 120.5    M=128 119.2 / 280.9 / 201.9
#         M=256 155.6 / 312.2 / 331.3 (not taken)
_SWAP_32, _SWAP_64 = MmaGemmConfig(32, 64, swap=True), MmaGemmConfig(64, 64, swap=True)
_SWAP_64_W8 = MmaGemmConfig(64, 128, swap=True, num_warps=8)
MMA_BUCKETS: dict[int, tuple[tuple[int, MmaGemmConfig | None], ...]] = {
    4: ((32, _SWAP_32), (64, _SWAP_64_W8), (128, _SWAP_64_W8), (256, None)),
    8: ((32, _SWAP_32), (64, _SWAP_64), (128, _SWAP_64), (256, None)),
}
MMA_MIN_M = 17  # M <= 16: the decode GEMVs (w4a16_triton.int_gemm), never here


def _bucket(m: int, bits: int) -> MmaGemmConfig | None:
    if m < MMA_MIN_M:
        return None
    return next((cfg for top, cfg in MMA_BUCKETS.get(bits, ()) if m <= top), None)


def mma_dispatched(m: int, k: int, group: int, bits: int) -> bool:
    """Whether the dispatch (quant/methods.IntWeightMethod) sends M tokens here: a bucket of M > 16 with a
    config, and a layout whose dots fit (else w4a16_triton.int_gemm: the GEMV or dequantize + cuBLAS)."""
    return _bucket(m, bits) is not None and mma_supported(k, group, bits)


def bucket_config(m: int, n: int, k: int, bits: int, sms: int) -> MmaGemmConfig:
    """M's bucket's config, its split-K fixed for the bucket's largest M."""
    top, cfg = next(b for b in MMA_BUCKETS[bits] if m <= b[0])
    if cfg is None:
        raise ValueError(f"M = {m} is not dispatched to w4a16_mma ({bits}-bit)")
    tiles = triton.cdiv(n, cfg.block_n) * triton.cdiv(top, cfg.block_m)
    split = cfg.split_k or auto_split_k(tiles, k // pack_tile(k, bits), sms, cfg.per_sm, cfg.min_steps)
    return MmaGemmConfig(**{**cfg.__dict__, "split_k": split})


def int_gemm_mma(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    bits: int,
    perm: torch.Tensor | None = None,
    counters: torch.Tensor | None = None,
    cuda_kernel: bool = True,
    offsets: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [..., K] @ W^T -> [..., N] with the bucket's launch shape (mma_dispatched M only); int4 / int8 with
    bf16 goes to w4a16_gemm.cu where that is expected to be faster (cuda_kernel False: never). offsets: as
    w4a16_triton.int_gemm's."""
    lead = x.shape[:-1]
    x = x.reshape(-1, x.shape[-1])
    x = x[:, perm] if perm is not None else (x if x.stride(-1) == 1 else x.contiguous())
    y = gemm_if_taken(x, qweight, scales, zeros, bits, offsets) if cuda_kernel else None
    if y is None:
        cfg = bucket_config(x.shape[0], qweight.shape[1], x.shape[1], bits, num_sms(x.device))
        y = w4a16_mma(x, qweight, scales, zeros, bits, cfg, counters)
        y = y if offsets is None else add_group_offsets(y, x, offsets)
    return y.reshape(*lead, y.shape[-1])


def warm_up_mma(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    bits: int,
    dtype: torch.dtype,
    counters: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
) -> None:
    """Run each bucket's launch shape once (zeros in), so Triton compiles them while the model loads, and
    w4a16_gemm.cu's builds (one per token-tile count, stage count, cluster use and offsets) where the
    dispatch takes it (w4a16_gemm_cuda.takes: up to 384 tokens, past the buckets)."""
    k = qweight.shape[0] * (32 // bits)
    tops = [top for top, cfg in MMA_BUCKETS.get(bits, ()) if cfg is not None]
    for top in tops:
        x = torch.zeros(top, k, device=qweight.device, dtype=dtype)
        int_gemm_mma(x, qweight, scales, zeros, bits, None, counters, cuda_kernel=False, offsets=offsets)
    if tops and qweight.is_cuda:  # the dispatch's CUDA GEMM (takes: int4 / int8), up to its most tokens
        from .w4a16_gemm_cuda import takes, w4a16_gemm
        from .w4a16_gemm_plan import PREFERRED_M, warm_up_ms

        x = torch.zeros(PREFERRED_M[1], k, device=qweight.device, dtype=dtype)
        hopper = torch.cuda.get_device_capability(qweight.device) >= (9, 0)
        for m in warm_up_ms(PREFERRED_M[1], k, hopper, k // scales.shape[0], bits):
            if takes(x[:m], qweight, scales, offsets, bits):
                w4a16_gemm(x[:m], qweight, scales, zeros, num_sms(x.device), offsets=offsets)
