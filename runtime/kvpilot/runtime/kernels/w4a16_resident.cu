// int4 weight-only GEMV for a few tokens whose CTAs hold their columns' whole weight in shared memory, so that
// two launches' grids are resident at once: the next GEMV's weight streams in while this one computes.
// Same weight layout and arithmetic as w4a16_gemv.cu (the biased pairs, the zero and scale applied per tile to
// fp32 sums), but x's tile sums come from its staging, not a ones-mma per step (a quarter to a third of the
// mmas at 2-3 blocks). w4a16_resident.py compiles it with NVRTC and macros:
//   BLOCKS (the most 16-column mma blocks a CTA takes), WARPS (warps per CTA, splitting K's tiles), NT (token
//   tiles of 8), TILES_PER_GROUP (G / 128).
// Why: a GEMV must wait for its x (the predecessor's output), so what it does after that wait is its period
// back to back. The split-K builds end with a meeting of slices (a workspace or a cluster) and their grids
// (3 CTAs per SM) leave no room for the next one's. Here a CTA takes whole columns, its warps meet in its own
// shared memory, and one CTA (<= 113 KB, <= 128 registers a thread) per SM leaves room for the next grid's.
// Grid (G <= SMs): CTA b takes blocks [b B / G, (b + 1) B / G) of the B = N / 16 (at most BLOCKS), every K
// tile; warp w takes the tiles w, w + WARPS, ... Its weight is copied into shared memory with cp.async at
// entry, before the PDL wait. Why one CTA per SM even where B / G is not whole: with 2 G CTA slots for two
// grids, each CTA that exits frees one slot for one CTA of the next grid, so no SM ends up computing two CTAs
// of one grid (with 128 CTAs on 132 SMs, some did, and the last CTA of a launch came 2.3 µs late).
//
// Swapped, y^T = W x^T: mma block c's A row g is column 16c + g ("lo"), row g + 8 column 16c + 8 + g ("hi").
// Lane (g, t) reads, for row set rs of a tile, the word at word row 16T + 4rs + t of each: one word of a
// column gives the 4 bf16 pairs of K rows (16i + r, 16(i + 4) + r), r = 4rs + t, as in w4a16_gemv.cu.

typedef unsigned int u32;
typedef unsigned short u16;

#define TILE 128
#define WORDS_PER_TILE 16
#define COLS (16 * BLOCKS)
#define CHUNKS (COLS / 4)  // 16-byte chunks per word row
#ifndef PREFETCH_GROUPS
#define PREFETCH_GROUPS 1  // the weight's copies issued in this many groups,
#endif
#ifndef IN_FLIGHT
#define IN_FLIGHT 1  // at most this many in flight at once (the rest wait before the PDL wait)
#endif
#ifndef SLEEP_NS
#define SLEEP_NS 0  // > 0: sleep this long at entry before the first copy
#endif

#include "int4_pairs.cuh"
#include "mma_bf16.cuh"
#include "pdl.cuh"
#include "w4a16_xstage.cuh"

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    const u32 at = static_cast<u32>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(at), "l"(src) : "memory");
}

// Word (row, column) of the shared copy: chunk q of a row is stored at q ^ swizzle, so that the 32 lanes of
// one read (rows 4rs + t, t = 0..3; columns 16c + g or 16c + 8 + g, g = 0..7) hit 32 distinct banks.
// A row is CHUNKS chunks: 8 chunks (32 banks) shift by nothing, so rows t take chunk groups q ^ 2t; rows of
// 4 mod 8 chunks already shift by 4 chunk groups a row, and q ^ 2 (t / 2) separates rows t and t + 2.
__device__ __forceinline__ int swizzle(int row) { return CHUNKS % 8 == 0 ? 2 * (row & 3) : 2 * ((row >> 1) & 1); }

__device__ __forceinline__ int word_at(int row, int col) {
    return row * COLS + 4 * ((col >> 2) ^ swizzle(row)) + (col & 3);
}

// This thread's share of tiles [t_lo, t_hi): their word rows, then their groups' scales and zeros
// ([group][COLS] each, after the words). Consecutive threads copy consecutive chunks of a row (coalesced).
__device__ void fetch_tiles(u32* words, u16* sz, const u32* qw, const u16* scales, const u16* zeros, int t_lo,
                            int t_hi, int n, int n0, int nb, int groups) {
    for (int i = threadIdx.x; i < (t_hi - t_lo) * WORDS_PER_TILE * 4 * nb; i += WARPS * 32) {
        const int row = t_lo * WORDS_PER_TILE + i / (4 * nb), q = i % (4 * nb);
        cp_async16(words + word_at(row, 4 * q), qw + (long long)row * n + n0 + 4 * q);
    }
    const int g_lo = t_lo / TILES_PER_GROUP, g_hi = (t_hi + TILES_PER_GROUP - 1) / TILES_PER_GROUP;
    for (int i = threadIdx.x; i < (g_hi - g_lo) * 4 * nb; i += WARPS * 32) {  // 2 nb chunks of each
        const int grp = g_lo + i / (4 * nb), which = i / (2 * nb) % 2, q = i % (2 * nb);
        const u16* src = (which ? zeros : scales) + (long long)grp * n + n0 + 8 * q;
        cp_async16(sz + (which * groups + grp) * COLS + 8 * q, src);
    }
}

__device__ __forceinline__ float bf16_bits(u16 v) { return __uint_as_float(u32(v) << 16); }

// Lane (g, t)'s words of tile 0, row set 0: row t's columns 16c + g (lo) and 16c + 8 + g (hi). Rows
// 16T + 4rs + t share t's swizzle, so a tile's and a row set's are these plus a constant (an immediate
// offset of the shared load, not an address computed per load).
struct LaneWords {
    const u32* lo[BLOCKS];
    const u32* hi[BLOCKS];
};

__device__ __forceinline__ LaneWords lane_words(const u32* words, int g, int t) {
    LaneWords at;
#pragma unroll
    for (int c = 0; c < BLOCKS; ++c) {
        at.lo[c] = words + word_at(t, 16 * c + g);
        at.hi[c] = words + word_at(t, 16 * c + 8 + g);
    }
    return at;
}

// One K tile of this warp into acc[NT][BLOCKS]: the mmas over the biased pairs, then per block and column
// acc += s (part - (128 + z) xsum) with the tile's group's scale s and zero z. Blocks past the CTA's own
// (a CTA with fewer than BLOCKS) compute on whatever the shared memory holds and are never stored.
__device__ __forceinline__ void tile_into(float (*acc)[BLOCKS][4], const u16* sz, const uint4* xs, const float* sums,
                                          const LaneWords& at, int tile, int groups, int g, int t, int m) {
    float part[NT][BLOCKS][4] = {};
    const int rows = tile * WORDS_PER_TILE * COLS;
#pragma unroll
    for (int rs = 0; rs < 4; ++rs) {
        uint4 b[NT];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) b[nt] = xs[x_entry(tile, rs, min(g + 8 * nt, m - 1), t, m)];
        u32 lo[BLOCKS], hi[BLOCKS];
#pragma unroll
        for (int c = 0; c < BLOCKS; ++c) {
            lo[c] = at.lo[c][rows + 4 * rs * COLS];
            hi[c] = at.hi[c][rows + 4 * rs * COLS];
        }
#pragma unroll
        for (int s = 0; s < 2; ++s) {
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
                const u32 b0 = s == 0 ? b[nt].x : b[nt].z, b1 = s == 0 ? b[nt].y : b[nt].w;
#pragma unroll
                for (int c = 0; c < BLOCKS; ++c)
                    mma_bf16(part[nt][c], biased_pair(lo[c], 2 * s), biased_pair(hi[c], 2 * s),
                             biased_pair(lo[c], 2 * s + 1), biased_pair(hi[c], 2 * s + 1), b0, b1);
            }
        }
    }
    float xsum[NT][2];  // x's sum over the tile for this lane's tokens 8 nt + 2t + j
    tile_xsum(xsum, sums, tile, t, m);
    const u16* s_row = sz + (tile / TILES_PER_GROUP) * COLS;
    const u16* z_row = s_row + groups * COLS;
#pragma unroll
    for (int c = 0; c < BLOCKS; ++c) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // entries 0-1: column 16c + g; 2-3: column 16c + 8 + g
            const int col = 16 * c + 8 * h + g;
            const float s = bf16_bits(s_row[col]), nz = -(128.f + bf16_bits(z_row[col]));
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    float& a = acc[nt][c][2 * h + j];
                    a = fmaf(s, fmaf(nz, xsum[nt][j], part[nt][c][2 * h + j]), a);
                }
            }
        }
    }
}

// The warps' sums meet in shared memory (sums [WARPS][M][COLS] fp32, over the weight copy once every warp
// is done with it) and go out as bf16, added in warp order.
__device__ void store_columns(float (*acc)[BLOCKS][4], float* sums, u16* y, int m, int n0, int nb, int stride_y,
                              int warp, int g, int t) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int c = 0; c < BLOCKS; ++c) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int tok = 8 * nt + 2 * t + (e & 1), col = 16 * c + 8 * (e >> 1) + g;
                if (tok < m) sums[(warp * m + tok) * COLS + col] = acc[nt][c][e];
            }
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < m * 16 * nb; i += WARPS * 32) {
        const int tok = i / (16 * nb), col = i % (16 * nb);
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) sum += sums[(w * m + tok) * COLS + col];
        u16 out;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(out) : "f"(sum));
        y[(long long)tok * stride_y + n0 + col] = out;
    }
}

// x [M, K] bf16 (row stride stride_x), qweight int32 [K/8, N], scales/zeros bf16 [K/G, N], y [M, N] bf16.
// Dynamic shared memory: the words (K/8 rows x COLS), the scales and zeros (2 K/G x COLS), the staged x
// (256 M bytes a tile), its sums (8 M bytes a tile) -- w4a16_resident.py's shared_bytes.
extern "C" __global__ void __launch_bounds__(WARPS * 32, 2) w4a16_resident(
    const u16* __restrict__ x, const u32* __restrict__ qweight, const u16* __restrict__ scales,
    const u16* __restrict__ zeros, u16* __restrict__ y, int m, int n, int k, int stride_x, int stride_y) {
    gdc_launch_dependents();  // the next grid's CTAs may take the room beside this one's at once
    extern __shared__ uint4 smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int b_lo = blockIdx.x * (n / 16) / gridDim.x, nb = (blockIdx.x + 1) * (n / 16) / gridDim.x - b_lo;
    const int n0 = 16 * b_lo, tiles = k / TILE, groups = k / (TILE * TILES_PER_GROUP);
    u32* words = reinterpret_cast<u32*>(smem);
    u16* sz = reinterpret_cast<u16*>(words + tiles * WORDS_PER_TILE * COLS);
    uint4* xs = reinterpret_cast<uint4*>(sz + 2 * groups * COLS);
    float* x_sums = reinterpret_cast<float*>(xs + m * tiles * 16);
    if (SLEEP_NS > 0) __nanosleep(SLEEP_NS);
#pragma unroll
    for (int j = 0; j < PREFETCH_GROUPS; ++j) {  // in flight during the wait
        fetch_tiles(words, sz, qweight, scales, zeros, j * tiles / PREFETCH_GROUPS, (j + 1) * tiles / PREFETCH_GROUPS,
                    n, n0, nb, groups);
        asm volatile("cp.async.commit_group;" ::: "memory");
        if (j + 1 < PREFETCH_GROUPS && j + 1 >= IN_FLIGHT)
            asm volatile("cp.async.wait_group %0;" ::"n"(IN_FLIGHT - 1) : "memory");
    }
    gdc_wait();
    stage_x(xs, x_sums, x, stride_x, m, 0, tiles);
    asm volatile("cp.async.wait_all;" ::: "memory");  // (back to back, the weight landed long before)
    __syncthreads();

    float acc[NT][BLOCKS][4] = {};
    const LaneWords at = lane_words(words, g, t);
#pragma unroll 2  // two tiles' loads and mmas interleaved (H200: qkv 6.5 -> 6.4 µs, o 5.2 -> 5.1 at 1 token)
    for (int tile = warp; tile < tiles; tile += WARPS) tile_into(acc, sz, xs, x_sums, at, tile, groups, g, t, m);
    __syncthreads();  // every warp is done with the words: they take the sums
    store_columns(acc, reinterpret_cast<float*>(smem), y, m, n0, nb, stride_y, warp, g, t);
}
