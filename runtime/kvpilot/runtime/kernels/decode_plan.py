"""The split-KV plan of the paged decode kernels (host side, no device work): how many partitions each
sequence's context is cut into, chosen from the batch's shapes and the GPU's SM count so that enough
programs run (decode_attention_triton.py, verify_attention_triton.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .kv8_path import Kv8Path


@dataclass(frozen=True)
class TileShape:
    """How a kind of plan launches: context positions per tile, warps, software-pipeline stages."""

    block_n: int
    num_warps: int
    num_stages: int


@dataclass(frozen=True)
class MmaPath:
    """8-bit caches on CUDA sm_89+: the hand-laid-out mma.sync kernel (kv8_decode.cu) instead of the Triton
    ones, where it supports the shapes (kv8_decode_cuda.unsupported), with plans of its own (plan_mma).
    warps: warps per program, taking the partition's 16-position chunks in turn; prefetch: each warp loads
    its next chunk into registers before computing the current one (else only the next page id);
    min_blocks: programs per SM the register allocation must leave room for (and plan_mma's wave).
    Defaults, H200, Qwen3-8B heads (benchmarks/bench_kv8_mma.py, seventh session): 4 warps without the
    register prefetch at <= 128 registers (4 programs per SM): 64 x 4k e4m3 148.1 µs, int8 137.0 (1.67x /
    1.80x bf16's 247.1); 2 warps with prefetch 154.6 / 176.3, 8 warps 189.3 (141 registers: 1 per SM) /
    140.1. With the next page id loaded a chunk ahead and plan_mma: 135.1 / 132.7 (1.79x / 1.83x of 242.4,
    97% / 98% of 4.25 TB/s)."""

    warps: int = 4
    prefetch: bool = False
    min_blocks: int = 4
    split_plans: bool = True
    # fewer (sequence, KV head) pairs than this keep the Triton kernels (latency-bound batches, where they
    # were ~0.8 µs faster: H200, e4m3, 1 x 4k (8 pairs) 10.0 vs 10.8 µs, 2 x 2k (16) 9.0 vs 9.8; the mma
    # kernel won from 8 x 4k (64 pairs) on: 25.6 vs 36.7). 32 lies between the measured points.
    min_programs: int = 32

    def runs(self, num_seqs: int, num_kv_heads: int) -> bool:
        """Whether a batch of this many (sequence, KV head) pairs takes the mma kernel."""
        return num_seqs * num_kv_heads >= self.min_programs


@dataclass(frozen=True)
class DecodeConfig:
    """Launch parameters. Defaults (from sm_90 compiles, see compile_check.py): ~128 registers at 4 warps
    -> 4 programs per SM, each with one 32 KB K+V tile in flight (Triton pipelines the tile loads one
    iteration ahead with cp.async), i.e. ~128 KB in flight per SM, a few times what Little's law asks
    for at 4.25 TB/s. benchmarks/bench_kernels.py --sweep measures the alternatives on the GPU."""

    block_n: int = 64  # context positions per tile; any power of two >= 16 (pages are gathered per position)
    num_warps: int = 4
    num_stages: int = 2
    # fewest context positions a split-KV program handles. 64 (one tile): H200, one sequence of 1,152
    # positions (W3's decode), 7.97 µs per call vs 9.72 at 128; 1 x 4k, 4 x 2k, 16 x 1k, 32 x 512 within
    # 1% (benchmarks/bench_decode_latency.py, BENCHMARKS.md, sixth session)
    min_partition: int = 64
    # single pass once num_seqs * num_kv_heads >= single_pass_waves * SMs; else split to ~split_waves * SMs
    single_pass_waves: float = 2.0
    split_waves: float = 4.0
    # pages_ahead: plans for batches that do not fill the GPU load each tile's block-table entries one
    # tile ahead (carried in registers), so the K/V loads wait on no table load and Triton double-buffers
    # them from ahead_num_stages = 3 (compile_check: 72 KB of shared memory, 168 registers at 4 warps; the
    # table-indexed loads need 5 stages otherwise). From ahead_single_pass_waves * SMs (seq, KV head)
    # pairs one such pass per pair, with fewer the split count of _ahead_plan. H200, 3 repeats
    # (benchmarks/sweep_attention2.py, BENCHMARKS.md): 32 x 512 20.5 µs (77.8% of 4.25 TB/s) vs 26.7 for
    # 3 splits of 192 at 2 stages; 8 x 4k 38.1 (83.1%) vs 39.3 at 5 stages; 16 x 8k 128.0 (98.7%) vs
    # 145.2 for 5 short splits; 24 x 4k 100.1 vs 118.9. Batches that fill the GPU keep the 2-stage pass
    # (64 x 4k: 248 µs, 102%, vs 295 ahead at 3 stages: the deeper pipeline costs programs per SM).
    pages_ahead: bool = True
    ahead_num_stages: int = 3
    ahead_single_pass_waves: float = 1.0
    # ~long_split_waves programs per SM with partitions of >= long_partition positions: _ahead_plan with
    # pages_ahead; without it, only where split_waves would cut contexts into shorter partitions, at
    # long_num_stages (Triton double-buffers the block-table-indexed K/V tiles from 5 stages on: 8 x 4k
    # 39.4 µs vs 47.2 for 8 splits of 512 at 2 stages).
    long_split_waves: float = 2.0
    long_partition: int = 1024
    long_num_stages: int = 5
    # Split partitions adapt at run time to each sequence's real context (ceil(ctx / num_splits) rounded
    # up to block_n, at least the plan's partition_size): a CUDA graph captured for a wide block table
    # (GRAPH_MAX_CONTEXT) then spreads a short context over all its splits instead of one. False: the
    # partition is fixed from the block-table width, as before.
    adaptive_partitions: bool = True
    # 8-bit caches only. qk_dot: "widen" converts every K element to the 16-bit dot type; "native" runs
    # the QK dot on 8-bit operands, q quantized per row in-kernel (int8: int8 tensor-core dots).
    # v_widen: "operand" leaves the V widening to Triton, which gathers the transposed 8-bit operand
    # bytewise from shared memory; "tile" widens V in its vectorized load layout by inline PTX, then
    # ldmatrix.trans (attention_tile_triton.py). On the H200 at 64 x 4k neither alternative was faster:
    # fp8 251.5 µs (operand) vs 265.5 (tile); int8 226.9 (operand) vs 244.0 (tile), 227.6 (tile + native
    # QK), so the defaults stay "widen"/"operand" (BENCHMARKS.md, 8-bit decode).
    qk_dot: str = "widen"
    v_widen: str = "operand"
    # 8-bit caches only: not None -> the 8-bit decode kernel (kv8_decode_triton.py) with this tile path;
    # qk_dot and v_widen then do not apply. None: the shared kernel above.
    kv8: Kv8Path | None = None
    # not None: plans of one pass per (sequence, KV head) for batches that fill the GPU launch with this
    # tile shape instead of block_n / num_warps / num_stages (8-bit caches: EIGHT_BIT_DECODE)
    single_pass: TileShape | None = None
    # ... and from dense_waves * SMs (sequence, KV head) pairs on, this one (EIGHT_BIT_DECODE: 1 warp)
    dense_pass: TileShape | None = None
    dense_waves: float = 6.0
    # 8-bit caches on CUDA: not None -> kv8_decode.cu's mma kernel where it runs (plans and outputs unchanged)
    mma: MmaPath | None = None
    # programmatic dependent launch on sm_90+ (triton_utils.pdl_supported): the kernel launches while its
    # predecessor drains and waits for it before reading anything
    pdl: bool = True

    def __post_init__(self) -> None:
        modes = {"qk_dot": ("widen", "native"), "v_widen": ("tile", "operand")}
        for name, allowed in modes.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"DecodeConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.block_n < 16 or self.block_n & (self.block_n - 1):
            raise ValueError(f"DecodeConfig.block_n must be a power of two >= 16, got {self.block_n}")


# An 8-bit tile of 128 positions is as many bytes as a 16-bit tile of 64: the same bytes in flight per
# program, half the tiles per sequence. The long-partition plans were measured for 16-bit caches only
# (8-bit tiles at 5 stages were slower at 64 x 4k), so 8-bit caches keep the short plans.
# Batches that fill the GPU (one pass per sequence and KV head) run tiles of 64 positions at 2 warps:
# H200 (benchmarks/sweep_kv8.py --set warps/w2, sixth session), e4m3 at 3 stages: 64 x 4k 213.3 µs
# (1.16x bf16) vs 251.1 (0.99x) at 128 x 4 warps; 256 x 512 112.3 (1.18x) vs 136.5 (0.97x). Split plans
# keep 128 x 4 warps (at 2 warps 16 x 8k was 0.75-0.80x bf16, 1 x 4k 0.97x, against 0.96x / 1.15x).
# From 6 programs per SM on (dense_waves), one warp per program with 32-position tiles: 256 x 512 (15.5
# per SM, W2's decode) 94.8 µs (1.40x bf16) vs 112.3 at 2 warps (64 positions at 1 warp: 94.5, but 400
# bytes of spills in the sm_90 compile against 16); 128 x 1k (7.8 per SM) 91.9 vs 108.8; at 64 x 4k (3.9
# per SM) 1 warp lost (249.3 vs 213.3). The threshold lies between those two measured points.
# On CUDA sm_89+ both 8-bit configs hand batches of >= 32 (sequence, KV head) pairs to kv8_decode.cu (mma=);
# the Triton tile shapes below serve the rest (small batches, the CPU, shapes the CUDA kernel does not take).
EIGHT_BIT_DECODE = DecodeConfig(
    block_n=128,
    min_partition=128,
    long_split_waves=0.0,
    pages_ahead=False,
    single_pass=TileShape(block_n=64, num_warps=2, num_stages=3),
    dense_pass=TileShape(block_n=32, num_warps=1, num_stages=2),
    mma=MmaPath(),
)
# int8 caches: the kv8 kernel (kv8_decode_triton.py) with q quantized per row to int8 for an int8 x int8
# QK dot (K never widened; q's rounding: at most 0.4% of its row maximum per element) and V widened by
# the 0x6400 magic number in its load layout. H200, 64 x 4k (benchmarks/sweep_kv8.py): 213.8 µs vs
# 227.5 for EIGHT_BIT_DECODE. e4m3 caches keep EIGHT_BIT_DECODE (exact): the kv8 kernel's exact paths
# were slower there, and its native e4m3 QK dot (q rounded to e4m3, ~10% faster) costs perplexity
# (SmolLM2, emulated: +1.03% vs a bf16 cache where the fp8 cache alone is +0.66%).
# Split-KV plans (few sequences) keep the shared kernel: the kv8 kernel was not measured faster there.
# Its single-pass plans at 64 positions x 2 warps x 2 stages: 64 x 4k 193.5 µs (1.28x bf16) vs 214.4
# (1.16x); 256 x 512 105.8 (1.26x) vs 119.1 (1.11x) (sweep_kv8.py --set warps, sixth session).
INT8_DECODE = DecodeConfig(
    block_n=128,
    min_partition=128,
    long_split_waves=0.0,
    pages_ahead=False,
    kv8=Kv8Path(cvt="ptx", qk="native", split_plans=False),
    single_pass=TileShape(block_n=64, num_warps=2, num_stages=2),
    mma=MmaPath(),
)


def default_decode_config(cache_dtype: torch.dtype) -> DecodeConfig:
    """The launch defaults for a cache of this dtype (keeps the bytes per tile of the 16-bit default)."""
    if cache_dtype == torch.int8:
        return INT8_DECODE
    return EIGHT_BIT_DECODE if cache_dtype.itemsize == 1 else DecodeConfig()


@dataclass(frozen=True)
class DecodePlan:
    """num_splits partitions per (sequence, KV head). A sequence with context ctx is cut into partitions
    of partition_for(ctx) = max(partition_size, ceil(ctx / num_splits) rounded up to block_n) positions
    (the kernels compute this on the device), so the plan always covers any context; partitions past the
    context are skipped."""

    num_splits: int
    partition_size: int  # the fewest context positions per split, a multiple of block_n
    num_stages: int | None = None  # the launch's software-pipeline depth; None: DecodeConfig.num_stages
    pages_ahead: bool = False  # block-table entries loaded a tile ahead (DecodeConfig.pages_ahead)
    block_n: int | None = None  # None: DecodeConfig.block_n (single_pass / dense_pass set these two)
    num_warps: int | None = None  # None: DecodeConfig.num_warps


def plan_decode(
    num_seqs: int, num_kv_heads: int, max_context_len: int, sms: int, config: DecodeConfig
) -> DecodePlan:
    """Pure choice of the split count: a pass per (seq, kv head) when that fills the GPU, else split."""
    bn = config.block_n
    programs = num_seqs * num_kv_heads
    fills = programs >= config.single_pass_waves * sms
    if fills and config.single_pass is not None:
        tile = config.single_pass
        if config.dense_pass is not None and programs >= config.dense_waves * sms:
            tile = config.dense_pass
        partition = max(tile.block_n, _cdiv(max_context_len, tile.block_n) * tile.block_n)
        return DecodePlan(1, partition, tile.num_stages, block_n=tile.block_n, num_warps=tile.num_warps)
    if fills or max_context_len <= config.min_partition:
        return DecodePlan(1, max(bn, _cdiv(max_context_len, bn) * bn))
    if config.pages_ahead:
        ahead = _ahead_plan(programs, max_context_len, sms, config)
        if ahead is not None:
            return ahead
    want = math.ceil(config.split_waves * sms / max(programs, 1))
    splits = max(1, min(want, _cdiv(max_context_len, config.min_partition)))
    stages = None
    if _split_partition(max_context_len, splits, bn) < config.long_partition:
        long_splits = math.floor(config.long_split_waves * sms / max(programs, 1))
        if long_splits > 1 and _split_partition(max_context_len, long_splits, bn) >= config.long_partition:
            splits, stages = long_splits, config.long_num_stages
    return _split_plan(max_context_len, splits, stages, config)


# kv8_decode.cu's split partitions hold at least this many positions (8 of its 16-position chunks)
MMA_MIN_PARTITION = 128


def plan_mma(num_seqs: int, num_kv_heads: int, max_context_len: int, sms: int, mma: MmaPath) -> DecodePlan:
    """kv8_decode.cu's plan: one pass per (sequence, KV head) once the programs fill one wave of
    mma.min_blocks per SM; below that each context is split so the programs fill that one wave (a second,
    partial wave would leave most SMs idle behind it), in partitions of at least MMA_MIN_PARTITION
    positions, sized per sequence on the device (adaptive, in 16-position chunks)."""
    programs = max(1, num_seqs * num_kv_heads)
    splits = max(1, min(mma.min_blocks * sms // programs, _cdiv(max_context_len, MMA_MIN_PARTITION)))
    if splits == 1 or not mma.split_plans:
        return DecodePlan(1, _cdiv(max_context_len, 16) * 16, block_n=16)
    return DecodePlan(splits, MMA_MIN_PARTITION, block_n=16)


def _ahead_plan(programs: int, max_context_len: int, sms: int, config: DecodeConfig) -> DecodePlan | None:
    """~long_split_waves programs per SM, pipelined by pages_ahead: of the two split counts nearest to
    that, the one whose busiest SM streams the fewest positions (ceil(programs * splits / SMs) / splits;
    ties: fewer splits, fewer partials), partitions of at least long_partition positions. None where
    that leaves fewer than ahead_single_pass_waves * SMs programs (tiny batches: the short plan's many
    short partitions)."""
    x = config.long_split_waves * sms / programs
    candidates = {max(1, math.floor(x)), max(1, math.ceil(x))}
    splits = min(candidates, key=lambda s: (_cdiv(programs * s, sms) / s, s))
    splits = max(1, min(splits, max_context_len // config.long_partition))
    if programs * splits < config.ahead_single_pass_waves * sms:
        return None
    if splits == 1:
        bn = config.block_n
        return DecodePlan(1, _cdiv(max_context_len, bn) * bn, config.ahead_num_stages, pages_ahead=True)
    return _split_plan(max_context_len, splits, config.ahead_num_stages, config, pages_ahead=True)


def _split_plan(
    max_context_len: int, splits: int, stages: int | None, config: DecodeConfig, pages_ahead: bool = False
) -> DecodePlan:
    bn = config.block_n
    partition = _split_partition(max_context_len, splits, bn)
    splits = _cdiv(max_context_len, partition)
    if config.adaptive_partitions:  # the kernels size each sequence's partitions from its own context
        partition = min(partition, _cdiv(config.min_partition, bn) * bn)
    return DecodePlan(splits, partition, stages, pages_ahead)


def _split_partition(max_context_len: int, splits: int, block_n: int) -> int:
    """ceil(max_context_len / splits) rounded up to whole tiles."""
    return _cdiv(_cdiv(max_context_len, splits), block_n) * block_n


def partition_for(ctx: int, plan: DecodePlan, block_n: int) -> int:
    """Host mirror of the kernels' per-sequence partition size (_partition_for)."""
    return max(plan.partition_size, _cdiv(_cdiv(ctx, plan.num_splits), block_n) * block_n)


REDUCE_NARROW, REDUCE_WIDE = 16, 64


def reduce_block_s(num_splits: int) -> int:
    """The split-KV reduce kernel's BLOCK_S, the partials it merges per pass: 16 up to 16 splits, else 64
    (past 64 in several passes). Two builds serve every plan. Mixed steps run the decode kernel eagerly
    with plans of their own (narrower tables, fewer or more splits than any captured graph's), and a
    BLOCK_S per power of two compiled 2, 4 or 8 while serving, then 16 with the 8-bit Triton tile and 128+
    past the graphs' context (tests/runtime/test_no_recompile_gpu.py; test_decode_reduce_builds.py checks that
    the captured plans reach both builds)."""
    return REDUCE_NARROW if num_splits <= REDUCE_NARROW else REDUCE_WIDE


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)
