"""Integer weights in the kernels' canonical layout (kernels/quant_reference.py), and round-to-nearest
quantization of a float weight into it (load-time int8 / int4, and dummy weights of AWQ/GPTQ shapes)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from kvpilot.runtime.errors import ModelLoadError
from kvpilot.runtime.kernels.quant_reference import dequantize_int_ref, pack_rows


@dataclass
class IntWeight:
    """One GEMM's integer weight: qweight int32 [K*bits/32, N], scales/zeros [K/G, N], perm [K] or None.

    zeros hold whole numbers: the Triton GEMV subtracts OFFSET + z from each 16-bit operand and the CUDA
    GEMM (w4a16_gemm.cu, read_group) truncates -(128 + z) to bf16, both exact only for an integer z, so a
    fractional zero point (GGUF Q4_1's -m / d, say) would be rounded there and not in the references.
    from_unpacked refuses one; from_affine keeps it as a whole zero plus `offsets` [K/G, N], a constant added
    to every weight of its group: W^T = s (q - z) + offset, so x W^T = the kernels' GEMM + (x's group sums)
    offsets (`add_offsets`). The CUDA GEMM adds them itself (w4a16_gemm.cu, OFFSETS, int4 and int8); the
    other kernels are untouched and the dispatch adds the term after them."""

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    bits: int
    perm: torch.Tensor | None = None
    offsets: torch.Tensor | None = None

    @property
    def out_features(self) -> int:
        return int(self.qweight.shape[1])


def from_unpacked(
    q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int, dtype: torch.dtype
) -> IntWeight:
    """q [K, N] unsigned values, scales/zeros [K/G, N] (any strides: a checkpoint's [N, K/G] transposed)
    -> the canonical packed weight, every tensor contiguous (the GPU kernels index it as dense rows)."""
    zeros = zeros.to(dtype).contiguous()
    if not torch.equal(zeros, zeros.round()):
        raise ModelLoadError(
            "quantized weight has fractional zero points; supported: integer zero points (the GPU kernels "
            "subtract them from 16-bit integer operands)"
        )
    return IntWeight(pack_rows(q, bits), scales.to(dtype).contiguous(), zeros, bits)


def from_affine(
    q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int, dtype: torch.dtype
) -> IntWeight:
    """As from_unpacked, for zero points that may be fractional: each becomes the nearest whole zero within
    the bits' range, and what that moves, scale * (whole - z), the group's offset (None if all are whole)."""
    whole = zeros.float().round().clamp(0, (1 << bits) - 1)
    offsets = scales.float() * (whole - zeros.float())
    weight = from_unpacked(q, scales, whole, bits, dtype)
    if bool(offsets.eq(0).all()):
        return weight
    weight.offsets = offsets.to(dtype).contiguous()
    return weight


def add_offsets(y: torch.Tensor, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """y [M, N] + (x's sums over each group of inputs) @ offsets [K/G, N], x [M, K] in the kernels' input
    order: two launches (a sum, an addmm) in x's dtype. A 16-bit sum of 32 inputs rounds by 2**-9 of
    itself, on a term at most half a step per weight: far under y's own rounding."""
    sums = x.reshape(-1, x.shape[-1]).unflatten(-1, (offsets.shape[0], -1)).sum(-1)  # [M, K/G]
    return torch.addmm(y.reshape(sums.shape[0], -1), sums, offsets.to(x.dtype)).view(y.shape)


def dense_weight(w: IntWeight) -> torch.Tensor:
    """W^T [K, N] in the scales' dtype, offsets included (rows in the kernel's order)."""
    dense = dequantize_int_ref(w.qweight, w.scales, w.zeros, w.bits)
    if w.offsets is None:
        return dense
    group = dense.shape[0] // w.offsets.shape[0]
    return dense + w.offsets.to(dense.dtype).repeat_interleave(group, dim=0)


def quantize_rtn(weight: torch.Tensor, bits: int, group_size: int, *, sym: bool) -> IntWeight:
    """Round-to-nearest of W [N, K] with one scale per group of `group_size` inputs (-1: the whole row).

    sym: scale = absmax / (2**(bits-1) - 1), zero = 2**(bits-1) (int8: q in [1, 255]);
    else: the group's [min, max] (widened to hold 0) mapped onto [0, 2**bits - 1] with an integer zero.
    """
    n, k = weight.shape
    group = k if group_size == -1 else group_size
    if k % group or k % (32 // bits):
        raise ModelLoadError(f"cannot quantize a [{n}, {k}] weight to {bits} bits in groups of {group}")
    w = weight.float().t().reshape(k // group, group, n)  # [groups, G, N]: W^T grouped along K
    qmax = (1 << bits) - 1
    if sym:
        half = 1 << (bits - 1)
        scale = w.abs().amax(dim=1).clamp(min=1e-8) / (half - 1)  # [groups, N]
        zero = torch.full_like(scale, float(half))
    else:
        lo = w.amin(dim=1).clamp(max=0.0)
        hi = w.amax(dim=1).clamp(min=0.0)
        scale = ((hi - lo) / qmax).clamp(min=1e-8)
        zero = torch.round(-lo / scale).clamp(0, qmax)
    q = torch.round(w / scale.unsqueeze(1) + zero.unsqueeze(1)).clamp(0, qmax)
    return from_unpacked(q.reshape(k, n).to(torch.int32), scale, zero, bits, weight.dtype)


def merge_parts(parts: list[IntWeight]) -> list[IntWeight]:
    """Runs of neighbouring fused shards side by side along N as one weight each; a shard whose act-order
    permutation (GPTQ desc_act: each of q/k/v has its own), groups or bits (a GGUF's Q6_K v beside Q4_K q
    and k: 8 and 4) differ from its neighbour's starts a new GEMM."""
    runs: list[list[IntWeight]] = []
    for part in parts:
        if runs and _mergeable(runs[-1][-1], part):
            runs[-1].append(part)
        else:
            runs.append([part])
    return [run[0] if len(run) == 1 else _side_by_side(run) for run in runs]


def _mergeable(a: IntWeight, b: IntWeight) -> bool:
    same_perm = (a.perm is None and b.perm is None) or (
        a.perm is not None and b.perm is not None and torch.equal(a.perm, b.perm)
    )
    return same_perm and a.scales.shape[0] == b.scales.shape[0] and a.bits == b.bits


def _side_by_side(parts: list[IntWeight]) -> IntWeight:
    offsets = None
    if any(p.offsets is not None for p in parts):  # a shard without offsets adds zeros
        offsets = torch.cat(
            [torch.zeros_like(p.scales) if p.offsets is None else p.offsets for p in parts], 1
        )
    return IntWeight(
        torch.cat([p.qweight for p in parts], dim=1),
        torch.cat([p.scales for p in parts], dim=1),
        torch.cat([p.zeros for p in parts], dim=1),
        parts[0].bits,
        parts[0].perm,
        offsets,
    )
