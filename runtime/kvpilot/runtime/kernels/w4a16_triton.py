"""Weight-only integer GEMMs (W4A16 and W8A16): y [M, N] = x [M, K] @ W^T, W^T dequantized in registers
from the canonical layout (kernels/quant_reference.py: int32 words packed along K, scales/zeros per group
of G input rows). The torch reference beside it is quant_reference.int_gemm_ref.

One kernel, three launch shapes chosen by M (the number of tokens):
  decode   M <= 16: BLOCK_M = 16 and split-K (each program reduces K / SPLIT_K rows of W for one tile of
           BLOCK_N outputs, float32 partials summed by a second small kernel), so a batch-1 GEMM still puts a
           few programs on every SM; the weight is read once, at a quarter (int4) of bf16's bytes.
  prefill  16 < M < DEQUANT_CUBLAS_MIN_M: larger M tiles, split-K only while the tiles alone would
           leave SMs idle.
  large M  M >= DEQUANT_CUBLAS_MIN_M: compute-bound; dequantize the weight once (a Triton kernel writing
           W^T in x's dtype) and let cuBLAS run the GEMM, whose tensor-core efficiency the fused kernel
           does not beat there. The threshold is set from benchmarks/bench_w4a16.py.
Inside a BLOCK_K step every row shares one group (BLOCK_K divides G), so the kernel multiplies x by the
exact small integers (q - z) and scales the partial product once per column: acc += (x @ (q - z)) * s.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from kvpilot.runtime.kernels.triton_utils import num_sms

DECODE_MAX_M = 16
DEQUANT_CUBLAS_MIN_M = 256
_BLOCK_KS = (128, 64, 32, 16)


@triton.jit
def _int_gemm_kernel(
    x_ptr,  # [M, K] activations (rows stride_xm apart)
    qw_ptr,  # int32 [K / PER_WORD, N]
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
    BLOCK_K: tl.constexpr,
):
    PER_WORD: tl.constexpr = 32 // BITS
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask, n_mask = offs_m < M, offs_n < N
    shifts = tl.arange(0, PER_WORD) * BITS  # [PER_WORD]: value j of a word sits at bits j*BITS
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    k_start = pid_k * K_PER_SPLIT
    for k0 in range(k_start, k_start + K_PER_SPLIT, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :], mask=m_mask[:, None], other=0.0)
        offs_w = k0 // PER_WORD + tl.arange(0, BLOCK_K // PER_WORD)
        words = tl.load(qw_ptr + offs_w[:, None] * N + offs_n[None, :], mask=n_mask[None, :], other=0)
        q = (words[:, None, :] >> shifts[None, :, None]) & ((1 << BITS) - 1)  # [BK/PW, PW, BN]
        q = tl.reshape(q, (BLOCK_K, BLOCK_N))  # row k = word row * PER_WORD + j, as packed
        group = k0 // GROUP
        s = tl.load(s_ptr + group * N + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        z = tl.load(z_ptr + group * N + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        w = (q.to(tl.float32) - z[None, :]).to(x.dtype)  # integers of at most 9 bits: exact in bf16
        acc += tl.dot(x, w, out_dtype=tl.float32) * s[None, :]
    out = out_ptr + pid_k * stride_os + offs_m[:, None] * stride_om + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


@triton.jit
def _dequantize_kernel(
    qw_ptr,  # int32 [K / PER_WORD, N]
    s_ptr,
    z_ptr,
    out_ptr,  # [K, N] in the activations' dtype
    N,
    GROUP: tl.constexpr,
    BITS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    PER_WORD: tl.constexpr = 32 // BITS
    pid_k, pid_n = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    k0 = pid_k * BLOCK_K
    offs_w = k0 // PER_WORD + tl.arange(0, BLOCK_K // PER_WORD)
    words = tl.load(qw_ptr + offs_w[:, None] * N + offs_n[None, :], mask=n_mask[None, :], other=0)
    shifts = tl.arange(0, PER_WORD) * BITS
    q = tl.reshape((words[:, None, :] >> shifts[None, :, None]) & ((1 << BITS) - 1), (BLOCK_K, BLOCK_N))
    s = tl.load(s_ptr + (k0 // GROUP) * N + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + (k0 // GROUP) * N + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    w = (q.to(tl.float32) - z[None, :]) * s[None, :]
    offs_k = k0 + tl.arange(0, BLOCK_K)
    tl.store(
        out_ptr + offs_k[:, None] * N + offs_n[None, :], w.to(out_ptr.dtype.element_ty), mask=n_mask[None, :]
    )


@triton.jit
def _reduce_splits_kernel(
    part_ptr,  # float32 [SPLIT_K, M * N]
    out_ptr,  # [M * N] in the activations' dtype
    MN,
    SPLIT_K: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Sum of the split-K partials, cast on store: one launch (torch would take a sum and a cast)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for split in range(SPLIT_K):
        acc += tl.load(part_ptr + split * MN + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def block_k_for(k: int, group: int) -> int:
    """The largest BLOCK_K in 128/64/32/16 dividing both K and the group (one group per K step)."""
    for block in _BLOCK_KS:
        if k % block == 0 and group % block == 0:
            return block
    raise ValueError(f"the integer GEMM needs K ({k}) and the group size ({group}) divisible by 16")


def _split_k(n_tiles: int, k_steps: int, device: torch.device) -> int:
    """Enough K splits for about two programs per SM, dividing the K steps evenly."""
    want = max(1, (2 * num_sms(device)) // max(n_tiles, 1))
    return max(d for d in range(1, min(want, k_steps) + 1) if k_steps % d == 0)


def dequantize_triton(
    qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int, dtype: torch.dtype
) -> torch.Tensor:
    """W^T [K, N] in `dtype` (the large-M path hands it to cuBLAS)."""
    k, n = qweight.shape[0] * (32 // bits), qweight.shape[1]
    group = k // scales.shape[0]
    block_k, block_n = block_k_for(k, group), 64
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
    block_k = block_k_for(k, group)
    decode = m <= DECODE_MAX_M
    block_m = 16 if decode else (32 if m <= 32 else 64)
    block_n = block_n or (64 if decode else 128)
    n_tiles = triton.cdiv(n, block_n)
    # few output tiles (small M, N ~ 4k): split K until every SM has about two programs
    split = split_k or _split_k(n_tiles * triton.cdiv(m, block_m), k // block_k, x.device)
    if (k // block_k) % split:
        raise ValueError(f"split_k {split} must divide the {k // block_k} K steps")
    if split == 1:
        out = torch.empty(m, n, device=x.device, dtype=x.dtype)
        stride_os = 0
    else:
        out = torch.empty(split, m, n, device=x.device, dtype=torch.float32)
        stride_os = out.stride(0)
    grid = (n_tiles, triton.cdiv(m, block_m), split)
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
        num_warps=num_warps,
        num_stages=3,
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
) -> torch.Tensor:
    """x [..., K] @ W^T -> [..., N] in x's dtype, choosing the launch shape by the token count."""
    lead = x.shape[:-1]
    x = x.reshape(-1, x.shape[-1])
    x = x[:, perm] if perm is not None else (x if x.stride(-1) == 1 else x.contiguous())
    if x.shape[0] >= DEQUANT_CUBLAS_MIN_M:
        y = x @ dequantize_triton(qweight, scales, zeros, bits, x.dtype)
    else:
        y = int_gemm_fused(x, qweight, scales, zeros, bits)
    return y.reshape(*lead, y.shape[-1])


def w4a16_gemm(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    perm: torch.Tensor | None = None,
) -> torch.Tensor:
    """int4 weights (AWQ, GPTQ 4-bit, load-time int4)."""
    return int_gemm(x, qweight, scales, zeros, 4, perm)


def w8a16_gemm(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    perm: torch.Tensor | None = None,
) -> torch.Tensor:
    """int8 weight-only (load-time int8 per channel: one group of K; GPTQ 8-bit)."""
    return int_gemm(x, qweight, scales, zeros, 8, perm)
