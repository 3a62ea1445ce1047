// int4 (and int8) weight-only GEMM for 1+ tokens (up to 64 a CTA) on mma.sync or wgmma, bf16 activations: y [M,
// N] = x [M, K] W^T, the weight in the canonical layout of quant_reference.py (int4: qweight int32 [K/8, N],
// value j of word row 16T + r is K row 128T + 16j + r; int8: [K/4, N], byte j of word row 32T + r is K row
// 128T + 32j + r; scales, zeros bf16 [K/G, N]). w4a16_gemm_cuda.py compiles it with NVRTC and macros:
//   BITS (4, or 8: w8a16_dequant.cuh takes the words apart; dequantizing builds only), WGMMA_WAIT_STEPS (2
//   or 4: WGMMA builds wait, every that many k-steps, for all but the last wgmmas issued; 0: once a tile;
//   w4a16_gemm_plan.GemmSpec.wait_steps),
//   WARPS (each warp owns 32 output columns: a CTA takes BN = 32 WARPS), NT (token tiles of 8, 1..8: a CTA
//   takes BM = 8 NT tokens, grid.z more token blocks), STAGES (K tiles in flight through the cp.async ring),
//   TILES_PER_GROUP (G / 128; 1 below 128), GROUPS_PER_TILE (128 / G for groups of 32 or 64 rows, else 1),
//   CLUSTER_REDUCE (1: sm_90, a column block's S <= 16 K slices are one cluster),
//   BIASED (1: the mmas take 128 + q, each tile's sums corrected in fp32; w4a16_gemm_biased.cuh),
//   SCALE_AFTER (1, BIASED or WGMMA at 16 tokens, without OFFSETS: the mmas take q - z exactly, each group's
//   sums scaled in fp32),
//   WGMMA (1: sm_90a, 16, 32 or 64 tokens a CTA: the K tile on warpgroup mmas, w4a16_gemm_wgmma.cuh),
//   OFFSETS (1: a bf16 offset per group and column, offsets [K/G, N], is added to each weight: a GGUF grid's
//   fractional zero point, quant/int_weight.from_affine; dequantizing builds add it in the FMA that scales,
//   biased builds add offset x the group's x sum to each sum).
//
// Why not the decode GEMV (w4a16_gemv.cu) widened: there each lane's weight words pair K rows 16 apart, so x
// must be permuted into B fragments through registers, and each A fragment fed 1-2 token tiles; tried at 64
// tokens it ran 0.35-0.8x bf16 (BENCHMARKS, ninth session). Here lane (g = lane / 4, t = lane % 4) takes word
// rows 2t, 2t + 1 (and 2t + 8, 2t + 9): value j of those two words is K rows 16j + 2t and 16j + 2t + 1, so
// one byte_perm and one lop3 give the A pair of two consecutive K rows and x is used in its own layout: each
// K tile's x rows go to shared memory with cp.async and come out as B fragments by ldmatrix. Each A fragment
// is dequantized once, exactly as the reference (bf16((q - z) s): the difference is exact, the product
// rounded once), and feeds NT mmas.
//
// Groups of 32 or 64 rows: mma k-step j takes K rows [16j, 16j + 16), so each step lies in group 16j / G and
// takes that group's scales and zeros; the stage holds the tile's GROUPS_PER_TILE rows of them (the decode
// GEMV cannot: its steps pair K rows 64 apart, so the dispatch sends such weights here from one token).
//
// Grid (N / BN, S, ceil(M / BM)): CTA (b, s, z) takes columns [b BN, +BN), tokens [z BM, +BM) and the s-th of
// S slices of K's tiles. Mma block c (0, 1) of warp w: A rows g -> column 32w + 2g + c, g + 8 -> 32w + 16 +
// 2g + c; its fp32 sums acc[c][nt] cover tokens 8 nt + (2t, 2t + 1).

typedef unsigned int u32;
typedef unsigned short u16;

#ifndef CLUSTER_REDUCE
#define CLUSTER_REDUCE 0
#endif
#ifndef BIASED
#define BIASED 0
#endif
#ifndef WGMMA
#define WGMMA 0
#endif
#ifndef GROUPS_PER_TILE
#define GROUPS_PER_TILE 1
#endif
#ifndef OFFSETS
#define OFFSETS 0
#endif
#ifndef SCALE_AFTER
#define SCALE_AFTER 0
#endif
#ifndef BITS
#define BITS 4
#endif
#ifndef WGMMA_WAIT_STEPS
#define WGMMA_WAIT_STEPS 0
#endif
#if WGMMA_WAIT_STEPS != 0 && WGMMA_WAIT_STEPS != 2 && WGMMA_WAIT_STEPS != 4
#error "WGMMA_WAIT_STEPS 0 (a wait a tile), 2 or 4"
#endif
#if SCALE_AFTER && (!(BIASED || (WGMMA && NT == 2 && GROUPS_PER_TILE == 1)) || OFFSETS || BITS != 4)
#error "SCALE_AFTER: biased builds, or WGMMA at 16 tokens in one group a tile, without offsets"
#endif
#if BITS != 4 && (BITS != 8 || BIASED)
#error "BITS 4, or 8 in dequantizing builds (128 + q is no bf16 past 7 bits)"
#endif
#if GROUPS_PER_TILE != 1 && (TILES_PER_GROUP != 1 || (GROUPS_PER_TILE != 2 && GROUPS_PER_TILE != 4))
#error "groups of 32 or 64 rows (GROUPS_PER_TILE 4 or 2) take TILES_PER_GROUP 1"
#endif
#define STEPS_PER_GROUP (8 / GROUPS_PER_TILE)  // mma k-steps of 16 K rows in one group
#if WGMMA && ((NT != 2 && NT != 4 && NT != 8 && NT != 16) || WARPS % 4 || BIASED)
#error "the WGMMA build takes 16, 32 or 64 tokens in whole warpgroups, dequantizing"
#endif
#define TILE 128
#define BN (32 * WARPS)
#define BM (8 * NT)
#define NT_PAIRS ((NT + 1) / 2)  // ldmatrix.x4 takes two token tiles: x rows are staged for 16 NT_PAIRS
#define X_STAGE (16 * NT_PAIRS * TILE * 2)  // bytes: x rows of 256 bytes, 16-byte chunks swizzled
#define WORD_ROWS (4 * BITS)  // word rows of a K tile: 16 (int4), 32 (int8)
#define W_WARP_BYTES (WORD_ROWS * 128)  // one warp's word rows x 32 columns, in its lanes' read order
#define W_STAGE (WARPS * W_WARP_BYTES)
#define SZ_BYTES (4 * BN * GROUPS_PER_TILE)  // per group of the tile, its BN scales, then BN zeros
#define SZ_STAGE (SZ_BYTES + 2 * BN * GROUPS_PER_TILE * OFFSETS)  // bytes: then each group's BN offsets
#define STAGE_BYTES (X_STAGE + W_STAGE + SZ_STAGE)
#define ONES 0x3F803F80u  // bf16x2 (1, 1)

#include "int4_pairs.cuh"
#include "pdl.cuh"

__device__ __forceinline__ u32 smem_at(const void* p) { return static_cast<u32>(__cvta_generic_to_shared(p)); }

// src_bytes 0 fills the 16 bytes with zeros (x rows past M: their mma columns reach no stored output)
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes = 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_at(dst)), "l"(src), "r"(src_bytes)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

__device__ __forceinline__ void mma_bf16(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void ldmatrix_x4(u32* b, const void* at) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                 : "r"(smem_at(at)));
}

__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    u32 d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

__device__ __forceinline__ u32 fma_bf16x2(u32 a, u32 b, u32 c) {
    u32 d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

#include "w4a16_gemm_ring.cuh"

// A lane's weight words of one K tile: for int4 the pairs below, for int8 (w8a16_dequant.cuh) its 32 words.
typedef u32 Words[WORD_ROWS / 8][2][2][2];

#if BITS == 4
// The stage's weights as this lane's A pairs: p[h][hi][c][v] holds, for word rows (2t + 8h, 2t + 8h + 1) of
// column (hi ? 16 : 0) + 2g + c, nibbles 4v..4v+3 of each (byte_perm: the first row's in the low half).
// Pair j % 4 of p[..][j / 4] is then (q at K row 16j + 2t + 8h, q at the next row).
__device__ __forceinline__ void read_words(Words& p, const char* stage, int warp, int lane) {
    const uint2* w = reinterpret_cast<const uint2*>(stage + X_STAGE) + warp * (W_WARP_BYTES / 8);
    const int at = 8 * (lane & 3) + (lane >> 2);  // chunk t * 4 + g / 2 of the read, half g % 2
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
            const uint2 r0 = w[((h * 2 + 0) * 2 + hi) * 32 + at];  // word row 2t + 8h
            const uint2 r1 = w[((h * 2 + 1) * 2 + hi) * 32 + at];  // word row 2t + 8h + 1
            p[h][hi][0][0] = __byte_perm(r0.x, r1.x, 0x5410);
            p[h][hi][0][1] = __byte_perm(r0.x, r1.x, 0x7632);
            p[h][hi][1][0] = __byte_perm(r0.y, r1.y, 0x5410);
            p[h][hi][1][1] = __byte_perm(r0.y, r1.y, 0x7632);
        }
    }
}
#endif

// The stage's scales (x) and zeros (y) of columns col, col + 1 (c = 0, 1) of this lane's half hi, as bf16x2,
// for the tile's group gi.
__device__ __forceinline__ uint2 group_words(const char* stage, int warp, int g, int hi, int gi) {
    const u32* sz = reinterpret_cast<const u32*>(stage + X_STAGE + W_STAGE) + gi * BN;
    const int col = warp * 32 + hi * 16 + 2 * g;
    return make_uint2(sz[col / 2], sz[BN / 2 + col / 2]);
}

__device__ __forceinline__ float bf16_half(u32 w, int c) {  // bf16 c of the pair w, as fp32 (exact)
    return __uint_as_float(c ? w & 0xFFFF0000u : w << 16);
}

// x's B fragments for K chunk pair j and token tiles (2 pr, 2 pr + 1): lanes 8q..8q+7 give the rows of
// matrix q of ldmatrix.x4 (token tile 2 pr + q / 2, K chunk 2j + q % 2).
__device__ __forceinline__ void read_x(u32 (&b)[4], const char* stage, int j, int pr, int lane) {
    const int row = 16 * pr + ((lane >> 4) << 3) + (lane & 7), kc = 2 * j + ((lane >> 3) & 1);
    ldmatrix_x4(b, stage + x_stage_offset(row, kc));
}

// The stage's offsets of columns col, col + 1 of this lane's half hi as bf16x2, for the tile's group gi
// (-0, -0 without OFFSETS: adding it changes nothing, and the compiler folds it).
__device__ __forceinline__ u32 offset_word(const char* stage, int warp, int g, int hi, int gi) {
#if OFFSETS
    const u32* off = reinterpret_cast<const u32*>(stage + X_STAGE + W_STAGE + SZ_BYTES) + gi * (BN / 2);
    return off[(warp * 32 + hi * 16 + 2 * g) / 2];
#else
    return 0x80008000u;
#endif
}

#if BITS == 4
// Per column (hi, c) of this lane: (s, s), (-(128 + z), -(128 + z)) and (o, o) as bf16x2, of the tile's
// group gi.
__device__ __forceinline__ void read_group(u32 (&s)[2][2], u32 (&nz)[2][2], u32 (&o)[2][2], const char* stage,
                                           int warp, int g, int gi) {
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
        const uint2 w = group_words(stage, warp, g, hi, gi);
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            s[hi][c] = __byte_perm(w.x, w.x, c ? 0x3232 : 0x1010);
            const u32 off = offset_word(stage, warp, g, hi, gi);
            o[hi][c] = OFFSETS ? __byte_perm(off, off, c ? 0x3232 : 0x1010) : off;  // a prmt is not folded
            const float z = bf16_half(w.y, c);
            const u32 b = __float_as_uint(-(128.f + z)) >> 16;  // exact: an integer below 256
            nz[hi][c] = b | (b << 16);
        }
    }
}

// bf16x2 (q_a - z) s + o, (q_b - z) s + o for pair i of p: (128 + q) by one lop3, minus (128 + z) exactly,
// then scaled and offset in one FMA (o -0 without offsets: the product rounded once).
__device__ __forceinline__ u32 dequant(u32 p, int i, u32 s, u32 nz, u32 o) {
    return fma_bf16x2(fma_bf16x2(biased_pair(p, i), ONES, nz), s, o);
}

// k-step j's A fragments of mma blocks c = 0, 1, dequantized with its group's s, nz and o (read_group).
__device__ __forceinline__ void dequant_step(u32 (&a)[2][4], const Words& p, const u32 (&s)[2][2],
                                             const u32 (&nz)[2][2], const u32 (&o)[2][2], int j) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        a[c][0] = dequant(p[0][0][c][j / 4], j % 4, s[0][c], nz[0][c], o[0][c]);  // row g, K 16j + 2t
        a[c][1] = dequant(p[0][1][c][j / 4], j % 4, s[1][c], nz[1][c], o[1][c]);  // row g + 8
        a[c][2] = dequant(p[1][0][c][j / 4], j % 4, s[0][c], nz[0][c], o[0][c]);  // row g, K 16j + 2t + 8
        a[c][3] = dequant(p[1][1][c][j / 4], j % 4, s[1][c], nz[1][c], o[1][c]);
    }
}

// k-step j's A fragments as (q - z) exactly, unscaled (SCALE_AFTER builds): 128 + q less 128 + z, integers below
// 256, in one bf16x2 FMA.
__device__ __forceinline__ void unscaled_step(u32 (&a)[2][4], const Words& p, const u32 (&nz)[2][2], int j) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        a[c][0] = fma_bf16x2(biased_pair(p[0][0][c][j / 4], j % 4), ONES, nz[0][c]);
        a[c][1] = fma_bf16x2(biased_pair(p[0][1][c][j / 4], j % 4), ONES, nz[1][c]);
        a[c][2] = fma_bf16x2(biased_pair(p[1][0][c][j / 4], j % 4), ONES, nz[0][c]);
        a[c][3] = fma_bf16x2(biased_pair(p[1][1][c][j / 4], j % 4), ONES, nz[1][c]);
    }
}
#else
#include "w8a16_dequant.cuh"
#endif

// d[c][nt] += A (the k-step's fragments a[c]) x the CTA's tokens of K chunk pair j.
__device__ __forceinline__ void mma_step(float (&d)[2][2 * NT_PAIRS][4], const u32 (&a)[2][4], const char* stage,
                                         int j, int lane) {
#pragma unroll
    for (int pr = 0; pr < NT_PAIRS; ++pr) {
        u32 b[4];
        read_x(b, stage, j, pr, lane);
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            mma_bf16(d[c][2 * pr], a[c], b[0], b[1]);
            if (2 * pr + 1 < NT) mma_bf16(d[c][2 * pr + 1], a[c], b[2], b[3]);
        }
    }
}

#if SCALE_AFTER
// acc += s t: a group's fp32 sums of x (q - z) t, scaled once per column (s from read_group, bf16x2 (s, s)).
template <int TILES>
__device__ __forceinline__ void add_scaled(float (&acc)[2][TILES][4], const float (&t)[2][TILES][4],
                                           const u32 (&s)[2][2]) {
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e)  // e: (token 2t | 2t + 1) x (row g | g + 8)
                acc[c][nt][e] = fmaf(bf16_half(s[e >> 1][c], 0), t[c][nt][e], acc[c][nt][e]);
}
#endif

// acc[c][nt] += this warp's 32 columns x the CTA's tokens over one K tile: dequantized pairs, or with
// SCALE_AFTER (biased builds without offsets) q - z summed per group and scaled once, which needs no x sums
// (w4a16_gemm_biased.cuh's ones-mma) and one FMA a pair, not two.
__device__ __forceinline__ void mma_stage(float (&acc)[2][2 * NT_PAIRS][4], const char* stage, int warp, int lane) {
    const int g = lane >> 2;
    Words p;
    read_words(p, stage, warp, lane);
#pragma unroll
    for (int gi = 0; gi < GROUPS_PER_TILE; ++gi) {
        u32 s[2][2], nz[2][2], o[2][2];
        read_group(s, nz, o, stage, warp, g, gi);
#if SCALE_AFTER
        float t[2][2 * NT_PAIRS][4] = {};
#else
        float (&t)[2][2 * NT_PAIRS][4] = acc;
#endif
#pragma unroll
        for (int j = gi * STEPS_PER_GROUP; j < (gi + 1) * STEPS_PER_GROUP; ++j) {
            u32 a[2][4];
#if SCALE_AFTER
            unscaled_step(a, p, nz, j);
#else
            dequant_step(a, p, s, nz, o, j);
#endif
            mma_step(t, a, stage, j, lane);
        }
#if SCALE_AFTER
        add_scaled(acc, t, s);
#endif
    }
}

#if BIASED && !SCALE_AFTER
#include "w4a16_gemm_biased.cuh"
#endif
#if WGMMA
#include "w4a16_gemm_wgmma.cuh"
#endif

#if CLUSTER_REDUCE
#include "w4a16_gemm_cluster.cuh"
#endif

// x [M, K] bf16 (row stride stride_x), qweight int32 [K/8, N], scales/zeros bf16 [K/G, N], offsets bf16
// [K/G, N] (read with OFFSETS only), y [M, N] bf16.
// Dynamic shared memory: STAGES * STAGE_BYTES (the sums of the split path reuse it), and for WGMMA 1024 bytes
// more, to start the ring on a 1024-byte boundary.
extern "C" __global__ void __launch_bounds__(WARPS * 32) w4a16_gemm(
    const u16* __restrict__ x, const u32* __restrict__ qweight, const u16* __restrict__ scales,
    const u16* __restrict__ zeros, const u16* __restrict__ offsets, u16* __restrict__ y, int m, int n, int k,
    int stride_x, int stride_y) {
    gdc_launch_dependents();  // the next kernel's CTAs may take each slot this grid frees
    extern __shared__ uint4 smem_raw[];
    char* smem = reinterpret_cast<char*>(smem_raw);
#if WGMMA
    smem += (1024 - (smem_at(smem) & 1023)) & 1023;
#endif
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n0 = blockIdx.x * BN, m0 = blockIdx.z * BM;
    const int all_tiles = k / TILE, slices = gridDim.y;
    const int t_lo = blockIdx.y * all_tiles / slices, count = (blockIdx.y + 1) * all_tiles / slices - t_lo;
    x += (long long)m0 * stride_x;
    const int m_left = min(m - m0, BM);

    const Fetch f = plan_fetch(qweight, scales, zeros, offsets, x, n, n0, stride_x, m_left);

    // The weight is never written by a predecessor: the first stages' weights load while it drains; each
    // stage's commit group closes with its x, so "group i done" = tile i landed.
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i)
        if (i < count) fetch_weight(stage_at(smem, i), f, t_lo + i, n);
    gdc_wait();
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) {
        if (i < count) fetch_x(x_at(smem, i), f, t_lo + i, stride_x);
        cp_async_commit();
    }

    float acc[2][2 * NT_PAIRS][4] = {};  // padded to whole pairs: every index below is in bounds
    for (int i = 0; i < count; ++i) {
        asm volatile("cp.async.wait_group %0;" ::"n"(STAGES - 2) : "memory");
        __syncthreads();  // tile i is visible to all, and every warp is done with tile i - 1's stage
        const int ahead = i + STAGES - 1;
        if (ahead < count) {
            fetch_weight(stage_at(smem, ahead % STAGES), f, t_lo + ahead, n);
            fetch_x(x_at(smem, ahead % STAGES), f, t_lo + ahead, stride_x);
        }
        cp_async_commit();
#if BIASED && !SCALE_AFTER
        mma_stage_biased(acc, stage_at(smem, i % STAGES), warp, lane);
#elif WGMMA
        mma_stage_wgmma(acc, stage_at(smem, i % STAGES), x_at(smem, i % STAGES), warp, lane);
#else
        mma_stage(acc, stage_at(smem, i % STAGES), warp, lane);
#endif
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    y += (long long)m0 * stride_y + n0;
#if CLUSTER_REDUCE
    if (slices > 1) {
        __syncthreads();  // the stages are no longer read: they take the sums
        store_by_cluster(acc, reinterpret_cast<float*>(smem), y, m_left, stride_y, warp, lane);
        return;
    }
#endif
    // one slice: each lane's sums straight out, columns (2g, 2g + 1) as one bf16x2
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {  // e: (token 2t | 2t + 1) x (row g | g + 8)
            const int tok = 8 * nt + 2 * t + (e & 1), col = warp * 32 + (e >> 1) * 16 + 2 * g;
            if (tok < m_left) {
                u32* out = reinterpret_cast<u32*>(y + (long long)tok * stride_y + col);
                *out = pack_bf16x2(acc[0][nt][e], acc[1][nt][e]);
            }
        }
    }
}
