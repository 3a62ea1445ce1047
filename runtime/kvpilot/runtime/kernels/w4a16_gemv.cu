// int4 weight-only GEMM for 1-16 tokens (decode) on mma.sync, bf16 activations: y [M, N] = x [M, K] W^T, the
// weight in the canonical layout of quant_reference.py (qweight int32 [K/8, N], value j of word row 16T + r
// is K row 128T + 16j + r; scales, zeros bf16 [K/G, N]). w4a16_cuda.py compiles it with NVRTC and macros:
//   WARPS (warps per CTA, splitting its K slice), NT (token tiles of 8: 1 for M <= 8, 2 for M <= 16),
//   TILES_PER_GROUP (G / 128), STAGES (K tiles each warp has loaded, in registers, while it computes one),
//   EARLY_RELEASE (1: the next kernel may launch at this one's entry, not only after its K loop),
//   MIN_CTAS (the launch bound's CTAs per SM),
//   CLUSTER_REDUCE (1: sm_90, a column block's S <= 8 slices are one cluster and meet in shared memory).
// A shared-memory ring of cp.async stages per warp (tenth to sixteenth sessions; a CTA at <= 128 registers,
// so the next GEMM's CTAs fit beside this one's) was the faster build for qkv and o at 1-4 tokens until the
// register ring took x's tile sums from its staging; the seventeenth session removed it (BENCHMARKS.md).
// The staged x takes 256 M bytes per K tile out of X_BYTES: the host gives a CTA at most X_BYTES / 256 M tiles.
// Grid (N / 64, S): CTA (b, s) takes 64 output columns and the s-th of S slices of K's tiles. It stages its x
// slice in shared memory in the mma's B-fragment order, its warps take the slice's tiles in turn, their
// partial sums meet in shared memory in a fixed order; with S > 1 the slices' sums meet through a workspace
// and a counter (or a cluster's shared memory), added in slice order (deterministic).
//
// Swapped, y^T = W x^T, so the weight is mma.m16n8k16's A operand straight from the registers it was loaded
// into: lane (g = lane / 4, t = lane % 4) loads, for row set rs of a tile, the 16-byte words at word row
// 16T + 4rs + t of columns n0 + 4g + c ("lo", A row g of mma block c) and n0 + 32 + 4g + c ("hi", A row
// g + 8). Pair i of a word, (w >> 4i) & 0x000F000F | 0x43004300, is the bf16 pair (128 + q_i, 128 + q_{i+4})
// exactly: K rows (16i + r, 16(i + 4) + r) of one column. Step s of a row set takes pairs 2s (K slots 2t,
// 2t+1) and 2s + 1 (slots 2t+8, 2t+9); x's B registers hold token g at exactly those K rows.
//
// Why the bias stays in: a tile lies in one group, so sum_k x_k (q_k - z) s = s (sum_k x_k (128 + q_k) -
// (128 + z) sum_k x_k). The mmas take the biased pairs as they come out of one shift and one lop3 (8 values
// in 7 instructions; subtracting the zero and scaling per value took 4 per pair, and bounded the kernel by
// issue, not bytes), sum_k x_k per token comes from x's staging (w4a16_xstage.cuh: in place of a ninth mma
// per step with an all-ones A, H200, sixteenth session, one token: gate_up / down 17.8 / 11.5 -> 15.9 /
// 10.6 µs), and the zero and the scale are applied once per tile to the fp32 sums.

typedef unsigned int u32;
typedef unsigned short u16;

#ifndef MIN_CTAS
#define MIN_CTAS 1
#endif
#ifndef CLUSTER_REDUCE
#define CLUSTER_REDUCE 0
#endif
#define COLS 64
#define TILE 128
#define WORDS_PER_TILE 16
#define RED_ELEMS 4   // the split fixup's elements per thread per round
#define RED_SLICES 8  // and the slices of each it loads at once

__device__ __forceinline__ u16 f32_to_bf16(float x) {
    u16 y;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(y) : "f"(x));
    return y;
}

// Programmatic dependent launch: the weight is never written by a predecessor, so its first tiles are loaded
// before the wait; x and every store come after it.
#include "int4_pairs.cuh"
#include "mma_bf16.cuh"
#include "pdl.cuh"

// One K tile's weight words in this lane's registers: row set rs, lo/hi columns; and its group's raw
// scales and zeros (4 bf16 each for the lo and the hi columns), loaded with it so nothing waits on them.
struct Tile {
    uint4 lo[4], hi[4];
    uint2 s[2], z[2];
};

__device__ __forceinline__ void load_tile(Tile& w, const u32* qw, const u16* scales, const u16* zeros, int tile,
                                          int n, int col, int t) {
#pragma unroll
    for (int rs = 0; rs < 4; ++rs) {
        const u32* row = qw + (long long)(tile * WORDS_PER_TILE + 4 * rs + t) * n + col;
        w.lo[rs] = __ldg(reinterpret_cast<const uint4*>(row));
        w.hi[rs] = __ldg(reinterpret_cast<const uint4*>(row + 32));
    }
    const long long at = (long long)(tile / TILES_PER_GROUP) * n + col;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        w.s[h] = __ldg(reinterpret_cast<const uint2*>(scales + at + 32 * h));
        w.z[h] = __ldg(reinterpret_cast<const uint2*>(zeros + at + 32 * h));
    }
}

#define X_BYTES 32768
#include "w4a16_xstage.cuh"

// biased_pair (int4_pairs.cuh): bf16x2 (128 + q_i, 128 + q_{i+4}); in C the lop3 would take an AND and an OR

// The tile's sums: part[4 nt + c] is mma block c of token tile nt, (col + c | col + 32 + c) x tokens
// (8 nt + 2t, + 1), over the biased weights.
__device__ __forceinline__ void mma_tile(float (*part)[4], const Tile& w, const uint4* xs, int tile, int g, int t,
                                         int m) {
#pragma unroll
    for (int rs = 0; rs < 4; ++rs) {
        uint4 b[NT];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) b[nt] = xs[x_entry(tile, rs, min(g + 8 * nt, m - 1), t, m)];
        const u32 lo[4] = {w.lo[rs].x, w.lo[rs].y, w.lo[rs].z, w.lo[rs].w};
        const u32 hi[4] = {w.hi[rs].x, w.hi[rs].y, w.hi[rs].z, w.hi[rs].w};
#pragma unroll
        for (int s = 0; s < 2; ++s) {
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const u32 a0 = biased_pair(lo[c], 2 * s), a2 = biased_pair(lo[c], 2 * s + 1);
                const u32 a1 = biased_pair(hi[c], 2 * s), a3 = biased_pair(hi[c], 2 * s + 1);
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const u32 b0 = s == 0 ? b[nt].x : b[nt].z, b1 = s == 0 ? b[nt].y : b[nt].w;
                    mma_bf16(part[4 * nt + c], a0, a1, a2, a3, b0, b1);
                }
            }
        }
    }
}

__device__ __forceinline__ float bf16_at(uint2 v, int c) {  // bf16 c of 4 as fp32
    const u32 w = c < 2 ? v.x : v.y;
    return __uint_as_float(c & 1 ? w & 0xFFFF0000u : w << 16);
}

// acc += s (part - (128 + z) xsum), per column (lo c: A row g, entries 0-1; hi c: row g + 8, entries 2-3);
// xsum[nt][j]: x's sum over the tile for token 8 nt + 2t + j.
__device__ __forceinline__ void fold_tile(float (*acc)[4], float (*part)[4], float (*xsum)[2], const Tile& w) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const float s = bf16_at(w.s[h], c), nz = -(128.f + bf16_at(w.z[h], c));
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    float& a = acc[4 * nt + c][2 * h + j];
                    a = fmaf(s, fmaf(nz, xsum[nt][j], part[4 * nt + c][2 * h + j]), a);
                }
            }
        }
    }
}

__device__ __forceinline__ void tile_into(float (*acc)[4], const Tile& w, const uint4* xs, const float* x_sums,
                                          int tile, int g, int t, int m) {
    float part[4 * NT][4], xsum[NT][2];
#pragma unroll
    for (int i = 0; i < 4 * NT; ++i) part[i][0] = part[i][1] = part[i][2] = part[i][3] = 0.f;
    mma_tile(part, w, xs, tile, g, t, m);
    tile_xsum(xsum, x_sums, tile, t, m);
    fold_tile(acc, part, xsum, w);
}

// This warp's tiles t_lo + warp + WARPS i of the slice, STAGES - 1 of them loaded ahead of the one in use
// (the ring is indexed by compile-time constants: the loop is unrolled by STAGES).
__device__ __forceinline__ void stream_tiles(float (*acc)[4], Tile (&ring)[STAGES], const u32* qweight,
                                             const u16* scales, const u16* zeros, const uint4* xs,
                                             const float* x_sums, int first, int count, int t_lo, int n, int col,
                                             int g, int t, int m) {
    for (int i0 = 0; i0 < count; i0 += STAGES) {
#pragma unroll
        for (int j = 0; j < STAGES; ++j) {
            const int i = i0 + j;
            if (i >= count) break;
            if (i + STAGES - 1 < count) {
                const int ahead = first + (i + STAGES - 1) * WARPS;
                load_tile(ring[(j + STAGES - 1) % STAGES], qweight, scales, zeros, ahead, n, col, t);
            }
            tile_into(acc, ring[j], xs, x_sums, first + i * WARPS - t_lo, g, t, m);
        }
    }
}

// With S > 1, each slice's fp32 partial goes to the workspace and the last CTA of the column
// block (a counter, reset by it) adds the S partials in slice order.
__device__ void store_by_counter(const float (*sums)[COLS], u16* y, float* workspace, int* counters, int m, int n,
                                 int n0, int stride_y) {
    const int slice = blockIdx.y, slices = gridDim.y;
    for (int i = threadIdx.x; i < m * COLS; i += WARPS * 32)
        workspace[((long long)slice * m + i / COLS) * n + n0 + i % COLS] = sums[i / COLS][i % COLS];
    __threadfence();
    __syncthreads();
    __shared__ int last;
    if (threadIdx.x == 0) last = atomicAdd(counters + blockIdx.x, 1) == slices - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    if (m * COLS <= WARPS * 32) {  // an element a thread at most: the plain loop was faster (1 token, H200)
        const int i = threadIdx.x, tok = i / COLS, c = i % COLS;
        float sum = 0.f;
        for (int sl = 0; sl < slices && i < m * COLS; ++sl)
            sum += __ldcg(workspace + ((long long)sl * m + tok) * n + n0 + c);
        if (i < m * COLS) y[(long long)tok * stride_y + n0 + c] = f32_to_bf16(sum);
        if (threadIdx.x == 0) counters[blockIdx.x] = 0;
        return;
    }
    // Each thread takes RED_ELEMS elements at a time and loads RED_SLICES slices of each before adding any:
    // one L2 round trip per RED_ELEMS x RED_SLICES values, not one per value (at 8 tokens, 4 elements a thread).
    for (int i0 = threadIdx.x; i0 < m * COLS; i0 += WARPS * 32 * RED_ELEMS) {
        float sum[RED_ELEMS] = {};
        for (int s0 = 0; s0 < slices; s0 += RED_SLICES) {
            float v[RED_SLICES][RED_ELEMS];
#pragma unroll
            for (int sl = 0; sl < RED_SLICES; ++sl) {
#pragma unroll
                for (int j = 0; j < RED_ELEMS; ++j) {
                    const int i = i0 + j * WARPS * 32, tok = i / COLS, c = i % COLS;
                    const bool real = s0 + sl < slices && i < m * COLS;
                    v[sl][j] = real ? __ldcg(workspace + ((long long)(s0 + sl) * m + tok) * n + n0 + c) : 0.f;
                }
            }
#pragma unroll
            for (int sl = 0; sl < RED_SLICES; ++sl) {
#pragma unroll
                for (int j = 0; j < RED_ELEMS; ++j) sum[j] += v[sl][j];  // in slice order: deterministic
            }
        }
#pragma unroll
        for (int j = 0; j < RED_ELEMS; ++j) {
            const int i = i0 + j * WARPS * 32;
            if (i < m * COLS) y[(long long)(i / COLS) * stride_y + n0 + i % COLS] = f32_to_bf16(sum[j]);
        }
    }
    if (threadIdx.x == 0) counters[blockIdx.x] = 0;  // ready for the next launch (CUDA graphs replay it)
}

#if CLUSTER_REDUCE
#include "w4a16_cluster.cuh"
#endif

// The warps' sums meet in shared memory (part [WARPS][NT * 8][64] fp32; warp 0's rows end up holding the
// CTA's sum) and go out as bf16: directly (one slice) or through the workspace.
__device__ void store_columns(float (*acc)[4], void* scratch, u16* y, float* workspace, int* counters, int m,
                              int n, int n0, int stride_y, int warp, int g, int t) {
    float (*part)[NT * 8][COLS] = reinterpret_cast<float (*)[NT * 8][COLS]>(scratch);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int tok = 8 * nt + 2 * t;
            part[warp][tok][4 * g + c] = acc[4 * nt + c][0];
            part[warp][tok + 1][4 * g + c] = acc[4 * nt + c][1];
            part[warp][tok][32 + 4 * g + c] = acc[4 * nt + c][2];
            part[warp][tok + 1][32 + 4 * g + c] = acc[4 * nt + c][3];
        }
    }
    __syncthreads();
    const int slices = gridDim.y;
    for (int i = threadIdx.x; i < m * COLS; i += WARPS * 32) {
        const int tok = i / COLS, c = i % COLS;
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) sum += part[w][tok][c];
        if (slices == 1)
            y[(long long)tok * stride_y + n0 + c] = f32_to_bf16(sum);
        else
            part[0][tok][c] = sum;
    }
    if (slices == 1) return;
#if CLUSTER_REDUCE
    store_by_cluster(part[0], y, m, n0, stride_y);
#else
    __syncthreads();
    store_by_counter(part[0], y, workspace, counters, m, n, n0, stride_y);
#endif
}

// x [M, K] bf16 (row stride stride_x), qweight int32 [K/8, N], scales/zeros bf16 [K/G, N], y [M, N] bf16;
// workspace fp32 [S, M, N] and counters int32 [N / 64] (zero; left zero) when S > 1.
extern "C" __global__ void __launch_bounds__(WARPS * 32, MIN_CTAS) w4a16_gemv(
    const u16* __restrict__ x, const u32* __restrict__ qweight, const u16* __restrict__ scales,
    const u16* __restrict__ zeros, u16* __restrict__ y, float* __restrict__ workspace, int* __restrict__ counters,
    int m, int n, int k, int stride_x, int stride_y) {
#if EARLY_RELEASE
    gdc_launch_dependents();  // its CTAs take each SM slot this grid frees, their first tiles in flight
#endif
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * COLS, col = n0 + 4 * g;
    const int all_tiles = k / TILE, slices = gridDim.y;
    const int t_lo = blockIdx.y * all_tiles / slices, t_hi = (blockIdx.y + 1) * all_tiles / slices;
    const int first = t_lo + warp, count = first < t_hi ? (t_hi - first + WARPS - 1) / WARPS : 0;

    // x's slice as B fragments, then (after the sync) the warps' partial sums: [WARPS][NT * 8][64] fp32
    __shared__ uint4 smem[X_BYTES / 16 > WARPS * NT * 8 * COLS / 4 ? X_BYTES / 16 : WARPS * NT * 8 * COLS / 4];
    __shared__ float x_sums[X_BYTES / 128];  // 2 per (token, tile): 256 bytes of x each
    Tile ring[STAGES];
#pragma unroll
    for (int j = 0; j < STAGES - 1; ++j)  // in flight while the predecessor finishes and x is staged
        if (j < count) load_tile(ring[j], qweight, scales, zeros, first + j * WARPS, n, col, t);
    gdc_wait();
    stage_x(smem, x_sums, x, stride_x, m, t_lo * TILE, t_hi - t_lo);
    __syncthreads();

    float acc[4 * NT][4];
#pragma unroll
    for (int i = 0; i < 4 * NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    stream_tiles(acc, ring, qweight, scales, zeros, smem, x_sums, first, count, t_lo, n, col, g, t, m);
#if !EARLY_RELEASE
    gdc_launch_dependents();
#endif
    __syncthreads();  // x is no longer read: the space takes the partial sums
    store_columns(acc, smem, y, workspace, counters, m, n, n0, stride_y, warp, g, t);
}
