"""The prefill kernel's launch configuration and grid policy (host side, no device work):
prefill_attention_triton.py."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PrefillConfig:
    # H200 (benchmarks/sweep_attention.py, BENCHMARKS.md): 64-row tiles at 4 warps beat 128 x 64 at 8
    # warps on 1 x 1024 causal (44.1 vs 49.8 µs; SDPA 32.4) and on a W1 mixed step (277.5 vs 441.2 µs);
    # 128 x 128, 64 x 32 and 5 stages were slower. Issue 16 (sweep_attention2.py, 1 x 1024, 3 repeats):
    # heads_first 38.3 µs vs 49.5; no GQA packing, 8 warps at 64 rows, the scale folded into q (249
    # registers) were no faster.
    block_m: int = 64  # query rows (tokens x heads of one group) per program
    block_n: int = 64  # context positions per tile
    num_warps: int = 4
    num_stages: int = 2
    # step_kv (the step's contiguous K/V rows, no block table): the loads are direct, so 3 stages
    # double-buffer them ahead: 1 x 1024 30.7 µs (s2: 31.3; paged 38.3; torch SDPA 31.9).
    step_kv_num_stages: int = 3
    # Grid over the (sequence, query tile) pairs that exist, found on the device from cu_seqlens_q, rather
    # than sequences x the longest chunk's tiles (a W1 mixed step of 8 chunks of ~1k tokens and 128
    # decode rows: 383 programs per KV head instead of 4352, ~4000 of them empty). None: flat when the
    # per-sequence grid would be more than twice as large, or when max_q_len is not given (it needs no
    # host sync); True/False force it.
    flat_grid: bool | None = None
    # gqa_pack: a program's rows are BLOCK_Q tokens x the GROUP heads of one KV head (K/V tiles loaded
    # once per group) rather than BLOCK_M tokens of one head. fold_scale: q is multiplied by softmax
    # scale * log2(e) once (rounded to the dot type) instead of every [BLOCK_M, BLOCK_N] score tile.
    gqa_pack: bool = True
    fold_scale: bool = False
    # pages_ahead: the next tile's block-table entries are loaded while the current tile is processed
    # (as DecodeConfig.pages_ahead), so from 3 stages the K/V loads are double-buffered ahead instead of
    # issued after the previous tile's dots and waited for at once (compile_check's TTGIR: async_wait
    # num=2 instead of 0). Slower here (1 x 1024: 40.7 µs with heads_first vs 38.3 without; 115 KB of
    # shared memory per program); only 128-row tiles at 8 warps gained (35.7), untested on other shapes.
    pages_ahead: bool = False
    # heads_first: grid axis 0 is the head (axis 1 the query tile), so the hardware, which issues
    # programs axis 0 fastest, starts the longest tiles of every head before any shorter one (longest
    # processing time first). With axis 0 the tile, head 0's short tiles start before head 7's long ones,
    # which then finish last: at 1 x 1024 (512 programs, 2 per SM) a list-scheduling model gives a
    # makespan of 26 tile-times against 17 (the longest program is 16); measured 49.5 -> 38.3 µs.
    heads_first: bool = True
    # v_tile (8-bit caches): widen V in its load layout by inline PTX (attention_tile_triton's V_TILE)
    # instead of leaving the widening to Triton, which gathers the transposed 8-bit P.V operand from
    # shared memory one byte at a time.
    v_tile: bool = False
    # Split-KV over the cached prefix of short chunks (prefill_split_triton.py), step_kv launches over a
    # prefix only: a chunk of at most split_q tokens whose prefix holds >= 2 partitions of split_partition
    # positions is cut into up to max_prefix_splits partitions, attended in parallel and merged. The
    # workspace a launch may take (split_workspace_bytes) bounds the partition count; 0 split_q: off.
    split_q: int = 64
    split_partition: int = 512
    max_prefix_splits: int = 16
    split_workspace_bytes: int = 64 << 20


# 8-bit pages: the same configuration. H200 (benchmarks/sweep_prefill_kv8.py, paged, no step K/V):
# heads_first 1 x 1024 int8 58.5 vs 76.3 µs, fp8 65.1 vs 88.0; an 8k prompt within 1-2% either way;
# v_tile, 3 stages, 32-position or 128-row tiles were slower.
EIGHT_BIT_PREFILL = PrefillConfig()


def default_prefill_config(cache_dtype: torch.dtype) -> PrefillConfig:
    return EIGHT_BIT_PREFILL if cache_dtype.itemsize == 1 else PrefillConfig()


def use_flat_grid(
    cfg: PrefillConfig, num_tokens: int, num_seqs: int, max_q_len: int | None, block_q: int
) -> bool:
    """PrefillConfig.flat_grid's policy: forced, or flat when max_q_len is unknown or the per-sequence
    grid (num_seqs x the longest chunk's tiles) would be over twice the flat one's bound."""
    if cfg.flat_grid is not None:
        return cfg.flat_grid
    flat_tiles = _cdiv(num_tokens, block_q) + num_seqs
    return max_q_len is None or _cdiv(max_q_len, block_q) * num_seqs > 2 * flat_tiles


def plan_prefix_splits(
    cfg: PrefillConfig,
    max_context_len: int | None,
    num_seqs: int,
    heads_axis: int,
    block_m: int,
    block_q: int,
    block_d: int,
) -> int:
    """The most partitions any chunk's prefix of this launch may be cut into (1: no split; a split launch
    takes the flat grid, whose axis 2 holds the partitions). Only with a known max_context_len (a host
    value) long enough for two partitions, and only as far as the workspace fits split_workspace_bytes:
    one slot per
    (sequence, query tile of a split-size chunk, head of the grid) and partition, BLOCK_M x (BLOCK_D + 2)
    float32 each."""
    if cfg.split_q <= 0 or max_context_len is None:
        return 1
    splits = min(cfg.max_prefix_splits, max_context_len // cfg.split_partition)
    per_split = split_slots(cfg, num_seqs, heads_axis, block_q) * block_m * (block_d + 2) * 4
    splits = min(splits, cfg.split_workspace_bytes // per_split)
    return splits if splits >= 2 else 1


def split_slots(cfg: PrefillConfig, num_seqs: int, heads_axis: int, block_q: int) -> int:
    """Workspace slots of a splitting launch: a chunk of <= split_q tokens has <= split_q / block_q tiles."""
    return num_seqs * _cdiv(cfg.split_q, block_q) * heads_axis


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)
