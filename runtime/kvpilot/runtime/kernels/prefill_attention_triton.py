"""Paged prefill/extend attention in Triton: varlen query chunks over their whole cached context.

Sequence s owns query rows cu_seqlens_q[s]:cu_seqlens_q[s+1] (its q_len newest tokens); K/V of all
context_lens[s] positions, the new ones included, are already in the paged cache. Query token t of s sits
at position context_lens[s] - q_len + t and sees positions 0..that position (causal).

Grid: (kv heads, query tiles, sequences), longest query tiles first (PrefillConfig.heads_first; the tile
axis first without it). A program takes BLOCK_Q query tokens x all GROUP query heads of one KV head as the
BLOCK_M = BLOCK_Q * GROUP_PAD rows of its tile (GQA packing), so each K/V tile it loads serves every head
that shares it. Row r is token r // GROUP_PAD, head r % GROUP_PAD of the group. Tiles entirely left of the
diagonal run without masks; the remaining ones apply the causal mask. The step's own K/V rows may be passed
(step_kv): each chunk's own positions are then read from them directly (no block-table gather, and for an
8-bit cache at the activations' precision and without widening: a prefill over 8-bit pages runs at
0.5-0.6x of bf16's speed on the H200, BENCHMARKS.md), and only the positions cached before the chunk from
the pages (as SGLang's extend attends the new tokens over a ragged K/V and the prefix over the pages).
With step_kv, a short chunk after a long cached prefix may cut that prefix into partitions along grid
axis 2, merged by the last of a tile's programs (prefill_split_triton.py). The configuration lives in
prefill_plan.py; the span helpers in prefill_spans_triton.py.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .prefill_plan import (
    EIGHT_BIT_PREFILL,
    PrefillConfig,
    default_prefill_config,
    plan_prefix_splits,
    use_flat_grid,
)
from .prefill_spans_triton import attend_prefix, attend_span, flat_tile
from .prefill_split_triton import split_plan, split_workspace, store_partial_or_merge
from .triton_utils import next_power_of_2
from .triton_utils import scale_launch_args as _scale_args

__all__ = [  # the config types are re-exported: callers configure and launch through this module
    "EIGHT_BIT_PREFILL",
    "PrefillConfig",
    "default_prefill_config",
    "paged_prefill_attention_triton",
    "use_flat_grid",
]


# stride_bt is the step's block-table width: specialising on it (== 1, % 16) would compile mid-serving
@triton.jit(do_not_specialize=["stride_bt", "num_seqs", "flat", "prefix_splits"])
def _prefill_kernel(
    q_ptr,  # [num_tokens, num_heads, head_dim]
    k_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache_ptr,
    out_ptr,  # [num_tokens, num_heads, head_dim]
    cu_seqlens_q_ptr,  # [num_seqs + 1] int32
    context_lens_ptr,  # [num_seqs] int32
    block_tables_ptr,  # [num_seqs, max_blocks] int32
    qk_scale,  # softmax scale * log2(e)
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    k_scale_ptr,  # [num_blocks, block_size, num_kv_heads] fp32 (read when SCALED)
    v_scale_ptr,
    stride_sb,
    stride_ss,
    stride_sh,
    kr_ptr,  # [num_tokens, num_kv_heads, head_dim] this step's K rows (read when CONTIG)
    vr_ptr,
    stride_krt,  # token, head strides of the step's K and V rows
    stride_krh,
    stride_vrt,
    stride_vrh,
    num_seqs,
    flat,  # 1: (tiles, kv heads, prefix_splits), PrefillConfig.flat_grid; 0: (tiles, kv heads, seqs)
    ws_acc_ptr,  # SPLIT_Q: float32 partials (prefill_split_triton.store_partial_or_merge)
    ws_ml_ptr,
    counter_ptr,  # SPLIT_Q: int32 [slots], zeroed
    prefix_splits,  # SPLIT_Q: the most partitions of a prefix (grid axis 2 of the flat grid)
    split_partition,  # SPLIT_Q: the fewest positions per partition
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,  # GROUP rounded up to a power of two
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,  # query tokens per program, BLOCK_M // GROUP_PAD
    BLOCK_N: tl.constexpr,
    SCALED: tl.constexpr,  # 8-bit cache: q stays in its dtype, scales dequantize the scores/weights
    BLOCK_SEQS: tl.constexpr = 256,  # num_seqs rounded up to a power of two (flat grid)
    PACK: tl.constexpr = True,  # GQA packing (PrefillConfig.gqa_pack); False: axis 1 is the query head
    CONTIG: tl.constexpr = False,  # the chunk's own K/V from the step's rows (kr/vr), the prefix from pages
    PREFIX: tl.constexpr = True,  # CONTIG: some chunk may have cached positions (False: prefix-free step)
    PRESCALED: tl.constexpr = False,  # PrefillConfig.fold_scale
    PAGES_AHEAD: tl.constexpr = False,  # PrefillConfig.pages_ahead
    HEADS_FIRST: tl.constexpr = False,  # PrefillConfig.heads_first: axes 0 and 1 swapped
    V_TILE: tl.constexpr = False,  # PrefillConfig.v_tile (8-bit caches)
    WIDEN_ASM: tl.constexpr = True,  # False under the CPU interpreter (no PTX)
    SPLIT_Q: tl.constexpr = 0,  # CONTIG with PREFIX: chunks up to this many tokens may split their prefix
    TILES_Q: tl.constexpr = 1,  # query tiles of such a chunk (workspace slots per sequence and head)
):
    # A run-time switch (not a constexpr): both grids share one compiled kernel, so choosing per step
    # never compiles while serving.
    tile_axis: tl.constexpr = 1 if HEADS_FIRST else 0
    head_pid = tl.program_id(1 - tile_axis)  # KV head (PACK) or query head
    if flat != 0:
        seq, tile = flat_tile(cu_seqlens_q_ptr, num_seqs, tl.program_id(tile_axis), BLOCK_Q, BLOCK_SEQS)
    else:
        # Launch the last (longest, most causal context) query tiles first so short ones fill the tail.
        tile = tl.num_programs(tile_axis) - 1 - tl.program_id(tile_axis)
        seq = tl.program_id(2)
    if seq >= num_seqs:  # flat: the grid is sized for the most tiles num_tokens and num_seqs allow
        return
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    t0 = tile * BLOCK_Q
    if t0 >= q_len:  # the grid is sized for the longest chunk
        return
    ctx = tl.load(context_lens_ptr + seq)
    prefix = ctx - q_len  # cached positions before this chunk
    n_split, part, split = 1, prefix, 0
    if SPLIT_Q > 0:  # prefill_split_triton.py: partition `split` of the prefix; partition 0 also the chunk
        n_split, part = split_plan(q_len, prefix, prefix_splits, split_partition, SPLIT_Q, BLOCK_N)
        split = tl.where(flat != 0, tl.program_id(2), 0)
        if split >= n_split:
            return

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    if PACK:
        kv_head = head_pid
        tok = t0 + offs_m // GROUP_PAD  # [BLOCK_M] query token (within the chunk) of each row
        g = offs_m % GROUP_PAD
        row_mask = (tok < q_len) & (g < GROUP)
        heads = kv_head * GROUP + g
    else:  # BLOCK_Q == BLOCK_M tokens of query head head_pid
        kv_head = head_pid // GROUP
        tok = t0 + offs_m
        row_mask = tok < q_len
        heads = head_pid + offs_m * 0
    q_pos = ctx - q_len + tok  # [BLOCK_M] position of each row in its sequence
    row_off = (q_start + tok).to(tl.int64)
    io_mask = row_mask[:, None] & (offs_d[None, :] < HEAD_DIM)
    q = tl.load(
        q_ptr + row_off[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=io_mask,
        other=0.0,
    )  # [BLOCK_M, BLOCK_D]
    if PRESCALED:  # the scores come out of the QK dot in base-2 units
        q = (q.to(tl.float32) * qk_scale).to(k_cache_ptr.dtype.element_ty)
    elif not SCALED:  # a 16/32-bit cache: the dots run in its type
        q = q.to(k_cache_ptr.dtype.element_ty)
    elif not CONTIG and q.dtype != tl.float32 and k_cache_ptr.dtype.element_ty != tl.int8:
        q = q.to(tl.float16)  # e4m3 pages, 16-bit activations: fp16 dots (attention_tile_triton.py)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    k_head_off = kv_head * stride_kh
    v_head_off = kv_head * stride_vh
    s_head_off = kv_head * stride_sh
    first_pos = prefix + t0  # lowest query position of this tile: every row sees 0..first_pos
    kv_end = prefix + tl.minimum(t0 + BLOCK_Q, q_len)  # one past the highest query position
    if CONTIG:
        # The chunk's own positions [prefix, kv_end) come from the step's K/V rows (position p is row
        # q_start + p - prefix), tiles counted from `prefix`; the first holds position `prefix`, which every
        # row sees, so m_i is finite after it. Then the cached prefix [0, prefix) from the pages.
        row0 = (q_start - prefix).to(tl.int64)
        own_full = prefix + (t0 + 1) // BLOCK_N * BLOCK_N  # own tiles below this: visible to every row
        if split == 0:
            acc, l_i, m_i = attend_span(
                acc, l_i, m_i, q, q_pos, kr_ptr + row0 * stride_krt, vr_ptr + row0 * stride_vrt, bt_row,
                prefix, own_full, kv_end, qk_scale, kv_head * stride_krh, kv_head * stride_vrh, 0,
                stride_krt, 0, stride_vrt, k_scale_ptr, v_scale_ptr, s_head_off, stride_sb, stride_ss,
                HEAD_DIM, BLOCK_D, PAGE, BLOCK_N, False, True, PRESCALED, False, False, WIDEN_ASM,
            )  # fmt: skip
        if PREFIX:  # a separate compile: 16-bit prefix-free steps keep their registers (no spills)
            lo = split * part
            acc, l_i, m_i = attend_prefix(
                acc, l_i, m_i, q, q_pos, k_cache_ptr, v_cache_ptr, bt_row, lo, tl.minimum(lo + part, prefix),
                qk_scale, k_head_off,
                v_head_off, stride_kb, stride_ks, stride_vb, stride_vs, k_scale_ptr, v_scale_ptr,
                s_head_off, stride_sb, stride_ss, HEAD_DIM, BLOCK_D, PAGE, BLOCK_N, SCALED, PRESCALED,
                PAGES_AHEAD, V_TILE, WIDEN_ASM,
            )  # fmt: skip
    else:
        full_end = (first_pos + 1) // BLOCK_N * BLOCK_N  # tiles below this are visible to every row
        acc, l_i, m_i = attend_span(
            acc, l_i, m_i, q, q_pos, k_cache_ptr, v_cache_ptr, bt_row, 0, full_end, kv_end, qk_scale,
            k_head_off, v_head_off, stride_kb, stride_ks, stride_vb, stride_vs, k_scale_ptr, v_scale_ptr,
            s_head_off, stride_sb, stride_ss, HEAD_DIM, BLOCK_D, PAGE, BLOCK_N, SCALED, False, PRESCALED,
            PAGES_AHEAD, V_TILE, WIDEN_ASM,
        )  # fmt: skip

    o_ptrs = out_ptr + row_off[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
    if SPLIT_Q > 0:  # noqa: SIM102 (a constexpr branch around a runtime one)
        if n_split > 1:
            slot = (seq * TILES_Q + tile) * tl.num_programs(1 - tile_axis) + head_pid
            store_partial_or_merge(
                acc, l_i, m_i, ws_acc_ptr, ws_ml_ptr, counter_ptr, slot, split, n_split, prefix_splits,
                o_ptrs, io_mask, BLOCK_M, BLOCK_D,
            )  # fmt: skip
            return
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    tl.store(o_ptrs, (acc / l_safe[:, None]).to(out_ptr.dtype.element_ty), mask=io_mask)


def paged_prefill_attention_triton(
    q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
    k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
    v_cache: torch.Tensor,
    cu_seqlens_q: torch.Tensor,  # [num_seqs + 1] int32
    context_lens: torch.Tensor,  # [num_seqs] int32
    block_tables: torch.Tensor,  # [num_seqs, max_blocks] int32
    scale: float,
    *,
    max_q_len: int | None = None,
    config: PrefillConfig | None = None,
    k_scale: torch.Tensor | None = None,  # [num_blocks, block_size, num_kv_heads] fp32: 8-bit caches
    v_scale: torch.Tensor | None = None,
    step_kv: tuple[torch.Tensor, torch.Tensor] | None = None,  # each [num_tokens, num_kv_heads, head_dim]
    prefix_free: bool = False,
    out: torch.Tensor | None = None,  # like q (a slice of a larger output is fine): written, returned
    max_context_len: int | None = None,  # host bound on context_lens: lets step_kv launches split prefixes
) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
    """max_q_len sizes the per-sequence grid (PrefillConfig.flat_grid); without it the flat grid runs,
    which needs no host sync. step_kv: this step's K/V rows (token-aligned with q, in q's dtype), read
    for each chunk's own positions instead of the pages; positions before the chunk still come from the
    pages (dequantized, for 8-bit caches). prefix_free: no sequence has cached context (the caller's
    promise), so only step_kv is read (its own launch configuration). max_context_len: with step_kv and
    a prefix, short chunks after a long prefix split it over programs (prefill_split_triton.py)."""
    cfg = config or default_prefill_config(k_cache.dtype)
    num_tokens, num_heads, head_dim = q.shape
    page, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    num_seqs = cu_seqlens_q.shape[0] - 1
    out = torch.empty_like(q) if out is None else out
    if num_tokens == 0 or num_seqs == 0:
        return out
    group = num_heads // num_kv_heads
    group_pad = next_power_of_2(group) if cfg.gqa_pack else 1
    block_m = max(cfg.block_m, group_pad, 16)  # at least one whole group, and tl.dot needs M >= 16
    block_q = block_m // group_pad
    flat = use_flat_grid(cfg, num_tokens, num_seqs, max_q_len, block_q)
    heads_axis = num_kv_heads if cfg.gqa_pack else num_heads
    split_q = cfg.split_q if step_kv is not None and not prefix_free and cfg.split_q > 0 else 0
    block_d = next_power_of_2(head_dim)
    splits = 1
    ws: tuple[torch.Tensor, ...] = (q, q, cu_seqlens_q)  # unread without SPLIT_Q: nothing allocated
    if split_q:  # the variant that may split keeps one signature: float32 / int32 buffers every launch
        splits = plan_prefix_splits(cfg, max_context_len, num_seqs, heads_axis, block_m, block_q, block_d)
        ws = split_workspace(cfg, splits, num_seqs, heads_axis, block_m, block_q, block_d, q.device)
    flat = flat or splits > 1  # the partitions take the flat grid's axis 2
    if flat:  # sum over sequences of ceil(q_len / block_q) <= num_tokens / block_q + num_seqs
        tiles = triton.cdiv(num_tokens, block_q) + num_seqs
        grid = (heads_axis, tiles, splits) if cfg.heads_first else (tiles, heads_axis, splits)
    else:
        if max_q_len is None:
            max_q_len = int((cu_seqlens_q[1:] - cu_seqlens_q[:-1]).max().item())
        tiles = triton.cdiv(max_q_len, block_q)
        grid = (heads_axis, tiles, num_seqs) if cfg.heads_first else (tiles, heads_axis, num_seqs)
    k_rows, v_rows = step_kv or (q, q)  # without step_kv, q stands in for the unread row pointers
    _prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        cu_seqlens_q,
        context_lens,
        block_tables,
        scale * math.log2(math.e),
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        *k_cache.stride()[:3],
        *v_cache.stride()[:3],
        block_tables.stride(0),
        *_scale_args(k_cache, k_scale, v_scale),
        k_rows,
        v_rows,
        k_rows.stride(0),
        k_rows.stride(1),
        v_rows.stride(0),
        v_rows.stride(1),
        num_seqs,
        int(flat),
        *ws,
        splits,
        cfg.split_partition,
        GROUP=group,
        GROUP_PAD=group_pad,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        PAGE=page,
        BLOCK_M=block_m,
        BLOCK_Q=block_q,
        BLOCK_N=cfg.block_n,
        SCALED=k_scale is not None,
        BLOCK_SEQS=max(256, next_power_of_2(num_seqs)),  # one compile up to 256 sequences
        PACK=cfg.gqa_pack,
        CONTIG=step_kv is not None,
        PREFIX=not prefix_free,
        PRESCALED=cfg.fold_scale and k_scale is None,
        PAGES_AHEAD=cfg.pages_ahead and step_kv is None,
        HEADS_FIRST=cfg.heads_first,
        V_TILE=cfg.v_tile and k_scale is not None,
        WIDEN_ASM=q.device.type == "cuda",
        SPLIT_Q=split_q,
        TILES_Q=triton.cdiv(split_q, block_q) if split_q else 1,
        num_warps=cfg.num_warps,
        num_stages=cfg.step_kv_num_stages if step_kv is not None and prefix_free else cfg.num_stages,
    )
    return out
