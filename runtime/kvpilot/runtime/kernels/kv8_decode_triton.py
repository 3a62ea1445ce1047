"""Paged decode attention over an 8-bit KV cache (fp8 e4m3 / int8 codes + fp32 per-token-head scales).

The same grid, plan and outputs as decode_attention_triton._decode_kernel (one program per split, KV head
and sequence; split partials merged by its _decode_reduce_kernel), with the tile step chosen by Kv8Path
(kv8_path.py): how the codes are widened (kv8_convert_triton.py), whether the QK dot runs on 8-bit
operands, whether the dots are computed transposed (context positions or head_dim as the M side), and
whether the next tile is loaded into registers before the current one is computed.

Dequantization is exact and done on the score tile, as in attention_tile_triton.py: K's scale multiplies
score column n, V's scale the softmax weight p[:, n]. The fp16 dots need q and p in fp16 range: q is
divided by its row absmax (the factor goes back into the row's scores), and the V scales by their tile
maximum (which multiplies the tile's P.V product).
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from .decode_attention_triton import _partition_for, _quantize_rows, store_partial
from .kv8_convert_triton import widen8
from .kv8_path import DIAG_CODES, Kv8Path, cvt_code


@triton.jit
def _load8(
    k_ptrs0, v_ptrs0, k_scale_ptr, v_scale_ptr, bt_row, n0, end, strides, s_head_off,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """Tile n0 .. n0 + BLOCK_N - 1: codes k, v [BLOCK_N, BLOCK_D], scales k_s, v_s [BLOCK_N] (0 past end),
    and the positions' validity [BLOCK_N]. k_ptrs0/v_ptrs0: the cache pointers plus the KV head offset."""
    stride_kb, stride_ks, stride_vb, stride_vs, stride_sb, stride_ss = strides
    pos = n0 + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    valid = pos < end
    page = tl.load(bt_row + pos // PAGE, mask=valid, other=0).to(tl.int64)
    in_page = pos % PAGE
    mask = valid[:, None] & (offs_d[None, :] < HEAD_DIM)  # [BLOCK_N, BLOCK_D]
    k = tl.load(
        k_ptrs0 + (page * stride_kb + in_page * stride_ks)[:, None] + offs_d[None, :], mask=mask, other=0.0
    )
    v = tl.load(
        v_ptrs0 + (page * stride_vb + in_page * stride_vs)[:, None] + offs_d[None, :], mask=mask, other=0.0
    )
    s_rows = page * stride_sb + in_page * stride_ss + s_head_off  # [BLOCK_N]
    k_s = tl.load(k_scale_ptr + s_rows, mask=valid, other=0.0)
    v_s = tl.load(v_scale_ptr + s_rows, mask=valid, other=0.0)
    return k, v, k_s, v_s, valid


@triton.jit
def _dot(a, b_t, SWAP: tl.constexpr, INT: tl.constexpr = False):
    """a [M, K] . b_t[N, K]^T -> [M, N] fp32; SWAP computes it as (b_t . a^T)^T (b_t's rows the M side)."""
    if SWAP:
        if INT:
            out = tl.trans(tl.dot(b_t, tl.trans(a), out_dtype=tl.int32)).to(tl.float32)
        else:
            out = tl.trans(tl.dot(b_t, tl.trans(a)))
    elif INT:
        out = tl.dot(a, tl.trans(b_t), out_dtype=tl.int32).to(tl.float32)
    else:
        out = tl.dot(a, tl.trans(b_t))
    return out


@triton.jit
def _attend8(acc, l_i, m_i, qd, q_row, q_sum, k, v, k_s, v_s, valid,
             DOT16: tl.constexpr, CVT: tl.constexpr, NATIVE: tl.constexpr, SWAP: tl.constexpr,
             ASM: tl.constexpr):  # fmt: skip
    """One tile, online softmax in base 2. qd [BLOCK_H, BLOCK_D]: q in the dot type (8-bit when NATIVE);
    q_row [BLOCK_H]: the factor that turns a row's dot into its score; q_sum [BLOCK_H]: sum of qd's row
    (the int8 "bias" widening adds 1152 to every K code)."""
    if NATIVE:
        qk = _dot(qd, k, SWAP, k.dtype == tl.int8)  # [BLOCK_H, BLOCK_N]
    else:
        qk = _dot(qd, widen8(k, DOT16, CVT, ASM), SWAP)
        if CVT == 2 and DOT16 and k.dtype == tl.int8:
            qk = qk - 1152.0 * q_sum[:, None]
    if CVT == 2 and DOT16 and k.dtype != tl.int8:  # e4m3 codes widened to x / 256
        v_s = v_s * 256.0
        if not NATIVE:
            k_s = k_s * 256.0
    s = qk * q_row[:, None] * k_s[None, :]
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))  # finite: every tile holds a valid position
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])  # [BLOCK_H, BLOCK_N]
    l_i = l_i * alpha + tl.sum(p, 1)
    vd = widen8(v, DOT16, CVT, ASM)  # [BLOCK_N, BLOCK_D]
    if DOT16:  # p * scale / (the tile's largest scale) stays in fp16's normal range
        v_max = tl.max(v_s, 0)
        v_max = tl.where(v_max > 0.0, v_max, 1.0)
        w = (p * (v_s / v_max)[None, :]).to(tl.float16)
        pv = _dot(w, tl.trans(vd), SWAP)  # [BLOCK_H, BLOCK_D]
        if CVT == 2 and v.dtype == tl.int8:
            pv = pv - 1152.0 * tl.sum(w.to(tl.float32), 1)[:, None]
        pv = pv * v_max
    else:
        pv = _dot(p * v_s[None, :], tl.trans(vd), SWAP)
    return acc * alpha[:, None] + pv, l_i, m_new


@triton.jit
def _diag_fold(fold, s_fold, k, v, k_s, v_s, DIAG: tl.constexpr, DOT16: tl.constexpr, CVT: tl.constexpr,
               ASM: tl.constexpr):  # fmt: skip
    """Bench-only: fold a tile into a running value without dots (DIAG 1: raw bits; 2: widened)."""
    if DIAG == 1:
        fold = fold ^ k.to(tl.int8, bitcast=True) ^ v.to(tl.int8, bitcast=True)
    else:
        fold = fold + widen8(k, DOT16, CVT, ASM) + widen8(v, DOT16, CVT, ASM)
    return fold, s_fold + k_s + v_s


@triton.jit(do_not_specialize=["partition_size", "num_splits", "stride_bt"])
def _decode8_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, part_out_ptr, part_lse_ptr, context_lens_ptr, block_tables_ptr,
    qk_scale, partition_size, num_splits, num_heads, stride_qs, stride_qh, stride_os, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
    k_scale_ptr, v_scale_ptr, stride_sb, stride_ss, stride_sh,
    GROUP: tl.constexpr, BLOCK_H: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
    SCALED: tl.constexpr, QK_NATIVE: tl.constexpr, V_TILE: tl.constexpr,  # _decode_kernel's; unused here
    WIDEN_ASM: tl.constexpr, QMAX: tl.constexpr,
    DOT16: tl.constexpr, CVT: tl.constexpr, NATIVE: tl.constexpr, SWAP: tl.constexpr,
    PREFETCH: tl.constexpr, DIAG: tl.constexpr, PDL: tl.constexpr = False,
):  # fmt: skip
    """Pointers and shapes as decode_attention_triton._decode_kernel's (scales [num_blocks, PAGE, KVH])."""
    split, kv_head, seq = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if PDL:  # as _decode_kernel's: wait first, release the next kernel after the tiles
        tl.extra.cuda.gdc_wait()
    ctx = tl.load(context_lens_ptr + seq)
    partition_size = _partition_for(ctx, partition_size, num_splits, BLOCK_N)
    start = split * partition_size
    if SPLIT:  # noqa: SIM102 (a constexpr branch around a runtime one)
        if start >= ctx:  # past the sequence's end: the reduce ignores this partition
            return
    end = tl.minimum(start + partition_size, ctx)

    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    out_mask = (offs_h < GROUP)[:, None] & (offs_d < HEAD_DIM)[None, :]
    heads = kv_head * GROUP + offs_h
    q = tl.load(q_ptr + seq.to(tl.int64) * stride_qs + heads[:, None] * stride_qh + offs_d[None, :],
                mask=out_mask, other=0.0).to(tl.float32)  # [BLOCK_H, BLOCK_D]  # fmt: skip
    if NATIVE:  # q on the cache's 8-bit grid, per row
        qd, q_row = _quantize_rows(q, k_cache_ptr.dtype.element_ty, QMAX)
    elif DOT16:  # |q| <= 1 per row in fp16; the row's absmax goes back into its scores
        amax = tl.max(tl.abs(q), 1)
        q_row = tl.where(amax > 0.0, amax, 1.0)
        qd = (q / q_row[:, None]).to(tl.float16)
    else:
        qd, q_row = q, tl.full([BLOCK_H], 1.0, tl.float32)
    q_sum = tl.sum(qd.to(tl.float32), 1)  # [BLOCK_H] (the int8 "bias" widening)
    q_row = q_row * qk_scale

    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    k_ptrs0 = k_cache_ptr + kv_head * stride_kh
    v_ptrs0 = v_cache_ptr + kv_head * stride_vh
    strides = (stride_kb, stride_ks, stride_vb, stride_vs, stride_sb, stride_ss)
    s_off = kv_head * stride_sh
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    if DIAG == 1:
        fold = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.int8)
    elif DOT16:
        fold = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float16)
    else:
        fold = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    s_fold = tl.zeros([BLOCK_N], dtype=tl.float32)
    if PREFETCH:  # tile i + 1 is loaded into registers while tile i is computed
        k_n, v_n, ks_n, vs_n, _ = _load8(
            k_ptrs0, v_ptrs0, k_scale_ptr, v_scale_ptr, bt_row, start, end, strides, s_off,
            HEAD_DIM, BLOCK_D, PAGE, BLOCK_N,
        )  # fmt: skip
    for n0 in range(start, end, BLOCK_N):
        if PREFETCH:
            k, v, k_s, v_s = k_n, v_n, ks_n, vs_n
            valid = n0 + tl.arange(0, BLOCK_N) < end
            k_n, v_n, ks_n, vs_n, _ = _load8(
                k_ptrs0, v_ptrs0, k_scale_ptr, v_scale_ptr, bt_row, n0 + BLOCK_N, end, strides, s_off,
                HEAD_DIM, BLOCK_D, PAGE, BLOCK_N,
            )  # fmt: skip
        else:
            k, v, k_s, v_s, valid = _load8(
                k_ptrs0, v_ptrs0, k_scale_ptr, v_scale_ptr, bt_row, n0, end, strides, s_off,
                HEAD_DIM, BLOCK_D, PAGE, BLOCK_N,
            )  # fmt: skip
        if DIAG == 0:
            acc, l_i, m_i = _attend8(
                acc, l_i, m_i, qd, q_row, q_sum, k, v, k_s, v_s, valid, DOT16, CVT, NATIVE, SWAP, WIDEN_ASM
            )  # fmt: skip
        else:
            fold, s_fold = _diag_fold(fold, s_fold, k, v, k_s, v_s, DIAG, DOT16, CVT, WIDEN_ASM)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    if DIAG != 0:  # something that depends on every byte read, so nothing is optimised away
        acc += tl.sum(fold.to(tl.float32), 0)[None, :] + tl.sum(s_fold, 0)
        l_i, m_i = l_i + 1.0, m_i * 0.0

    if SPLIT:
        store_partial(acc, l_i, m_i, part_out_ptr, part_lse_ptr, seq, kv_head, split, num_splits, num_heads,
                      GROUP, BLOCK_H, HEAD_DIM, BLOCK_D)  # fmt: skip
    else:
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)  # context_len 0 (padding rows) -> zeros, not NaN
        o_ptrs = out_ptr + seq.to(tl.int64) * stride_os + heads[:, None] * stride_oh + offs_d[None, :]
        tl.store(o_ptrs, (acc / l_safe[:, None]).to(out_ptr.dtype.element_ty), mask=out_mask)


def kv8_kernel(
    path: Kv8Path, q: torch.Tensor, k_cache: torch.Tensor, block_d: int
) -> tuple[Any, dict[str, Any]]:
    """(_decode8_kernel, its constants beyond _decode_kernel's) for paged_decode_attention_triton, which
    launches it with _decode_kernel's arguments and merges split partials with its reduce kernel."""
    return _decode8_kernel, {
        "DOT16": q.dtype != torch.float32,
        "CVT": cvt_code(path.cvt, k_cache.dtype == torch.int8),
        # 8-bit tensor-core dots need K >= 32; fp32 activations ask for fp32 precision: exact widening
        "NATIVE": path.qk == "native" and block_d >= 32 and q.dtype != torch.float32,
        "SWAP": path.swap,
        "PREFETCH": path.prefetch,
        "DIAG": DIAG_CODES[path.diag],
    }
