// w4a16_gemm.cu's int8 weights (BITS 8), included where Words, X_STAGE, W_WARP_BYTES, group_words,
// offset_word, bf16_half and fma_bf16x2 are defined: read_words, read_group, dequant_step as the int4 ones,
// so mma_stage and mma_stage_wgmma take either.
//
// Why not int4's trick: 128 + q is a bf16 only while q < 128 (7 mantissa bits). A byte u in the low mantissa
// byte of fp32 2^23 is 2^23 + u exactly; one FADD of -(2^23 + z) leaves u - z exactly, an integer of at most
// 8 significant bits, so the fp32's upper half is that value as bf16 (no rounding); one bf16x2 FMA then
// scales and offsets the pair, rounding once: bitwise the reference's bf16((u - z) s). Per pair 3 prmt,
// 2 FADD, 1 HFMA2, against int4's lop3 and 2 HFMA2 a pair: the same per byte of weight.
//
// Lane (g, t) and k-step j = 2b + h2 (byte b of the words, half h2 of the tile's 32 word rows): A rows
// 16j + 2t (+1) and +8 (+9) are byte b of word rows 16 h2 + 2t (+1) and 16 h2 + 8 + 2t (+1).
#pragma once

#define MAGIC_F32 0x4B000000u  // fp32 2^23: one step per unit in its low mantissa byte

// The stage's weight words of this lane: p[hq][hi][c][e] is word row 8 hq + 2t + e of column (hi ? 16 : 0) +
// 2g + c (the stage's read order, w_chunk, with hq = r / 8 from 0 to 3).
__device__ __forceinline__ void read_words(Words& p, const char* stage, int warp, int lane) {
    const uint2* w = reinterpret_cast<const uint2*>(stage + X_STAGE) + warp * (W_WARP_BYTES / 8);
    const int at = 8 * (lane & 3) + (lane >> 2);
#pragma unroll
    for (int hq = 0; hq < 4; ++hq) {
#pragma unroll
        for (int hi = 0; hi < 2; ++hi) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const uint2 r = w[((hq * 2 + e) * 2 + hi) * 32 + at];
                p[hq][hi][0][e] = r.x;
                p[hq][hi][1][e] = r.y;
            }
        }
    }
}

// Per column (hi, c) of this lane: (s, s) and (o, o) as bf16x2 and -(2^23 + z) as fp32 bits, of the tile's
// group gi.
__device__ __forceinline__ void read_group(u32 (&s)[2][2], u32 (&nz)[2][2], u32 (&o)[2][2], const char* stage,
                                           int warp, int g, int gi) {
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
        const uint2 w = group_words(stage, warp, g, hi, gi);
        const u32 off = offset_word(stage, warp, g, hi, gi);
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            s[hi][c] = __byte_perm(w.x, w.x, c ? 0x3232 : 0x1010);
            o[hi][c] = OFFSETS ? __byte_perm(off, off, c ? 0x3232 : 0x1010) : off;
            nz[hi][c] = __float_as_uint(-(8388608.f + bf16_half(w.y, c)));  // exact: z a whole number < 256
        }
    }
}

// bf16x2 (u_a - z) s + o, (u_b - z) s + o for byte b of the two words w (rows 2t, 2t + 1).
__device__ __forceinline__ u32 dequant(const u32 (&w)[2], int b, u32 s, u32 nz, u32 o) {
    const float lo = __uint_as_float(__byte_perm(w[0], MAGIC_F32, 0x7650 | b)) + __uint_as_float(nz);
    const float hi = __uint_as_float(__byte_perm(w[1], MAGIC_F32, 0x7650 | b)) + __uint_as_float(nz);
    return fma_bf16x2(__byte_perm(__float_as_uint(lo), __float_as_uint(hi), 0x7632), s, o);
}

// k-step j's A fragments of mma blocks c = 0, 1, dequantized with its group's s, nz and o (read_group).
__device__ __forceinline__ void dequant_step(u32 (&a)[2][4], const Words& p, const u32 (&s)[2][2],
                                             const u32 (&nz)[2][2], const u32 (&o)[2][2], int j) {
    const int b = j >> 1, hq = 2 * (j & 1);
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        a[c][0] = dequant(p[hq][0][c], b, s[0][c], nz[0][c], o[0][c]);  // row g, K 16j + 2t
        a[c][1] = dequant(p[hq][1][c], b, s[1][c], nz[1][c], o[1][c]);  // row g + 8
        a[c][2] = dequant(p[hq + 1][0][c], b, s[0][c], nz[0][c], o[0][c]);  // row g, K 16j + 2t + 8
        a[c][3] = dequant(p[hq + 1][1][c], b, s[1][c], nz[1][c], o[1][c]);
    }
}
