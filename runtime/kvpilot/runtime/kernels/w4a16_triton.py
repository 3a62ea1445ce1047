"""Weight-only integer GEMMs (W4A16 and W8A16): y [M, N] = x [M, K] @ W^T, W^T dequantized in registers
from the canonical layout (kernels/quant_reference.py: int32 words packed along K, scales/zeros per group
of G input rows). The torch reference beside it is quant_reference.int_gemm_ref.

int_gemm picks the path by M (the number of tokens):
  int4, M <= 8, bf16/fp16 on a GPU, groups of whole 128-row tiles, >= 2 blocks of 64 columns per SM
           (int4_mma_dispatched: Qwen3-8B's gate_up): kernels/int4_mma_gemv_triton.py, the weight
           mma.sync's A operand straight from its registers.
  int8, M = 1: kernels/int_gemv_fma_triton.py (float32 multiply-adds, no shared memory).
  M <= GEMV_MAX_M (64): kernels/int_gemv_triton.py, a weight stream whose operands are built without
           conversion instructions (magic numbers), split-K, its launch shape a function of M's bucket.
  M > GEMV_MAX_M: dequantize the weight once (a Triton kernel writing W^T in x's dtype) and let cuBLAS
           run the GEMM. On the H200 (BENCHMARKS.md) the GEMV beats this at M = 64 (qkv tie) and loses
           at M = 256 (2-3x); the crossover between was not measured.
The fused kernel below (int_gemm_fused) was the decode and prefill path before the GEMV: BLOCK_M = 16 to
64, float32 split-K partials summed by a second kernel; its int -> float -> bf16 conversions cap it near
1.4 TB/s on the H200. It is no longer dispatched and stays as the benchmark's baseline.
A K step is one interleaved tile of BLOCK_K = pack_tile(K) rows (128 for real models): its
[BLOCK_K / PER_WORD, BLOCK_N] words hold, in value j, the W^T rows j*CHUNK .. (j+1)*CHUNK of the tile,
so value j is one shift and mask of the loaded words (no reshape: the words stay in the layout they were
loaded in) and the step is PER_WORD dots of CHUNK rows against the matching x columns. Each dot's rows
share one group, so the kernel multiplies x by the exact small integers (q - z) and scales the partial
product once per column: acc += (x @ (q - z)) * s (once per tile when the group spans it). Float32
activations get IEEE float32 dots (tf32 would round x), 16-bit ones the tensor cores' native dots.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from kvpilot.runtime.kernels.group_offsets_triton import add_group_offsets
from kvpilot.runtime.kernels.int4_mma_gemv_triton import int4_mma_dispatched, int4_mma_gemv
from kvpilot.runtime.kernels.int_gemv_fma_triton import default_fma_config, int_gemv_fma
from kvpilot.runtime.kernels.int_gemv_triton import GEMV_MAX_M, int_gemv, warm_up_m
from kvpilot.runtime.kernels.quant_reference import pack_tile
from kvpilot.runtime.kernels.split_k_triton import _reduce_splits_kernel
from kvpilot.runtime.kernels.triton_utils import num_sms
from kvpilot.runtime.kernels.w4a16_gemm_cuda import gemm_if_taken

DECODE_MAX_M = 16
# int4 on CUDA through the hand-laid-out mma.sync kernel (w4a16_gemv.cu) where it beats the Triton ones:
# 1-8 tokens in one wave of CTAs (w4a16_cuda.preferred; the H200 sweep of the ninth session: at one token
# qkv 7.9 vs 12.3 µs, o 6.7 vs 10.7, gate_up 18.0 vs 25.3, down 11.7 vs 18.9). int_gemm(...,
# cuda_kernel=False) keeps the Triton kernels.
CUDA_W4A16 = True
DEQUANT_CUBLAS_MIN_M = GEMV_MAX_M + 1  # the H200 sweep: the GEMV loses to it by M = 256
DECODE_PROGRAMS_PER_SM = 4
DECODE_MIN_STEPS = 4


@triton.jit(do_not_specialize=["M"])
def _int_gemm_kernel(
    x_ptr,  # [M, K] activations (rows stride_xm apart)
    qw_ptr,  # int32 [K / PER_WORD, N], interleaved per tile of BLOCK_K rows (quant_reference.pack_rows)
    s_ptr,  # [K / GROUP, N]
    z_ptr,  # [K / GROUP, N]
    out_ptr,  # [SPLIT_K, M, N] (float32 partials) or [M, N]
    M,
    N,
    stride_xm,
    stride_om,
    stride_os,
    K_PER_SPLIT,
    GROUP: tl.constexpr,
    BITS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,  # = pack_tile(K, BITS): one interleaved tile per K step
    DOT_IEEE: tl.constexpr,  # float32 activations: exact float32 dots, not tf32
):
    PER_WORD: tl.constexpr = 32 // BITS
    CHUNK: tl.constexpr = BLOCK_K // PER_WORD  # word rows per tile; value j of them = rows j*CHUNK..
    ONE_GROUP: tl.constexpr = GROUP % BLOCK_K == 0  # the whole tile shares one scale row
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, CHUNK)
    m_mask, n_mask = offs_m < M, offs_n < N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * K_PER_SPLIT
    for k0 in range(k_start, k_start + K_PER_SPLIT, BLOCK_K):
        offs_w = k0 // PER_WORD + offs_c
        words = tl.load(qw_ptr + offs_w[:, None] * N + offs_n[None, :], mask=n_mask[None, :], other=0)
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # this tile's sum, one group (ONE_GROUP)
        z = tl.load(z_ptr + (k0 // GROUP) * N + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        for j in tl.static_range(PER_WORD):
            kj = k0 + j * CHUNK  # rows kj .. kj + CHUNK of W^T, all in group kj // GROUP
            x_at = x_ptr + offs_m[:, None] * stride_xm + (kj + offs_c)[None, :]  # [BLOCK_M, CHUNK]
            x = tl.load(x_at, mask=m_mask[:, None], other=0.0)
            if not ONE_GROUP:
                z = tl.load(z_ptr + (kj // GROUP) * N + offs_n, mask=n_mask, other=0.0).to(tl.float32)
            q = (words >> (j * BITS)) & ((1 << BITS) - 1)  # [CHUNK, BLOCK_N], same layout as words
            w = (q.to(tl.float32) - z[None, :]).to(x.dtype)  # integers of at most 9 bits: exact in bf16
            if DOT_IEEE:
                d = tl.dot(x, w, input_precision="ieee", out_dtype=tl.float32)
            else:
                d = tl.dot(x, w, out_dtype=tl.float32)
            if ONE_GROUP:
                part += d
            else:
                s = tl.load(s_ptr + (kj // GROUP) * N + offs_n, mask=n_mask, other=0.0).to(tl.float32)
                acc += d * s[None, :]
        if ONE_GROUP:
            s = tl.load(s_ptr + (k0 // GROUP) * N + offs_n, mask=n_mask, other=0.0).to(tl.float32)
            acc += part * s[None, :]
    out = out_ptr + pid_k * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _dequantize_kernel(
    qw_ptr,  # int32 [K / PER_WORD, N], interleaved per tile of BLOCK_K rows
    s_ptr,
    z_ptr,
    out_ptr,  # [K, N] in the activations' dtype
    N,
    GROUP: tl.constexpr,
    BITS: tl.constexpr,
    BLOCK_K: tl.constexpr,  # = pack_tile(K, BITS)
    BLOCK_N: tl.constexpr,
):
    PER_WORD: tl.constexpr = 32 // BITS
    CHUNK: tl.constexpr = BLOCK_K // PER_WORD
    pid_k, pid_n = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, CHUNK)
    n_mask = offs_n < N
    k0 = pid_k * BLOCK_K
    words_at = qw_ptr + (k0 // PER_WORD + offs_c)[:, None] * N + offs_n[None, :]  # [CHUNK, BLOCK_N]
    words = tl.load(words_at, mask=n_mask[None, :], other=0)
    for j in tl.static_range(PER_WORD):
        rows = k0 + j * CHUNK + offs_c  # [CHUNK]: value j of each word row (any group size)
        sz = (rows // GROUP)[:, None] * N + offs_n[None, :]
        s = tl.load(s_ptr + sz, mask=n_mask[None, :], other=0.0).to(tl.float32)
        z = tl.load(z_ptr + sz, mask=n_mask[None, :], other=0.0).to(tl.float32)
        q = (words >> (j * BITS)) & ((1 << BITS) - 1)
        w = (q.to(tl.float32) - z) * s
        out = out_ptr + rows[:, None] * N + offs_n[None, :]
        tl.store(out, w.to(out_ptr.dtype.element_ty), mask=n_mask[None, :])


def fused_supported(k: int, group: int, bits: int) -> bool:
    """Whether the fused kernel takes this layout: each of a tile's 32/bits dots spans >= 16 rows (the
    smallest tl.dot) inside one group. Real models (K % 128 == 0, int4 groups >= 16, int8 groups >= 32)
    always qualify; tiny shapes dequantize and use the dense GEMM instead."""
    chunk = pack_tile(k, bits) // (32 // bits)
    return chunk >= 16 and group % chunk == 0


def decode_launch(n: int, k_steps: int, sms: int) -> tuple[int, int]:
    """(BLOCK_N, SPLIT_K) for M <= DECODE_MAX_M, a memory-bound weight stream: about DECODE_PROGRAMS_PER_SM
    programs on every SM, each K loop at least DECODE_MIN_STEPS tiles (the pipeline's depth), SPLIT_K
    dividing the K steps. E.g. Qwen3-8B qkv (N 6144, 32 steps): 96 tiles x 4 splits of 8 steps."""
    block_n = 64
    tiles = -(-n // block_n)
    want = -(-DECODE_PROGRAMS_PER_SM * sms // tiles)
    most = max(1, min(want, k_steps // DECODE_MIN_STEPS))
    return block_n, max(d for d in range(1, most + 1) if k_steps % d == 0)


def prefill_split(tiles: int, k_steps: int, sms: int) -> int:
    """Enough K splits for about two programs per SM, dividing the K steps evenly."""
    want = max(1, (2 * sms) // max(tiles, 1))
    return max(d for d in range(1, min(want, k_steps) + 1) if k_steps % d == 0)


def dequantize_triton(
    qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int, dtype: torch.dtype
) -> torch.Tensor:
    """W^T [K, N] in `dtype` (the large-M path hands it to cuBLAS)."""
    k, n = qweight.shape[0] * (32 // bits), qweight.shape[1]
    group = k // scales.shape[0]
    block_k, block_n = pack_tile(k, bits), 64
    out = torch.empty(k, n, device=qweight.device, dtype=dtype)
    grid = (k // block_k, triton.cdiv(n, block_n))
    _dequantize_kernel[grid](
        qweight, scales, zeros, out, n, GROUP=group, BITS=bits, BLOCK_K=block_k, BLOCK_N=block_n
    )
    return out


def int_gemm_fused(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    bits: int,
    *,
    split_k: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
) -> torch.Tensor:
    """The fused kernel at any M (decode shape for M <= DECODE_MAX_M). x [M, K] dense in its last dim.
    split_k / block_n / num_warps override the launch shape (benchmarks/bench_w4a16.py --sweep)."""
    m, k = x.shape
    n = qweight.shape[1]
    group = k // scales.shape[0]
    if not fused_supported(k, group, bits):
        raise ValueError(
            f"the fused {bits}-bit GEMM needs dots of >= 16 rows inside one group (K {k} packed in tiles"
            f" of {pack_tile(k, bits)} rows, groups of {group}); int_gemm dequantizes such layouts instead"
        )
    block_k = pack_tile(k, bits)
    k_steps, sms = k // block_k, num_sms(x.device)
    if m <= DECODE_MAX_M:
        block_m, (default_n, default_split) = 16, decode_launch(n, k_steps, sms)
        block_n = block_n or default_n
        split = split_k or default_split
    else:
        block_m, block_n = (32 if m <= 32 else 64), block_n or 128
        tiles = triton.cdiv(n, block_n) * triton.cdiv(m, block_m)
        split = split_k or prefill_split(tiles, k_steps, sms)
    if k_steps % split:
        raise ValueError(f"split_k {split} must divide the {k_steps} K steps")
    if split == 1:
        out = torch.empty(m, n, device=x.device, dtype=x.dtype)
        stride_os = 0
    else:
        out = torch.empty(split, m, n, device=x.device, dtype=torch.float32)
        stride_os = out.stride(0)
    grid = (triton.cdiv(n, block_n), triton.cdiv(m, block_m), split)
    _int_gemm_kernel[grid](
        x,
        qweight,
        scales,
        zeros,
        out,
        m,
        n,
        x.stride(0),
        n,
        stride_os,
        k // split,
        GROUP=group,
        BITS=bits,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        DOT_IEEE=x.dtype == torch.float32,
        num_warps=num_warps,
        num_stages=4 if m <= DECODE_MAX_M else 3,
    )
    if split == 1:
        return out
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    block = 1024
    _reduce_splits_kernel[(triton.cdiv(m * n, block),)](out, y, m * n, SPLIT_K=split, BLOCK=block)
    return y


def int_gemm(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    bits: int,
    perm: torch.Tensor | None = None,
    counters: torch.Tensor | None = None,
    cuda_kernel: bool = CUDA_W4A16,
    offsets: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [..., K] @ W^T -> [..., N] in x's dtype, choosing the path by the token count (a shape: CUDA
    graphs capture one choice per batch size). counters: the weight's persistent split-K counters
    (split_k_triton.split_counters), which let the decode GEMV combine its partials in one launch.
    cuda_kernel: False keeps int4 off w4a16_gemv.cu (the Triton kernels' comparison). offsets [K/G, N]:
    a GGUF grid's per-group offsets (quant/int_weight.from_affine), in w4a16_gemm.cu where it runs, else
    added after the GEMM."""
    lead = x.shape[:-1]
    x = x.reshape(-1, x.shape[-1])
    x = x[:, perm] if perm is not None else (x if x.stride(-1) == 1 else x.contiguous())
    group = x.shape[1] // scales.shape[0]
    # w4a16_gemm.cu (NVRTC) at 3-384 tokens (5-384 for a long K; from 1 for groups below 128 and int8)
    y = gemm_if_taken(x, qweight, scales, zeros, bits, offsets) if cuda_kernel else None
    if y is None:
        y = _int_gemm_rest(x, qweight, scales, zeros, bits, group, counters, cuda_kernel)
        y = y if offsets is None else add_group_offsets(y, x, offsets)
    return y.reshape(*lead, y.shape[-1])


def _int_gemm_rest(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    bits: int,
    group: int,
    counters: torch.Tensor | None,
    cuda_kernel: bool,
) -> torch.Tensor:
    """int_gemm's paths past w4a16_gemm.cu, x [M, K] -> [M, N]: dequantize + cuBLAS, the CUDA decode GEMV,
    the Triton kernels."""
    if not fused_supported(x.shape[1], group, bits) or x.shape[0] >= DEQUANT_CUBLAS_MIN_M:
        y = x @ dequantize_triton(qweight, scales, zeros, bits, x.dtype)
    elif cuda_kernel and _cuda_resident_takes(x, qweight, scales, bits):
        from .w4a16_resident import w4a16_resident  # CUDA-only (NVRTC, sm_90), opt-in: see its DISPATCHED

        y = w4a16_resident(x, qweight, scales, zeros, num_sms(x.device))
    elif cuda_kernel and _cuda_w4a16_runs(x, qweight, scales, bits):
        from .w4a16_cuda import w4a16_gemv  # CUDA-only (NVRTC)

        y = w4a16_gemv(x, qweight, scales, zeros, num_sms(x.device), counters)
    elif bits == 4 and int4_mma_dispatched(x, qweight.shape[1], group):
        y = int4_mma_gemv(x, qweight, scales, zeros, counters=counters)
    elif bits == 8 and x.shape[0] == 1:
        cfg = default_fma_config(qweight.shape[1], x.shape[1], bits, num_sms(x.device))
        y = int_gemv_fma(x, qweight, scales, zeros, bits, cfg, counters)
    else:
        y = int_gemv(x, qweight, scales, zeros, bits, counters=counters)
    return y


def _cuda_w4a16_runs(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bits: int) -> bool:
    """Whether w4a16_gemv.cu takes x @ W^T: it can (w4a16_cuda.unsupported) and is expected to be faster
    (w4a16_cuda.preferred)."""
    if bits != 4 or not x.is_cuda:
        return False
    from .w4a16_cuda import preferred, unsupported

    k = x.shape[1]
    if unsupported(x, qweight, scales, bits) is not None:
        return False
    return preferred(x.shape[0], qweight.shape[1], k, k // scales.shape[0], num_sms(x.device))


def _cuda_resident_takes(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bits: int) -> bool:
    if bits != 4 or not x.is_cuda:
        return False
    from .w4a16_resident import takes

    return takes(x, qweight, scales, bits)


def warm_up_int_gemm(
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    bits: int,
    dtype: torch.dtype,
    counters: torch.Tensor | None = None,
    offsets: torch.Tensor | None = None,
) -> None:
    """Run the dispatch once per launch shape it uses below DEQUANT_CUBLAS_MIN_M (zeros in, result
    dropped), so Triton compiles them while the model loads, never in the middle of serving."""
    k = qweight.shape[0] * (32 // bits)
    # 9: M = 1 may take another kernel (int4 mma, int8 multiply-adds) than the rest of the first bucket
    for m in sorted({*warm_up_m(), 9}):
        int_gemm(
            torch.zeros(m, k, device=qweight.device, dtype=dtype),
            qweight,
            scales,
            zeros,
            bits,
            None,
            counters,
            offsets=offsets,
        )
