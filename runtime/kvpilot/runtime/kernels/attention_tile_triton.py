"""The inner step shared by the paged attention kernels: one BLOCK_N tile of context, online softmax.

A tile is BLOCK_N consecutive context positions n0 .. n0 + BLOCK_N - 1. Each position is looked up in the
sequence's block table (page = table[pos // PAGE], row = pos % PAGE), so a tile gathers BLOCK_N / PAGE
pages when PAGE <= BLOCK_N, or part of one page otherwise. Scores are in base 2 (qk_scale includes
log2(e)) and accumulate in fp32.

8-bit caches (SCALED): the stored values are widened exactly to q's dtype and go to the dots unscaled;
position n's K scale then multiplies score column n, and its V scale the softmax weight p[:, n] before the
P.V dot. That is exact dequantization (sum_d q_d * k_nd * s_n = s_n * q.k_n) done on the
[BLOCK_M, BLOCK_N] tile rather than on the [BLOCK_N, BLOCK_D] K and V tiles, so it costs a few multiplies
per position, not per element. The dot type (set where the kernels load q) is fp16 for e4m3 (one hardware
conversion per two elements on Hopper; e4m3 -> bf16 measured 17% slower on the H200) and q's 16-bit type
for int8 (int8 -> fp16 was no faster than int8 -> bf16, by a plain cast or the 0x6400 magic number); every
e4m3 value and every int8 in [-127, 127] is exact in either. fp32 activations (the CPU interpreter) widen
to fp32. When the dot runs in fp16, the V scales are divided by their tile maximum before they multiply p
(so p * scale stays in fp16's normal range) and the maximum multiplies the tile's P.V product; bf16 has
fp32's exponent range and needs no such step (it costs the fused accumulate: ~15% at 64 x 4k).

8-bit V tile (V_TILE): in P.V, V [BLOCK_N, BLOCK_D] is the B operand and its K dimension (the
context positions) is not the contiguous one. Triton moves a plain widening cast after the layout
conversion, so it gathers the transposed 8-bit operand from shared memory one byte at a time (128
ld.shared.b8 per thread per 128-position tile at 4 warps, and 255 registers: compile_check's "byte lds").
_widen_opaque widens V with inline PTX that the compiler does not move, so the conversion runs in the
load's vectorized layout and the 16-bit tile reaches the dot through ldmatrix.trans, as a bf16 cache's
does (163-176 registers). int8 widens by the 0x6400 magic number (exact for [-128, 127]).

Native QK dot (QK_NATIVE, decode only): the caller quantized q per row to the cache's type (q8, with
row scales q_scale), so S = (q8 . k8) * q_scale[row] * k_scale[col]. For int8 the dot is int8 x int8 ->
int32 on the tensor cores and K is never widened; q's rounding costs at most 0.4% of its row maximum per
element. (e4m3 x e4m3 at this tile's M = 16 is lowered by Triton to a widening and an fp16 dot, so it only
adds q's rounding; it is kept selectable for the sweep.)
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kv8_convert_triton import e4m3_to_f16_ptx, int8_to_f16_ptx


@triton.jit
def _widen_opaque(x):
    """8-bit tile -> fp16 by inline PTX that the compiler cannot move past a layout conversion: the
    conversion happens in the load's (vectorized) layout and the 16-bit tile then goes to the dot
    operand layout with ldmatrix.trans, instead of byte-wise shared loads of the 8-bit tile (what
    Triton emits for an 8-bit B operand whose K dimension is not contiguous: V in P.V)."""
    if x.dtype == tl.int8:
        return int8_to_f16_ptx(x, False)
    else:
        return e4m3_to_f16_ptx(x)


@triton.jit
def attend_tile(
    acc,  # [BLOCK_M, BLOCK_D] fp32 un-normalised output
    l_i,  # [BLOCK_M] fp32 running sum of exp2(score - m_i)
    m_i,  # [BLOCK_M] fp32 running max score
    q,  # [BLOCK_M, BLOCK_D] in the cache dtype (16/32-bit caches) or the activation dtype (8-bit)
    q_pos,  # [BLOCK_M] position of each query row (used when CAUSAL)
    k_cache_ptr,
    v_cache_ptr,
    bt_row,  # pointer to this sequence's block-table row
    n0,  # first context position of the tile
    end,  # positions >= end are masked out (used when MASK)
    qk_scale,
    k_head_off,  # kv_head * stride of the head dim, K cache
    v_head_off,
    stride_kb,
    stride_ks,
    stride_vb,
    stride_vs,
    k_scale_ptr,  # [num_blocks, PAGE, num_kv_heads] fp32 (read when SCALED)
    v_scale_ptr,
    s_head_off,  # kv_head * stride of the head dim, scales
    stride_sb,
    stride_ss,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASK: tl.constexpr,  # the tile may run past `end` (the last tile)
    CAUSAL: tl.constexpr,  # the tile may hold positions after some query row (diagonal tiles)
    SCALED: tl.constexpr,  # 8-bit cache with per-(position, head) fp32 scales
    q8=1.0,  # [BLOCK_M, BLOCK_D] q quantized per row to the cache's 8-bit type (read when QK_NATIVE)
    q_scale=1.0,  # [BLOCK_M] fp32 row scales of q8 (read when QK_NATIVE)
    QK_NATIVE: tl.constexpr = False,  # q is 8-bit like K: the QK dot runs on 8-bit operands
    V_TILE: tl.constexpr = False,  # 8-bit cache: widen V in its load layout (see _widen_opaque)
    WIDEN_ASM: tl.constexpr = True,  # False under the CPU interpreter (no PTX): V_TILE widens by a cast
    CONTIG: tl.constexpr = False,  # 16-bit K/V [positions, kv_heads, head_dim] from the step's projection
    PRESCALED: tl.constexpr = False,  # q already carries qk_scale (16-bit caches only)
    tile_pages=0,  # [BLOCK_N] block-table entries of the tile's positions (read when PAGES_GIVEN)
    PAGES_GIVEN: tl.constexpr = False,  # the caller looked the pages up (one tile ahead): no table load
):
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    pos = n0 + offs_n  # [BLOCK_N]
    valid = pos < end
    if CONTIG:  # the caller offset the K/V pointers to the sequence's first position: no block table
        page = pos.to(tl.int64)  # unused: 8-bit caches are always paged
        in_page = pos % PAGE
        k_rows = pos.to(tl.int64) * stride_ks + k_head_off
        v_rows = pos.to(tl.int64) * stride_vs + v_head_off
    else:
        if PAGES_GIVEN:
            page = tile_pages
        elif MASK:
            page = tl.load(bt_row + pos // PAGE, mask=valid, other=0)
        else:
            page = tl.load(bt_row + pos // PAGE)
        page = page.to(tl.int64)
        in_page = pos % PAGE
        k_rows = page * stride_kb + in_page * stride_ks + k_head_off  # [BLOCK_N] row offsets
        v_rows = page * stride_vb + in_page * stride_vs + v_head_off
    k_ptrs = k_cache_ptr + k_rows[:, None] + offs_d[None, :]  # [BLOCK_N, BLOCK_D]
    v_ptrs = v_cache_ptr + v_rows[:, None] + offs_d[None, :]
    # Issue the V load together with K (before the first dot) so that, when the compiler does not
    # pipeline the loop, a tile costs one memory latency rather than two. (Nested constexpr branches, no
    # `or`, keep this portable across Triton versions.)
    if MASK:
        kv_mask = valid[:, None] & (offs_d[None, :] < HEAD_DIM)  # [BLOCK_N, BLOCK_D]
        k = tl.load(k_ptrs, mask=kv_mask, other=0.0)
        v = tl.load(v_ptrs, mask=kv_mask, other=0.0)
    elif HEAD_DIM != BLOCK_D:
        d_mask = offs_d[None, :] < HEAD_DIM  # [1, BLOCK_D], broadcast over the rows
        k = tl.load(k_ptrs, mask=d_mask, other=0.0)
        v = tl.load(v_ptrs, mask=d_mask, other=0.0)
    else:
        k = tl.load(k_ptrs)  # [BLOCK_N, BLOCK_D]
        v = tl.load(v_ptrs)
    # 8-bit codes are widened exactly to the 16-bit dot type for the tensor-core dots (unless that dot
    # runs natively on 8-bit operands); for a 16-bit cache this is a no-op.
    if not QK_NATIVE:
        k = k.to(q.dtype)
    # V_TILE: fp16 by inline PTX (under the interpreter, which runs no PTX, by a cast to q's type)
    v = _widen_opaque(v) if V_TILE and WIDEN_ASM else v.to(q.dtype)

    if SCALED:
        s_rows = page * stride_sb + in_page * stride_ss + s_head_off  # [BLOCK_N]
        if MASK:
            k_s = tl.load(k_scale_ptr + s_rows, mask=valid, other=0.0)
            v_s = tl.load(v_scale_ptr + s_rows, mask=valid, other=0.0)
        else:
            k_s = tl.load(k_scale_ptr + s_rows)
            v_s = tl.load(v_scale_ptr + s_rows)
        if QK_NATIVE and k.dtype == tl.int8:  # int8 x int8 -> int32, exact
            qk = tl.dot(q8, tl.trans(k), out_dtype=tl.int32).to(tl.float32)
        elif QK_NATIVE:
            qk = tl.dot(q8, tl.trans(k))  # e4m3 x e4m3, [BLOCK_M, BLOCK_N] fp32
        else:
            qk = tl.dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N] fp32
        if QK_NATIVE:
            qk = qk * q_scale[:, None]
        s = qk * (k_s * qk_scale)[None, :]
    elif PRESCALED:
        s = tl.dot(q, tl.trans(k))  # [BLOCK_M, BLOCK_N] fp32, already in base-2 units
    else:
        s = tl.dot(q, tl.trans(k)) * qk_scale  # [BLOCK_M, BLOCK_N] fp32
    if CAUSAL:
        s = tl.where((pos[None, :] <= q_pos[:, None]) & valid[None, :], s, float("-inf"))
    elif MASK:
        s = tl.where(valid[None, :], s, float("-inf"))
    # m_i is finite after the first tile (position 0 is visible to every row), so no -inf - -inf.
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)

    if SCALED and v.dtype == tl.float16:  # keep p * scale in fp16's normal range
        v_max = tl.max(v_s, 0)
        v_max = tl.where(v_max > 0.0, v_max, 1.0)
        acc = acc * alpha[:, None] + tl.dot((p * (v_s / v_max)[None, :]).to(v.dtype), v) * v_max
    elif SCALED:
        acc = acc * alpha[:, None] + tl.dot((p * v_s[None, :]).to(v.dtype), v)
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, l_i, m_new


@triton.jit
def attend_range(
    acc, l_i, m_i, q, q_pos, k_ptr, v_ptr, bt_row, lo, hi, end, qk_scale, k_head_off, v_head_off,
    stride_kb, stride_ks, stride_vb, stride_vs, k_scale_ptr, v_scale_ptr, s_head_off, stride_sb, stride_ss,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
    MASK: tl.constexpr, CAUSAL: tl.constexpr, SCALED: tl.constexpr, CONTIG: tl.constexpr,
    PRESCALED: tl.constexpr, PAGES_AHEAD: tl.constexpr, V_TILE: tl.constexpr = False,
    WIDEN_ASM: tl.constexpr = True,
):  # fmt: skip
    """attend_tile over the tiles starting at lo, lo + BLOCK_N, ... below hi (positions >= end masked
    when MASK). PAGES_AHEAD: each tile's block-table entries are loaded one tile early."""
    offs_n = tl.arange(0, BLOCK_N)
    if PAGES_AHEAD:  # [BLOCK_N] table entries of the first tile
        pages = tl.load(bt_row + (lo + offs_n) // PAGE, mask=lo + offs_n < end, other=0)
    else:
        pages = offs_n  # unused: attend_tile looks its pages up
    for n0 in range(lo, hi, BLOCK_N):
        tile_pages = pages.to(tl.int64)
        if PAGES_AHEAD:
            nxt = n0 + BLOCK_N + offs_n
            pages = tl.load(bt_row + nxt // PAGE, mask=nxt < end, other=0)
        acc, l_i, m_i = attend_tile(
            acc, l_i, m_i, q, q_pos, k_ptr, v_ptr, bt_row, n0, end, qk_scale, k_head_off, v_head_off,
            stride_kb, stride_ks, stride_vb, stride_vs, k_scale_ptr, v_scale_ptr, s_head_off, stride_sb,
            stride_ss, HEAD_DIM, BLOCK_D, PAGE, BLOCK_N, MASK=MASK, CAUSAL=CAUSAL, SCALED=SCALED,
            CONTIG=CONTIG, PRESCALED=PRESCALED, tile_pages=tile_pages, PAGES_GIVEN=PAGES_AHEAD,
            V_TILE=V_TILE, WIDEN_ASM=WIDEN_ASM,
        )  # fmt: skip
    return acc, l_i, m_i
