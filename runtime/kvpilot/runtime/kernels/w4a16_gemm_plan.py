"""The launch rule of w4a16_gemm.cu (the int4 / int8 GEMM; host side in w4a16_gemm_cuda.py), pure Python:
which build (GemmSpec: warps, token tiles, stages, cluster use, biased / WGMMA mmas, groups per tile, offsets,
bits) and grid a GEMM of M tokens and a [K, N] weight takes, and where the dispatch prefers it. The GPU enters
only through `held` (how many clusters of a build it holds at once), passed in by the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

TILE = 128  # K rows per tile (quant_reference.pack_tile of every real layer)
SMALL_GROUPS = (32, 64)  # groups below a tile this kernel takes (AWQ / GPTQ g32 / g64, GGUF grids kept at 32)
COLS_PER_WARP = 32
MAX_TOKEN_TILES = 8  # 8 tokens each: a CTA takes up to 64 tokens, grid.z the rest
MAX_CLUSTER = 8  # the portable cluster size
# A long K (>= 64 tiles: a down projection) at 33-64 tokens in one token block splits into slices of
# LONG_K_SLICE_TILES, up to a non-portable cluster of 16: Qwen3-8B's down (96 tiles) at 64 tokens took
# 29.3-29.5 us with 16 slices against 32.3-32.4 with 8 (12: 31.5), at 40-48 0.3-0.6 us less; at 80-96 tokens
# (two token blocks) and for the 32-tile layers more slices were slower (H200, twelfth session). int8 keeps
# portable clusters: at 3 CTAs an SM its 16-slice launch (512 CTAs) took two waves (21 of 32 clusters held),
# and down at 40 / 48 / 64 tokens took 30.8 / 31.8 / 34.9 us with 16 slices against 30.2 / 30.4 / 30.8 with
# 8 in groups of 128 (per channel 29.7 / 30.5 / 33.6 against 29.8 / 29.7 / 29.9; H100, twenty-fifth session).
LONG_K_TILES = 64
LONG_K_SLICE_TILES = 6
MAX_NON_PORTABLE_CLUSTER = 16
WARPS = 4
# 8 warps (256 columns a CTA) for mid-width outputs at <= 16 tokens: Qwen3-8B's qkv (6144 columns, 48
# blocks of 128) took 8.2 / 8.3 / 9.3 / 9.5 us at 5 / 8 / 12 / 16 tokens against 9.1 / 9.4 / 10.3 / 10.5
# with 4 warps (biased builds, H200, twelfth session); o and down (32 blocks) and gate_up (192) were slower
# with 8.
WIDE_WARPS = 8
WIDE_BLOCKS = (40, 64)  # N / 128 where WIDE_WARPS were measured faster
STAGES = 0  # 0: as many as fit STAGE_BUDGET (3 at 64 tokens, 4 at 32, 6 at 16)
# Bytes of dynamic shared memory per CTA (the stages, and a WGMMA build's 1 KB to align them) for 3 CTAs per
# SM: sm_90's 228 KB an SM less the 1 KB the GPU reserves per CTA. At 76 KB (before) the WGMMA builds of
# groups of 64 took 3 stages and 77,824 bytes, and only 2 CTAs an SM (held clusters 132, not 198).
STAGE_BUDGET = 75 * 1024
WGMMA_PAD = 1024
MAX_STAGES = 6
# K slices per column block until the GPU holds ~this many CTAs per SM: at 16 tokens on the H200, qkv
# took 10.7 us with 6 slices (288 CTAs) against 12.0 with 8 (384), o 7.8 with 8 (256) against 10.5 with 6
# (192), gate_up 24.1 with 2 (384) against 31.6 with 3 and 35.9 with 8 (eleventh session, sweep5)
CTAS_PER_SM = 2.2
MIN_SLICE_TILES = 2  # a slice shorter than this spends more on its fixup than on its tiles
BIASED_MAX_TOKEN_TILES = 2  # up to 16 tokens a CTA the mmas take 128 + q (its fp32 correction costs per sum)
# Biased builds without offsets take GemmSpec.scale_after (q - z in the mmas, no x sums): H100, µs at 5 / 8 /
# 12 / 16 tokens against the x-sum build, same call (twenty-sixth session): o 6.7 / 6.7 / 7.2 / 7.3 -> 6.4 /
# 6.4 / 7.0 / 7.2, gate_up 20.9 / 21.0 / 23.4 / 23.1 -> 20.3 / 20.5 / 22.6 / 22.6, down 14.9 / 15.0 / 17.0 /
# 17.1 -> 14.8 / 14.8 / 16.4 / 16.5, qkv 8.2 / 8.2 / 9.3 / 9.5 -> 8.1 / 8.2 / 9.3 / 9.5.
SCALE_AFTER = True
# 25-64 tokens (4-8 token tiles) below a long K: one stage more than STAGE_BUDGET's (4 at 33-64, 5 at 25-32),
# and the most slices (at least DEEP_MIN_SLICES) whose clusters the GPU holds in one wave (held: it counts
# GPC fragmentation, cuOccupancyMaxActiveClusters). Qwen3-8B's qkv took 13.1 / 14.2 / 16.4 / 16.2 us at 40 /
# 48 / 56 / 64 tokens with 4 slices (62 clusters held, 48 needed) against 14.6 / 15.8 / 18.2 / 17.9 with the
# budget's 3 stages and 6 slices, and 11.5 against 12.8 at 32; o 10.7 / 11.6 / 12.9 / 12.9 with 7 (32 held,
# 32 needed) against 11.3 / 12.3 / 13.8 / 13.9 with 8, and 10.0 against 9.9 at 32. A split past one wave
# lost (qkv: 6 slices at 4 stages, 21.2 us at 64), so did 5 stages at 24 tokens (o 9.5 against 8.9), and
# gate_up (192 blocks) has no such split of 4+ slices: it keeps 2 slices of 3 stages (H200, fourteenth
# session).
DEEP_MIN_TOKEN_TILES = 4  # of the real tokens (17-24 padded to 32 for WGMMA stay on the budget's stages)
DEEP_MIN_SLICES = 4
# sm_90: from WGMMA_FIRST_TOKEN_TILES token tiles a CTA takes 32 or 64 tokens (rows past M zero-filled) on
# warpgroup mmas (w4a16_gemm_wgmma.cuh; 16-token CTAs are for the sweep). Qwen3-8B, µs WGMMA vs mma.sync
# at 32 / 48 / 64 / 128 tokens (H200, sixteenth session): qkv 10.4 / 12.5 / 13.7 / 22.4 against 11.7 / 14.6 /
# 16.9 / 31.5; o 9.1 / 10.9 / 11.7 / 16.3 against 10.1 / 11.9 / 13.4 / 21.6; gate_up 23.7 / 32.4 / 31.8 / 52.6
# against 29.5 / 38.1 / 44.8 / 80.3; down 18.1 / 24.8 / 28.8 / 36.9 against 22.1 / 27.0 / 31.0 / 52.4. At 17
# tokens gate_up and down gained, o lost 0.3 (8.5 against 8.2); at 12-16 tokens 16-token CTAs lost to the
# biased mma.sync builds (qkv 13.8-14.1 against 8.9-9.1).
WGMMA_FIRST_TOKEN_TILES = 3
# 9-16 tokens take 16-token WGMMA CTAs with GemmSpec.scale_after (sixteen_token_wgmma) where K slices are
# at least this many tiles long (the tensor cores' gain over mma.sync grows with the K loop, their fixed cost
# does not) or where the output takes WIDE_WARPS. H100, µs at 9 / 12 / 16 tokens against the biased mma.sync
# build, same call, two rounds alike (twenty-seventh session): gate_up (2 slices of 16 tiles) 22.6 / 22.6 /
# 22.5 -> 21.8 / 21.9 / 21.9, down (8 of 12) 16.4 / 16.5 / 16.5 -> 15.9 / 16.0 / 16.2, qkv in 8 warps (8 of
# 4) 9.1 / 9.2 / 9.5 -> 8.8 / 8.9 / 9.2 (in 4 warps and 6 slices 9.5 / 9.6 at 12 / 16: a tie). o
# (4 warps, 8 slices of 4) lost: 7.0 / 7.1 -> 7.3 / 7.4 at 12 / 16, in 8 warps 9.0 at 16; so did 5-8 tokens
# padded to 16 (gate_up 20.2 -> 21.4, down 14.7 -> 15.7-15.9, qkv 8.1-8.2 -> 8.7-8.8 in 8 warps).
WGMMA_16_SLICE_TILES = 8
WGMMA_TOKEN_TILES = (2, 4, 8, 16)
# 128 tokens a CTA (m64n128k16: 128 fp32 sums a thread, 236 registers) where max_token_tiles asks for it:
# the sweep's (tt=16), not dispatched. H100, seventeenth session, µs at 512 / 1024 tokens against 64-token
# CTAs and dequantize + cuBLAS: o 33.3 / 56.7 against 49.7 / 90.3 and 36.4 / 56.8, gate_up 177.6 / 390.5
# against 214.1 / 459.7 and 233.2 / 362.3, down 88.8 / 168.9 against 153.6 / 271.5 and 112.8 / 171.4, but qkv
# 67.4 / 111.4 against 51.3 / 112.1 and 56.3 / 87.9; slower than 64-token CTAs at 129-384 tokens everywhere.
WGMMA_MAX_TOKEN_TILES = 16
# int8 WGMMA builds at 64 tokens a CTA wait for their wgmmas every 2 or 4 k-steps where that takes them to 3
# CTAs an SM (int8_wait_steps): int8 groups of 32 then take 157 registers against 182.
# H100, µs without -> with, groups of 32 (twenty-fourth session): at 40 tokens gate_up 65.9 -> 44.6, down
# 42.8 -> 33.4 (qkv, o tie); the layer's four at 64 tokens 138.3 -> 115.6, at 128 259.3 -> 175.9, at 256
# 338.4 -> 311.1 (o and down lost 1.5 / 5.5 there); groups of 64 gained or tied in every layer at 40-256.
# It lost where a CTA takes 32 tokens (groups of 32: 98.1 -> 108.8 over the layer) and for int4 (groups of
# 32 at 64 tokens: gate_up 34.7 -> 42.6). Per channel and groups of 128 (twenty-fifth session, H100):
# one-slice gate_up at 96 / 128 / 256 tokens 111.3 / 103.9 / 154.8 -> 71.7 / 70.0 / 140.9 per channel; in
# groups of 128 the layer's four at 48 / 64 / 128 / 256 tokens 133.6 / 136.2 / 247.6 / 341.4 -> 101.8 / 106.6
# / 163.6 / 286.8 (their clustered builds waiting every 2 instead of 4 tied within 1 us).
INT8_WAIT_TOKEN_TILES = 8
Held = Callable[["GemmSpec", int], int]  # clusters of (build, slices) the GPU holds at once


@dataclass(frozen=True)
class GemmSpec:
    """The compile-time constants of one w4a16_gemm.cu build."""

    warps: int
    token_tiles: int  # 8 tokens each, 1..8
    tiles_per_group: int
    stages: int = 3
    cluster_reduce: bool = False
    biased: bool = False  # the mmas take 128 + q, each tile's sums corrected in fp32 (w4a16_gemm.cu)
    wgmma: bool = False  # sm_90a: the K tile on warpgroup mmas (w4a16_gemm_wgmma.cuh)
    groups_per_tile: int = 1  # 128 / G for groups of 32 or 64 rows (tiles_per_group 1)
    offsets: bool = False  # a bf16 offset per group and column added to the weight (a GGUF grid's zero)
    bits: int = 4  # 8: int8 words (w8a16_dequant.cuh), dequantizing builds only
    # WGMMA: every wait_steps k-steps (2 or 4) the wgmmas issued are committed and all but the newest group
    # awaited, so the A registers of the steps before free early (0: one wait a tile; INT8_WAIT_TOKEN_TILES)
    wait_steps: int = 0
    # the mmas take q - z exactly and each group's sums are scaled in fp32 (unscaled_mmas): in biased
    # builds in place of 128 + q corrected by x sums (a ones-mma a token tile and k-step), in WGMMA builds
    # at 16 tokens in place of dequantized pairs (two FMAs a pair, not one)
    scale_after: bool = False

    @property
    def block_n(self) -> int:
        return COLS_PER_WARP * self.warps

    @property
    def block_m(self) -> int:
        return 8 * self.token_tiles

    def macros(self) -> dict[str, int]:
        return {
            "WARPS": self.warps,
            "NT": self.token_tiles,
            "TILES_PER_GROUP": self.tiles_per_group,
            "STAGES": self.stages,
            "CLUSTER_REDUCE": int(self.cluster_reduce),
            "BIASED": int(self.biased),
            "WGMMA": int(self.wgmma),
            "GROUPS_PER_TILE": self.groups_per_tile,
            "OFFSETS": int(self.offsets),
            "BITS": self.bits,
            "WGMMA_WAIT_STEPS": self.wait_steps,
            "SCALE_AFTER": int(self.scale_after),
        }

    def shared_bytes(self) -> int:
        """Dynamic shared memory: the stages, or the split sums ([BM][BN + 4] fp32) where those are larger;
        WGMMA builds take 1 KB more, to start the stages' x on a 1 KB boundary."""
        one = stage_bytes(self.warps, self.token_tiles, self.groups_per_tile, self.offsets, self.bits)
        stages = self.stages * one
        return max(stages, self.block_m * (self.block_n + 4) * 4) + (WGMMA_PAD if self.wgmma else 0)


def stage_bytes(
    warps: int, token_tiles: int, groups_per_tile: int = 1, offsets: bool = False, bits: int = 4
) -> int:
    """One K tile in shared memory: x rows for whole token-tile pairs, the weight words (TILE rows of bits
    each), the scales and zeros (and offsets) of each group in the tile."""
    block_n = COLS_PER_WARP * warps
    group_bytes = (6 if offsets else 4) * block_n * groups_per_tile
    return 16 * -(-token_tiles // 2) * TILE * 2 + block_n * TILE * bits // 8 + group_bytes


@dataclass(frozen=True)
class GemmLaunch:
    """One GEMM's launch: the build, and grid (N / BN, slices, token blocks)."""

    spec: GemmSpec
    slices: int
    token_blocks: int

    def grid(self, n: int) -> tuple[int, int, int]:
        return (n // self.spec.block_n, self.slices, self.token_blocks)

    def sliced(self, slices: int) -> GemmLaunch:
        """This launch with K split in this many slices (meeting in a cluster past one)."""
        return replace(self, slices=slices, spec=replace(self.spec, cluster_reduce=slices > 1))


def launch_for(
    m: int,
    n: int,
    k: int,
    group: int,
    sms: int,
    hopper: bool,
    warps: int = 0,
    stages: int = STAGES,
    ctas_per_sm: float = CTAS_PER_SM,
    max_token_tiles: int = MAX_TOKEN_TILES,
    biased_max_token_tiles: int = BIASED_MAX_TOKEN_TILES,
    held: Held | None = None,
    wgmma_from: int = 0,
    offsets: bool = False,
    bits: int = 4,
    scale_after: bool = SCALE_AFTER,
) -> GemmLaunch:
    """Token tiles to cover M (at most 64 tokens per CTA; balanced over the token blocks), the warps (0:
    WARPS, or WIDE_WARPS for WIDE_BLOCKS in the biased builds and 16-token WGMMA CTAs), the stages that fit
    STAGE_BUDGET (stages 0), then on sm_90 K slices until the CTAs number ~ctas_per_sm per SM (at most a
    portable cluster, each slice at least MIN_SLICE_TILES tiles; an int4 long K at 33-64 tokens: slices of
    LONG_K_SLICE_TILES, up to 16). held (the GPU's cluster occupancy; None: not asked) lets 25-64 tokens
    take deep_split's build. wgmma_from (> 0 on sm_90, which has warpgroup mmas; the dispatch passes
    WGMMA_FIRST_TOKEN_TILES): from that many token tiles, CTAs of 16, 32 or 64 tokens take the WGMMA build,
    and at 9-16 tokens where sixteen_token_wgmma says.
    offsets: the weight has per-group offsets (GemmSpec.offsets). bits: 4, or 8 (never biased; its 64-token
    WGMMA CTAs wait as int8_wait_steps says; a long K splits within a portable cluster). scale_after:
    the builds unscaled_mmas allows take GemmSpec.scale_after."""
    blocks_m = -(-m // (8 * max_token_tiles))
    token_tiles = real_tiles = -(-m // (8 * blocks_m))
    wide_m = max_token_tiles in (MAX_TOKEN_TILES, WGMMA_MAX_TOKEN_TILES)
    ctas = sms * ctas_per_sm
    asked = wgmma_from > 0 and warps % 4 == 0 and wide_m
    wgmma = asked and (
        wgmma_from <= token_tiles
        or (token_tiles == 2 and sixteen_token_wgmma(n, k, group, ctas, offsets, bits, scale_after))
    )
    if wgmma:
        token_tiles = next(tiles for tiles in WGMMA_TOKEN_TILES if tiles >= token_tiles)
    elif token_tiles > MAX_TOKEN_TILES:
        raise ValueError(f"{token_tiles} token tiles a CTA: mma.sync builds take at most {MAX_TOKEN_TILES}")
    biased = token_tiles <= biased_max_token_tiles and not wgmma and bits == 4
    groups_per_tile = TILE // group if group in SMALL_GROUPS else 1
    wide_ok = (biased or (wgmma and token_tiles == 2)) and hopper
    warps = warps or default_warps(n, token_tiles, groups_per_tile, wide_ok)
    tiles, blocks = k // TILE, (n // (COLS_PER_WARP * warps)) * blocks_m
    long_k = tiles >= LONG_K_TILES and token_tiles > 4 and blocks_m == 1 and bits == 4
    slices = k_slices(blocks, tiles, ctas, long_k) if hopper else 1
    budget_stages = not stages
    if budget_stages:
        budget = STAGE_BUDGET - (WGMMA_PAD if wgmma else 0)
        one = stage_bytes(warps, token_tiles, groups_per_tile, offsets, bits)
        stages = max(2, min(MAX_STAGES, budget // one))
    tiles_per_group = max(1, group // TILE)
    int8_wait = wgmma and bits == 8 and token_tiles == INT8_WAIT_TOKEN_TILES
    wait_steps = int8_wait_steps(groups_per_tile, tiles_per_group, slices > 1) if int8_wait else 0
    spec = GemmSpec(
        warps, token_tiles, tiles_per_group, stages, slices > 1, biased, wgmma, groups_per_tile,
        offsets, bits, wait_steps,
    )  # fmt: skip
    spec = replace(spec, scale_after=scale_after and unscaled_mmas(spec))
    plan = GemmLaunch(spec, slices, blocks_m)
    if hopper and held is not None and budget_stages:
        return occupancy_launch(plan, blocks, tiles, real_tiles, held)
    return plan


def sixteen_token_wgmma(
    n: int, k: int, group: int, ctas: float, offsets: bool, bits: int, scale_after: bool
) -> bool:
    """Whether 9-16 tokens take 16-token WGMMA CTAs (where warpgroup mmas are asked for at all): int4 in one
    group a tile or more, without offsets, with scale_after (the builds measured), where the output takes
    WIDE_WARPS or a K slice of the 4-warp launch (k_slices until ~ctas CTAs) is at least
    WGMMA_16_SLICE_TILES long."""
    if not scale_after or offsets or bits != 4 or group in SMALL_GROUPS:
        return False
    tiles = k // TILE
    long_slices = tiles // k_slices(n // (COLS_PER_WARP * WARPS), tiles, ctas, False) >= WGMMA_16_SLICE_TILES
    return long_slices or default_warps(n, 2, 1, True) == WIDE_WARPS


def unscaled_mmas(spec: GemmSpec) -> bool:
    """Whether a build can take GemmSpec.scale_after: a biased one, or an int4 WGMMA one at 16 tokens a CTA in
    one group a tile (its tile's sums are then scaled after the tile's wait), never with offsets (they need x
    sums)."""
    wgmma_16 = spec.wgmma and spec.bits == 4 and spec.token_tiles == 2 and spec.groups_per_tile == 1
    return (spec.biased or wgmma_16) and not spec.offsets


def default_warps(n: int, token_tiles: int, groups_per_tile: int, wide_ok: bool) -> int:
    """WIDE_WARPS for WIDE_BLOCKS where wide_ok (on sm_90, the biased builds and 16-token WGMMA CTAs), whose
    256 columns a CTA must tile N; else WARPS."""
    whole = n % (COLS_PER_WARP * WIDE_WARPS) == 0
    wide = whole and WIDE_BLOCKS[0] <= n // (COLS_PER_WARP * WARPS) <= WIDE_BLOCKS[1]
    # 8 warps at 9-16 tokens with groups of 64 / 32 take 132 / 150 registers: one CTA an SM (qkv at 16
    # tokens, group 32: 15.5 us against 9.6 at group 128, H100)
    fits = groups_per_tile == 1 or token_tiles == 1
    return WIDE_WARPS if wide and wide_ok and fits else WARPS


def k_slices(blocks: int, tiles: int, ctas: float, long_k: bool) -> int:
    """K slices until blocks x slices ~ ctas (at most a portable cluster, each slice at least MIN_SLICE_TILES
    tiles); long_k (an int4 long K at 33-64 tokens in one token block): slices of LONG_K_SLICE_TILES, up to
    a non-portable cluster."""
    slices = max(1, min(round(ctas / blocks), MAX_CLUSTER, tiles // MIN_SLICE_TILES))
    if long_k:
        slices = max(slices, min(MAX_NON_PORTABLE_CLUSTER, tiles // LONG_K_SLICE_TILES))
    return slices


def int8_wait_steps(groups_per_tile: int, tiles_per_group: int, clustered: bool) -> int:
    """GemmSpec.wait_steps of an int8 WGMMA build at 64 tokens a CTA: the wait that brings it to 168
    registers or fewer, 3 CTAs of 4 warps an SM (ptxas, sm_90a; the table in BENCHMARKS, twenty-fourth
    session). Groups of 32 / 64 wait per group (182 / 172 registers clustered, 196 / 199 in one slice, ->
    157-168); in groups of 128 or per channel, one K slice waits every 2 k-steps (196 -> 166; every 4: 185),
    clustered groups of 128 every 4 (174 -> 165); per channel clustered fits already (168)."""
    if groups_per_tile > 1:
        return TILE // 16 // groups_per_tile  # a group's k-steps of 16 rows
    if not clustered:
        return 2
    return 4 if tiles_per_group == 1 else 0


def occupancy_launch(plan: GemmLaunch, clusters: int, tiles: int, real_tiles: int, held: Held) -> GemmLaunch:
    """Where the GPU's cluster occupancy is known: 25-64 tokens in one token block below a long K take
    deep_split's build (17-24 tokens padded to 32 do not), launches of several token blocks in clusters
    even_stages' build; plan elsewhere."""
    one_block = plan.token_blocks == 1
    if real_tiles >= DEEP_MIN_TOKEN_TILES and one_block and tiles < LONG_K_TILES:
        deep = deep_split(plan.spec, clusters, tiles, held)
        if deep is not None:
            return GemmLaunch(deep[0], deep[1], 1)
    if not one_block and plan.spec.cluster_reduce:
        return replace(plan, spec=even_stages(plan.spec, clusters, plan.slices, held))
    return plan


# 129-384 tokens (several 64-token blocks, K slices in clusters of 2-3), H100, µs with 2 / 3 / 4 stages at
# group 128: o at 256 tokens (128 clusters) 30.3 / 30.0 / 23.7, down 82.4 / 82.0 / 62.5 (4 stages: 2 CTAs
# an SM, 132 clusters held, against 3 and 198: the same wave, evenly spread); where 4 stages leave the
# launch a second wave it lost (qkv at 256, 192 clusters: 30.6 / 30.3 / 46.8). Groups of 32 (2 stages in
# the budget): qkv at 129 tokens 34.0 / 41.9, o at 256 33.2 / 23.2 (twenty-second session).
def even_stages(spec: GemmSpec, clusters: int, slices: int, held: Held) -> GemmSpec:
    """Of spec's stages and one fewer or more, the build whose clusters fill one wave with the fewest slots
    to spare, then the most stages (spec where none fits in one wave)."""
    low, high = max(2, spec.stages - 1), min(MAX_STAGES, spec.stages + 1)
    options = [replace(spec, stages=stages) for stages in range(low, high + 1)]
    fits = [option for option in options if held(option, slices) >= clusters]
    return min(fits, key=lambda option: (held(option, slices), -option.stages)) if fits else spec


def deep_split(spec: GemmSpec, blocks: int, tiles: int, held: Held) -> tuple[GemmSpec, int] | None:
    """One stage more than spec's, with the most slices (DEEP_MIN_SLICES up to a portable cluster) whose
    blocks clusters the GPU holds at once; None where no such split exists."""
    deep = replace(spec, stages=spec.stages + 1, cluster_reduce=True)
    fits = [s for s in range(DEEP_MIN_SLICES, MAX_CLUSTER + 1) if s * MIN_SLICE_TILES <= tiles]
    fits = [s for s in fits if blocks <= held(deep, s)]
    return (deep, max(fits)) if fits else None


# 5-128 tokens (3-128 below a long K): faster than what ran there before in the sum over Qwen3-8B's four
# layers (H200, benchmarks/sweep_w4a16_gemm.py): at 5-7 tokens than the decode GEMV (the biased build,
# twelfth session: 50.1 against 59.5 us at 5; down alone ties at 5), at 16-128 than the Triton GEMM (eleventh
# session). Since the cluster's last meeting arrives relaxed (thirteenth session) it also beats the GEMV at
# 3-4 tokens for qkv / o / gate_up (4 tokens: 7.7 / 6.5 / 19.6 against 8.7 / 6.7 / 21.0 us; 3: 7.6 / 6.5 /
# 19.7 against 8.4 / 6.5 / 19.9) but not for down, a long K (14.8 against 12.7 at 4), nor at 2 tokens
# (o 6.4 against 5.9, gate_up 19.5 against 18.0). At 129-384 tokens (3-6 token blocks of 64) than dequantize +
# cuBLAS, what ran there before (H100, seventeenth session, µs at 192 / 256 / 384 tokens): qkv 30.9 / 30.9 /
# 50.5 against 50.7 / 48.7 / 53.0, o 22.9 / 30.2 / 30.2 against 29.5 / 29.9 / 32.2, gate_up 87.4 / 104.4 /
# 157.4 against 180.1 / 182.2 / 212.7, down 59.0 / 81.8 / 83.7 against 109.7 / 98.0 / 123.8. At 512 o and
# down lost (one K slice: 49.7 and 153.6 against 36.4 and 112.8), at 1024 every layer.
PREFERRED_M = (5, 384)
SHORT_K_FIRST_M = 3  # where K has fewer than LONG_K_TILES tiles
# int8 (twice the words a tile, never biased) from 1 to 256 tokens, against the engine's int8 dispatch before
# (the Triton GEMVs at <= 16 tokens, the Triton tensor-core GEMM at 17-128, dequantize + cuBLAS above), H100,
# µs per channel / groups of 32 (twenty-third session): qkv 12.3 / 12.8 against 13.5 / 18.4 at one token,
# 13.1 / 14.3 against 14.8 / 26.9 at 16, 39.0 / 61.0 against 53.2 / 55.3 at 256; o 8.8 / 9.2 against 10.2 /
# 13.6 at one; at 384 qkv 101.9 against 57.8 and gate_up 255.0 against 227.7.
INT8_PREFERRED_TOP = 256


def preferred(m: int, k: int, hopper: bool = True, group: int = TILE, bits: int = 4) -> bool:
    """Whether this kernel is expected to beat what the dispatch ran before at m tokens and this K (the H200
    sweep, benchmarks/sweep_w4a16_gemm.py). Only measured on sm_90, where its K slices meet in a cluster;
    without clusters a launch takes one slice (48 CTAs for Qwen3-8B's qkv), so elsewhere the other kernels
    keep it. Groups of 32 or 64 rows and int8 from one token: the decode GEMV takes neither, and the Triton
    kernels that did ran slower (benchmarks/bench_w4a16_groups.py)."""
    first = PREFERRED_M[0] if k // TILE >= LONG_K_TILES else SHORT_K_FIRST_M
    from_one = group in SMALL_GROUPS or bits == 8
    top = INT8_PREFERRED_TOP if bits == 8 else PREFERRED_M[1]
    return hopper and (1 if from_one else first) <= m <= top


def warm_up_ms(top: int, k: int, hopper: bool = True, group: int = TILE, bits: int = 4) -> list[int]:
    """One M per build up to top tokens: for each count of 64-token blocks, the largest M of each token-tile
    count it takes (the build follows the tile count, and the stages and K slices follow the tile and block
    counts; 3-8 tokens share one): running each once compiles them all while the model loads (none where
    the dispatch never comes here)."""
    per_block = 8 * MAX_TOKEN_TILES
    ms = [
        8 * tiles * blocks
        for blocks in range(1, -(-top // per_block) + 1)
        for tiles in range(1, MAX_TOKEN_TILES + 1)
        if -(-(8 * tiles * blocks) // per_block) == blocks  # M takes that many blocks of that many tiles
    ]
    return [m for m in ms if m <= top and preferred(m, k, hopper, group, bits)]
