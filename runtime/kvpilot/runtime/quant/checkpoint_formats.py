"""Unpacking AWQ and GPTQ checkpoint tensors (as AutoAWQ / AutoGPTQ / GPTQModel write them) into the
canonical integer layout. Written from the published formats:

AWQ (GEMM version, 4-bit): for a layer W [N, K] (N outputs),
    qweight int32 [K, N/8]   8 output columns per word, interleaved: nibble i (bits 4i..4i+3) of word
                             [k, c] holds column 8c + AWQ_ORDER[i]
    qzeros  int32 [K/G, N/8] the zero points, packed the same way
    scales  [K/G, N]         W^T[k, n] = (q - z) * s of group k // G
GPTQ (bits 4 or 8), per_word = 32 / bits:
    qweight int32 [K/per_word, N]  value j of word [r, n] is row r * per_word + j (like ours)
    qzeros  int32 [groups, N/per_word]  packed along N, value j of word [g, c] is column c * per_word + j;
                                   v1 checkpoints (AutoGPTQ; GPTQModel's `gptq` format) store zero - 1,
                                   v2 (`checkpoint_format: gptq_v2`) the zero itself
    scales  [groups, N];  g_idx int32 [K]: the group of each input row (desc_act: a permutation of them)
compressed-tensors pack-quantized (llm-compressor's W4A16 / W8A16), W [N, K] as stored, pw = 32 / bits:
    weight_packed      int32 [N, K/pw]   packed along K: value j of word [n, c] is input c * pw + j
    weight_zero_point  int32 [N/pw, K/G] (asymmetric only) packed along N: value j of word [r, g] is row
                                         r * pw + j
    weight_scale       [N, K/G] (channel strategy: [N, 1]);  weight_g_idx int32 [K] (act order, optional)
    Values are signed, stored with an offset of 2**(bits-1): the stored unsigned value is q + 2**(bits-1),
    so W = (q_stored - zero_stored) * s, with zero_stored = 2**(bits-1) when symmetric (no zero tensor).
compressed-tensors int-quantized / naive-quantized (e.g. W8A8 int8 checkpoints): the same numbers unpacked,
    weight int8 [N, K] signed, weight_scale [N, K/G] (channel: [N, 1]), weight_zero_point int8 alike
    (asymmetric only), weight_g_idx int32 [K]: W = (q - zero) * s.
"""

from __future__ import annotations

import torch
from kvpilot.runtime.errors import ModelLoadError
from kvpilot.runtime.quant.int_weight import IntWeight, from_unpacked

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i -> column offset within the word's 8 columns
_AWQ_COLUMN_TO_NIBBLE = tuple(AWQ_ORDER.index(c) for c in range(8))


def _unpack_columns(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 [R, C] -> [R, C, 32/bits] values (value j at bits j*bits..)."""
    per_word = 32 // bits
    shifts = torch.arange(per_word, dtype=torch.int32, device=packed.device) * bits
    return (packed.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)


def unpack_awq(
    qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype
) -> IntWeight:
    k = qweight.shape[0]
    n = scales.shape[1]
    order = list(_AWQ_COLUMN_TO_NIBBLE)
    q = _unpack_columns(qweight, 4)[..., order].reshape(k, n)
    zeros = _unpack_columns(qzeros, 4)[..., order].reshape(qzeros.shape[0], n)
    return from_unpacked(q, scales.float(), zeros.float(), 4, dtype)


def unpack_gptq(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    g_idx: torch.Tensor | None,
    *,
    bits: int,
    zeros_v2: bool,
    dtype: torch.dtype,
) -> IntWeight:
    per_word = 32 // bits
    k, n = qweight.shape[0] * per_word, qweight.shape[1]
    groups = scales.shape[0]
    shifts = torch.arange(per_word, dtype=torch.int32, device=qweight.device).view(1, per_word, 1) * bits
    q = ((qweight.unsqueeze(1) >> shifts) & ((1 << bits) - 1)).reshape(k, n)
    zeros = _unpack_columns(qzeros, bits).reshape(groups, n).float()
    if not zeros_v2:
        zeros = zeros + 1
    return _grouped(q, scales.float(), zeros, g_idx, bits, dtype)


def unpack_compressed_tensors(
    packed: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    g_idx: torch.Tensor | None,
    *,
    bits: int,
    dtype: torch.dtype,
) -> IntWeight:
    n = packed.shape[0]
    q = _unpack_columns(packed, bits).reshape(n, -1).t()  # [K, N], stored (offset) values
    groups = scale.shape[1]
    if zero_point is None:
        zeros = torch.full((groups, n), float(1 << (bits - 1)), device=scale.device)
    else:
        if zero_point.dtype != torch.int32:
            raise ModelLoadError(
                f"weight_zero_point has dtype {zero_point.dtype}; supported: int32 (packed along the outputs)"
            )
        zeros = _unpack_columns(zero_point.t(), bits).reshape(groups, n).float()
    return _grouped(q, scale.t().float(), zeros, g_idx, bits, dtype)


def unpack_compressed_unpacked(
    weight: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    g_idx: torch.Tensor | None,
    *,
    bits: int,
    dtype: torch.dtype,
) -> IntWeight:
    """int-/naive-quantized: signed int8 values, shifted into the canonical unsigned range."""
    for name, t in (("weight", weight), ("weight_zero_point", zero_point)):
        if t is not None and t.dtype != torch.int8:
            raise ModelLoadError(
                f"{name} has dtype {t.dtype}; supported: int8 (compressed-tensors int-quantized)"
            )
    offset = 1 << (bits - 1)
    q = (weight.to(torch.int32) + offset).t()  # [K, N]
    zeros = torch.full_like(scale, float(offset), dtype=torch.float32)
    if zero_point is not None:
        zeros = zero_point.float() + offset
    return _grouped(q, scale.t().float(), zeros.t(), g_idx, bits, dtype)


def _grouped(
    q: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    g_idx: torch.Tensor | None,
    bits: int,
    dtype: torch.dtype,
) -> IntWeight:
    """q [K, N] in input order, scales/zeros [groups, N], g_idx [K] -> the canonical weight, its rows
    sorted by group where act order shuffled them (the GEMM then reads x[:, perm])."""
    perm = _act_order(g_idx, q.shape[0], scales.shape[0])
    if perm is not None:
        q = q[perm]
    weight = from_unpacked(q, scales, zeros, bits, dtype)
    weight.perm = perm
    return weight


def _act_order(g_idx: torch.Tensor | None, k: int, groups: int) -> torch.Tensor | None:
    """The row order that makes each group contiguous (None when g_idx is already k // G)."""
    group = k // groups
    if g_idx is None:
        return None
    g_idx = g_idx.to(torch.int64)
    if torch.equal(g_idx, torch.arange(k, device=g_idx.device) // group):
        return None
    if int(g_idx.min()) < 0 or int(g_idx.max()) >= groups:
        raise ModelLoadError(f"g_idx holds groups outside [0, {groups})")
    counts = torch.bincount(g_idx, minlength=groups)
    if not bool((counts == group).all()):
        raise ModelLoadError(f"g_idx groups are not all of size {group}; supported: equal-size groups")
    return torch.argsort(g_idx, stable=True)
