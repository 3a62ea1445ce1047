// int4 weight-only GEMM for 1-16 tokens (decode) on mma.sync, bf16 activations: y [M, N] = x [M, K] W^T, the
// weight in the canonical layout of quant_reference.py (qweight int32 [K/8, N], value j of word row 16T + r
// is K row 128T + 16j + r; scales, zeros bf16 [K/G, N]). w4a16_cuda.py compiles it with NVRTC and macros:
//   WARPS (warps per CTA, splitting its K slice), NT (token tiles of 8: 1 for M <= 8, 2 for M <= 16),
//   TILES_PER_GROUP (G / 128), MAX_TILES (K tiles of 128 rows per CTA at most: the staged x's size).
// Grid (N / 64, S): CTA (b, s) takes 64 output columns and the s-th of S slices of K's tiles. It stages its x
// slice in shared memory in the mma's B-fragment order (one 16-byte load per lane per row set later), its
// warps take the slice's tiles in turn, their partial sums meet in shared memory in a fixed order; with S > 1
// each CTA writes its fp32 partial to the workspace and the last CTA of a column block (a counter, reset by
// it) adds the S partials in slice order and stores bf16 (deterministic).
//
// Swapped, y^T = W x^T, so the weight is mma.m16n8k16's A operand straight from the registers it was loaded
// into (the layout int4_mma_gemv_triton.py found, here without Triton's scheduling in the way): lane
// (g = lane / 4, t = lane % 4) loads, for row set rs of a tile, the 16-byte words at word row 16T + 4rs + t
// of columns n0 + 4g + c ("lo", A row g of mma block c) and n0 + 32 + 4g + c ("hi", A row g + 8). Pair i of
// a word, (w >> 4i) & 0x000F000F | 0x43004300, is the bf16 pair (128 + q_i, 128 + q_{i+4}): K rows
// (16i + r, 16(i + 4) + r) of one column. Step s of a row set takes pairs 2s (K slots 2t, 2t+1) and 2s + 1
// (slots 2t+8, 2t+9); x's B registers hold token g at exactly those K rows. (q - z) * s in two bf16 FMAs
// (the first exact) is the weight quant_reference.dequantize_int_ref makes.

typedef unsigned int u32;
typedef unsigned short u16;

#define COLS 64
#define TILE 128
#define WORDS_PER_TILE 16

__device__ __forceinline__ u32 bf16x2_fma(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

__device__ __forceinline__ void mma_bf16(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u16 f32_to_bf16(float x) {
    u16 y;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(y) : "f"(x));
    return y;
}

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

// The dequantization constants of one group for this lane's 8 columns: bf16x2 (s, s) and -(128 + z) pairs.
struct Group {
    u32 s[8], nz[8];  // columns lo c = 0..3, hi c = 4..7
};

__device__ __forceinline__ void unpack_group(Group& q, const Tile& w) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const u32 sw[2] = {w.s[h].x, w.s[h].y}, zw[2] = {w.z[h].x, w.z[h].y};
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const u32 sv = (sw[c >> 1] >> (16 * (c & 1))) & 0xFFFFu;
            const u32 zv = (zw[c >> 1] >> (16 * (c & 1))) & 0xFFFFu;
            // -(128 + z) in bf16 (z < 16: exact): z is integer valued, add 128 in float
            const float zf = __uint_as_float(zv << 16) + 128.f;
            const u32 nzv = __float_as_uint(-zf) >> 16;
            q.s[4 * h + c] = sv | (sv << 16);
            q.nz[4 * h + c] = nzv | (nzv << 16);
        }
    }
}

// x staged as B fragments: entry (tile, rs, token, t) is the uint4 of lane (g = token % 8, t)'s registers for
// row set rs of that tile: {b0, b1} of step 0 and of step 1 (token's K rows 16 * {0,4 | 1,5 | 2,6 | 3,7} + r,
// r = 4 rs + t). Lanes of one warp read 32 consecutive entries: no bank conflicts.
__device__ __forceinline__ int x_entry(int tile, int rs, int tok, int t) {
    return ((tile * 4 + rs) * (NT * 8) + tok) * 4 + t;
}

// Only the M real tokens are staged: the other tokens' B columns hold stale bytes, and an mma's column j
// depends on B's column j alone, so they only reach outputs that are never stored.
__device__ void stage_x(uint4* xs, const u16* x, int stride_x, int m, int k_lo, int tiles) {
    u16* half = reinterpret_cast<u16*>(xs);
    for (int tok = 0; tok < m; ++tok) {
        const u16* row = x + (long long)tok * stride_x + k_lo;
        for (int k = threadIdx.x; k < tiles * TILE; k += WARPS * 32) {
            const int tile = k / TILE, j = (k % TILE) / 16, r = k % 16;  // value j of word row r
            const int reg = 2 * ((j & 3) >> 1) + (j & 1), hi = j >> 2;   // (step, b0/b1), half of the pair
            half[(x_entry(tile, r >> 2, tok, r & 3) * 4 + reg) * 2 + hi] = row[k];
        }
    }
}

__device__ __forceinline__ u32 dequant_pair(u32 word, int i, u32 s, u32 nz) {
    const u32 biased = ((word >> (4 * i)) & 0x000F000Fu) | 0x43004300u;  // 128 + q, exact
    return bf16x2_fma(bf16x2_fma(biased, 0x3F803F80u, nz), s, 0x80008000u);  // (q - z) exact, then * s
}

__device__ __forceinline__ void compute_tile(float (*acc)[4], const Tile& w, const Group& q, const uint4* xs,
                                             int tile, int g, int t) {
#pragma unroll
    for (int rs = 0; rs < 4; ++rs) {
        uint4 b[NT];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) b[nt] = xs[x_entry(tile, rs, g + 8 * nt, t)];
        const u32 lo[4] = {w.lo[rs].x, w.lo[rs].y, w.lo[rs].z, w.lo[rs].w};
        const u32 hi[4] = {w.hi[rs].x, w.hi[rs].y, w.hi[rs].z, w.hi[rs].w};
#pragma unroll
        for (int s = 0; s < 2; ++s) {
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const u32 a0 = dequant_pair(lo[c], 2 * s, q.s[c], q.nz[c]);
                const u32 a2 = dequant_pair(lo[c], 2 * s + 1, q.s[c], q.nz[c]);
                const u32 a1 = dequant_pair(hi[c], 2 * s, q.s[4 + c], q.nz[4 + c]);
                const u32 a3 = dequant_pair(hi[c], 2 * s + 1, q.s[4 + c], q.nz[4 + c]);
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const u32 b0 = s == 0 ? b[nt].x : b[nt].z, b1 = s == 0 ? b[nt].y : b[nt].w;
                    mma_bf16(acc[4 * nt + c], a0, a1, a2, a3, b0, b1);
                }
            }
        }
    }
}

// x [M, K] bf16 (row stride stride_x), qweight int32 [K/8, N], scales/zeros bf16 [K/G, N], y [M, N] bf16;
// workspace fp32 [S, M, N] and counters int32 [N / 64] (zero; left zero) when S > 1.
extern "C" __global__ void __launch_bounds__(WARPS * 32) w4a16_gemv(
    const u16* __restrict__ x, const u32* __restrict__ qweight, const u16* __restrict__ scales,
    const u16* __restrict__ zeros, u16* __restrict__ y, float* __restrict__ workspace, int* __restrict__ counters,
    int m, int n, int k, int stride_x, int stride_y) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int block = blockIdx.x, slice = blockIdx.y, slices = gridDim.y;
    const int n0 = block * COLS, col = n0 + 4 * g;
    const int all_tiles = k / TILE;
    const int t_lo = slice * all_tiles / slices, t_hi = (slice + 1) * all_tiles / slices;

    // x's slice as B fragments, then (after the sync) the warps' partial sums: [WARPS][NT * 8][64] fp32
    __shared__ uint4 smem[MAX_TILES * 4 * NT * 8 * 4 > WARPS * NT * 8 * COLS / 4 ? MAX_TILES * 4 * NT * 8 * 4
                                                                                : WARPS * NT * 8 * COLS / 4];
    Tile cur, nxt;
    Group grp;
    int tile = t_lo + warp;
    if (tile < t_hi) load_tile(cur, qweight, scales, zeros, tile, n, col, t);  // in flight while x is staged
    stage_x(smem, x, stride_x, m, t_lo * TILE, t_hi - t_lo);
    __syncthreads();

    float acc[4 * NT][4];  // mma block c of token tile nt: (col + c | col + 32 + c) x tokens (2t, 2t + 1)
#pragma unroll
    for (int i = 0; i < 4 * NT; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    for (; tile < t_hi; tile += WARPS) {
        if (tile + WARPS < t_hi) load_tile(nxt, qweight, scales, zeros, tile + WARPS, n, col, t);  // meanwhile
        unpack_group(grp, cur);
        compute_tile(acc, cur, grp, smem, tile - t_lo, g, t);
        cur = nxt;
    }
    __syncthreads();  // x is no longer read: the space takes the partial sums

    float (*part)[NT * 8][COLS] = reinterpret_cast<float (*)[NT * 8][COLS]>(smem);
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
    if (slices == 1) {
        for (int i = threadIdx.x; i < m * COLS; i += WARPS * 32) {
            const int tok = i / COLS, c = i % COLS;
            float sum = 0.f;
#pragma unroll
            for (int w = 0; w < WARPS; ++w) sum += part[w][tok][c];
            y[(long long)tok * stride_y + n0 + c] = f32_to_bf16(sum);
        }
        return;
    }
    for (int i = threadIdx.x; i < m * COLS; i += WARPS * 32) {
        const int tok = i / COLS, c = i % COLS;
        float sum = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) sum += part[w][tok][c];
        workspace[((long long)slice * m + tok) * n + n0 + c] = sum;
    }
    __threadfence();
    __syncthreads();
    __shared__ int last;
    if (threadIdx.x == 0) last = atomicAdd(counters + block, 1) == slices - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int i = threadIdx.x; i < m * COLS; i += WARPS * 32) {
        const int tok = i / COLS, c = i % COLS;
        float sum = 0.f;
        for (int sl = 0; sl < slices; ++sl) sum += __ldcg(workspace + ((long long)sl * m + tok) * n + n0 + c);
        y[(long long)tok * stride_y + n0 + c] = f32_to_bf16(sum);
    }
    if (threadIdx.x == 0) counters[block] = 0;  // ready for the next launch (CUDA graphs replay it)
}
