"""W8A8 int8 for prefill sizes: y [M, N] = (xq [M, K] int8 * sx [M]) @ ((q - 128) [K, N] int8 * sw [N]),
summed exactly in int32 on the int8 tensor cores (twice bf16's rate on Ampere and Hopper), scaled once at
the end. This is how a compressed-tensors W8A8 checkpoint (int8 weights per output channel, symmetric;
int8 activations per token) is meant to run; decode sizes keep the weight-only GEMV (the weight stream is
the whole cost there, and 16-bit activations are more accurate).

The weight stays in the canonical packed layout (quant_reference.pack_rows) that the weight-only kernels
read, so the layer holds one copy: a pack tile of TILE rows is [CHUNK, N] int32 words whose byte j is W^T
rows j*CHUNK .. (j+1)*CHUNK, unsigned with zero point 128. XOR 0x80 per byte makes it the signed q - 128,
and an arithmetic shift plus a truncating cast takes byte j out: one int8 dot of CHUNK = 32 rows per byte,
against the matching 32 columns of x.

Activations: quantize_int8_rows_triton, one absmax scale per token, rounded half away from zero.
The reference is quant_reference.int8_w8a8_ref.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from kvpilot.runtime.kernels.fp8_quant_triton import quantize_rows_kernel
from kvpilot.runtime.kernels.quant_reference import INT8_MAX, pack_tile

_SIGN_BITS = tl.constexpr(-0x7F7F7F80)  # 0x80808080 as an int32


@dataclass(frozen=True)
class W8A8Config:
    """One launch shape (benchmarks/bench_int8_w8a8.py times the alternatives)."""

    block_m: int = 128
    block_n: int = 128
    num_warps: int = 8
    num_stages: int = 3
    swap: bool = False  # acc [BLOCK_N, BLOCK_M]: the unpacked weight as the dot's left operand


@triton.jit(do_not_specialize=["M"])
def _w8a8_kernel(
    xq_ptr,  # int8 [M, K], dense
    sx_ptr,  # float32 [M]
    qw_ptr,  # int32 [K / 4, N], interleaved per TILE rows, zero point 128
    sw_ptr,  # [N] per output channel, the model dtype
    out_ptr,  # [M, N]
    M, N, K,
    TILE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SWAP: tl.constexpr,
):  # fmt: skip
    CHUNK: tl.constexpr = TILE // 4  # word rows per tile; byte j of them = W^T rows j*CHUNK..
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_c = tl.arange(0, CHUNK)
    m_mask, n_mask = offs_m < M, offs_n < N
    if SWAP:  # [BLOCK_N, BLOCK_M]: acc^T, words^T, x^T
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.int32)
        w_at = qw_ptr + offs_c[None, :] * N + offs_n[:, None]  # [BN, CHUNK]
        x_at = xq_ptr + offs_m[None, :] * K + offs_c[:, None]  # [CHUNK, BM]
        w_mask, x_mask = n_mask[:, None], m_mask[None, :]
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        w_at = qw_ptr + offs_c[:, None] * N + offs_n[None, :]  # [CHUNK, BN]
        x_at = xq_ptr + offs_m[:, None] * K + offs_c[None, :]  # [BM, CHUNK]
        w_mask, x_mask = n_mask[None, :], m_mask[:, None]
    for k0 in range(0, K, TILE):
        signed = tl.load(w_at + (k0 // 4) * N, mask=w_mask, other=0) ^ _SIGN_BITS  # bytes q - 128
        for j in tl.static_range(4):
            w = (signed >> (8 * j)).to(tl.int8)  # byte j: W^T rows k0 + j*CHUNK ..
            x = tl.load(x_at + k0 + j * CHUNK, mask=x_mask, other=0)
            if SWAP:  # noqa: SIM108 (a branch on a constexpr, resolved at compile time)
                acc = tl.dot(w, x, acc, out_dtype=tl.int32)
            else:
                acc = tl.dot(x, w, acc, out_dtype=tl.int32)
    sx = tl.load(sx_ptr + offs_m, mask=m_mask, other=0.0)
    sw = tl.load(sw_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    if SWAP:
        y = acc.to(tl.float32) * sw[:, None] * sx[None, :]
        offs = offs_m[None, :] * N + offs_n[:, None]
        mask = m_mask[None, :] & n_mask[:, None]
    else:
        y = acc.to(tl.float32) * sx[:, None] * sw[None, :]
        offs = offs_m[:, None] * N + offs_n[None, :]
        mask = m_mask[:, None] & n_mask[None, :]
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def quantize_int8_rows_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(values int8 [M, K], scales float32 [M]) of x [M, K] (last dim dense): absmax / 127 per token."""
    m, k = x.shape
    out = torch.empty(m, k, device=x.device, dtype=torch.int8)
    scales = torch.empty(m, device=x.device, dtype=torch.float32)
    block = min(4096, triton.next_power_of_2(k))
    quantize_rows_kernel[(m,)](
        x, out, scales, k, x.stride(0), BLOCK=block, QMAX=INT8_MAX, ROUND=True, num_warps=4
    )
    return out, scales


def w8a8_supported(k: int) -> bool:
    """A pack tile holds 4 dots of >= 32 rows (the int8 tensor cores' K step)."""
    return pack_tile(k, 8) // 4 >= 32


def int8_w8a8(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, config: W8A8Config | None = None
) -> torch.Tensor:
    """x [M, K] @ W^T -> [M, N] in x's dtype, W8A8: qweight the canonical packed int8 weight (zero point
    128), scales [1, N] per output channel. The activations are quantized per token first."""
    m, k = x.shape
    n = qweight.shape[1]
    if not w8a8_supported(k):
        raise ValueError(f"int8_w8a8 needs K with a pack tile of 128 rows; K = {k}")
    cfg = config or W8A8Config()
    xq, sx = quantize_int8_rows_triton(x if x.stride(-1) == 1 else x.contiguous())
    out = torch.empty(m, n, device=x.device, dtype=x.dtype)
    grid = (triton.cdiv(n, cfg.block_n), triton.cdiv(m, cfg.block_m))
    _w8a8_kernel[grid](
        xq, sx, qweight, scales, out, m, n, k,
        TILE=pack_tile(k, 8), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, SWAP=cfg.swap,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return out
