// x [M, K] bf16 staged in shared memory as mma.m16n8k16 B fragments for the int4 weight word's pairs
// (int4_pairs.cuh): w4a16_gemv.cu and w4a16_resident.cu, included where WARPS, TILE, u16 and u32 are defined.
#pragma once

// x staged as B fragments: entry (tile, rs, token, t) is the uint4 of lane (g = token % 8, t)'s registers for
// row set rs of that tile: {b0, b1} of step 0 and of step 1 (token's K rows 16 * {0,4 | 1,5 | 2,6 | 3,7} + r,
// r = 4 rs + t). Only the M real tokens are staged; lanes of token columns past M read token M - 1's entry
// (an mma's column j depends on B's column j alone, so those columns only reach outputs never stored).
__device__ __forceinline__ int x_entry(int tile, int rs, int tok, int t, int m) {
    return ((tile * 4 + rs) * m + tok) * 4 + t;
}

// Unit (token tok, tile, half h: K rows 8h..8h+7 of each 16) as eight 16-byte loads v[j] (K rows tile 128 +
// 16j + 8h ..): value r of loads j and j + 4 pair up into register j of entry (rs, t) = (r / 4, r % 4).
__device__ __forceinline__ void store_x_unit(uint4* xs, const uint4 (&v)[8], int tile, int tok, int h, int m) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        u32 reg[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const u32 lo = (&v[j].x)[i / 2], hi = (&v[j + 4].x)[i / 2];
            reg[j] = __byte_perm(lo, hi, i % 2 ? 0x7632 : 0x5410);  // (value i of load j, of load j + 4)
        }
        const int r = 8 * h + i;
        xs[x_entry(tile, r / 4, tok, r % 4, m)] = make_uint4(reg[0], reg[1], reg[2], reg[3]);
    }
}

// x's K rows [k_lo, k_lo + 128 tiles) staged as above, one unit per thread at a time (its eight 16-byte loads in
// flight together), and each unit's sum (64 values: token tok, tile, half h) into sums
// [tiles][M][2] fp32, so that a tile's sum per token is sums[.][.][0] + sums[.][.][1]: the int4 kernels apply
// a tile's zero point to it (the values are in registers already: a few FADDs, not a ones-mma per step).
__device__ void stage_x(uint4* xs, float* sums, const u16* x, int stride_x, int m, int k_lo, int tiles) {
    for (int u = threadIdx.x; u < m * tiles * 2; u += WARPS * 32) {
        const int h = u & 1, tile = (u >> 1) % tiles, tok = (u >> 1) / tiles;
        const uint4* src = reinterpret_cast<const uint4*>(x + (long long)tok * stride_x + k_lo + tile * TILE + 8 * h);
        uint4 v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = __ldg(src + 2 * j);  // 16 K rows = 2 uint4 apart
        store_x_unit(xs, v, tile, tok, h, m);
        float part[8];  // eight short chains, then a tree: this runs right after the PDL wait
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            part[j] = 0.f;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const u32 w = (&v[j].x)[i];
                part[j] += __uint_as_float(w << 16) + __uint_as_float(w & 0xFFFF0000u);
            }
        }
        sums[(tile * m + tok) * 2 + h] =
            ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    }
}

// x's sum over a staged tile for lane (g, t)'s tokens 8 nt + 2t + j (clamped to M - 1, as x_entry's columns).
template <int NTILES>
__device__ __forceinline__ void tile_xsum(float (&xsum)[NTILES][2], const float* sums, int tile, int t, int m) {
#pragma unroll
    for (int nt = 0; nt < NTILES; ++nt) {
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            const float2 v = reinterpret_cast<const float2*>(sums)[tile * m + min(8 * nt + 2 * t + j, m - 1)];
            xsum[nt][j] = v.x + v.y;
        }
    }
}
