"""The prefill kernel's device helpers (prefill_attention_triton.py): which (sequence, query tile) a
program of the flat grid owns, and the spans of positions a query tile attends (the chunk's own, the
cached prefix or a partition of it), each as whole unmasked tiles then the masked rest."""

from __future__ import annotations

import triton
import triton.language as tl

from .attention_tile_triton import attend_range


@triton.jit
def flat_tile(cu_seqlens_q_ptr, num_seqs, pid, BLOCK_Q: tl.constexpr, BLOCK_SEQS: tl.constexpr):
    """Program pid of the flat grid -> (sequence, query tile); sequence >= num_seqs past the last tile.
    Tiles are numbered sequence by sequence, each sequence's last (longest-context) tile first."""
    offs = tl.arange(0, BLOCK_SEQS)
    live = offs < num_seqs
    lo = tl.load(cu_seqlens_q_ptr + offs, mask=live, other=0)
    hi = tl.load(cu_seqlens_q_ptr + offs + 1, mask=live, other=0)
    tiles = tl.cdiv(hi - lo, BLOCK_Q)  # [BLOCK_SEQS] query tiles per sequence, 0 past num_seqs
    ends = tl.cumsum(tiles, 0)  # one past each sequence's last tile number
    seq = tl.sum((ends <= pid).to(tl.int32), 0)  # the sequences that end at or before pid
    first = tl.sum(tl.where(offs == seq, ends - tiles, 0), 0)
    count = tl.sum(tl.where(offs == seq, tiles, 0), 0)
    return seq, count - 1 - (pid - first)


@triton.jit
def attend_span(
    acc, l_i, m_i, q, q_pos, k_ptr, v_ptr, bt_row, lo, full, end, qk_scale, k_head_off, v_head_off,
    stride_kb, stride_ks, stride_vb, stride_vs, k_scale_ptr, v_scale_ptr, s_head_off, stride_sb, stride_ss,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
    SCALED: tl.constexpr, CONTIG: tl.constexpr, PRESCALED: tl.constexpr, PAGES_AHEAD: tl.constexpr,
    V_TILE: tl.constexpr, WIDEN_ASM: tl.constexpr, CAUSAL: tl.constexpr = True,
):  # fmt: skip
    """Tiles from lo: those below `full` are visible to every row (no masks), the rest up to `end` are
    masked at `end` and, when CAUSAL, by each row's position."""
    acc, l_i, m_i = attend_range(
        acc, l_i, m_i, q, q_pos, k_ptr, v_ptr, bt_row, lo, full, end, qk_scale, k_head_off, v_head_off,
        stride_kb, stride_ks, stride_vb, stride_vs, k_scale_ptr, v_scale_ptr, s_head_off, stride_sb,
        stride_ss, HEAD_DIM, BLOCK_D, PAGE, BLOCK_N, False, False, SCALED, CONTIG, PRESCALED, PAGES_AHEAD,
        V_TILE, WIDEN_ASM,
    )  # fmt: skip
    return attend_range(
        acc, l_i, m_i, q, q_pos, k_ptr, v_ptr, bt_row, full, end, end, qk_scale, k_head_off, v_head_off,
        stride_kb, stride_ks, stride_vb, stride_vs, k_scale_ptr, v_scale_ptr, s_head_off, stride_sb,
        stride_ss, HEAD_DIM, BLOCK_D, PAGE, BLOCK_N, True, CAUSAL, SCALED, CONTIG, PRESCALED, PAGES_AHEAD,
        V_TILE, WIDEN_ASM,
    )  # fmt: skip


@triton.jit
def attend_prefix(
    acc, l_i, m_i, q, q_pos, k_ptr, v_ptr, bt_row, lo, hi, qk_scale, k_head_off, v_head_off, stride_kb,
    stride_ks, stride_vb, stride_vs, k_scale_ptr, v_scale_ptr, s_head_off, stride_sb, stride_ss,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, PAGE: tl.constexpr, BLOCK_N: tl.constexpr,
    SCALED: tl.constexpr, PRESCALED: tl.constexpr, PAGES_AHEAD: tl.constexpr, V_TILE: tl.constexpr,
    WIDEN_ASM: tl.constexpr,
):  # fmt: skip
    """Cached positions [lo, hi) from the pages (lo a multiple of BLOCK_N), visible to every row: whole
    tiles unmasked, then the partial last one."""
    if SCALED and q.dtype != tl.float32 and k_ptr.dtype.element_ty != tl.int8:
        q = q.to(tl.float16)  # e4m3 pages, 16-bit activations: fp16 dots (attention_tile_triton.py)
    return attend_span(
        acc, l_i, m_i, q, q_pos, k_ptr, v_ptr, bt_row, lo, lo + (hi - lo) // BLOCK_N * BLOCK_N, hi, qk_scale,
        k_head_off, v_head_off, stride_kb, stride_ks, stride_vb, stride_vs, k_scale_ptr, v_scale_ptr,
        s_head_off, stride_sb, stride_ss, HEAD_DIM, BLOCK_D, PAGE, BLOCK_N, SCALED, False, PRESCALED,
        PAGES_AHEAD, V_TILE, WIDEN_ASM, CAUSAL=False,
    )  # fmt: skip
