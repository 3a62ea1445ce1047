// w4a16_gemm.cu's K tile for BIASED builds that keep x sums (the dispatch: those with OFFSETS; without them
// SCALE_AFTER's mma_stage runs, one FMA a pair and no ones-mma), included where read_words, read_x,
// group_words, mma_bf16, ONES and the stage layout are defined.
#pragma once

// BIASED builds (few token tiles): the A pairs go to the mmas as the lop3 makes them, bf16 (128 + q, 128 + q'),
// and each group's sums in the K tile are corrected once: acc += s (T - (128 + z) xsum) (+ o xsum with
// OFFSETS), T the group's sums of x (128 + q), xsum its sums of x (one more mma a token tile, A all ones). That saves the two bf16x2 FMAs of
// every pair (1-4 us at 8-16 tokens, benchmarks/probe_w4a16_gemm.py nodequant) for two FFMAs per sum per
// tile, which only pays while NT is small. The weight is never rounded to bf16 here: y is the exact
// (q - z) s product summed in fp32, not bitwise the reference's bf16((q - z) s).

// Per column (hi, c) of this lane: s, 128 + z and the offset o in fp32, of the tile's group gi.
__device__ __forceinline__ void read_group_f32(float (&s)[2][2], float (&zb)[2][2], float (&o)[2][2],
                                               const char* stage, int warp, int g, int gi) {
#pragma unroll
    for (int hi = 0; hi < 2; ++hi) {
        const uint2 w = group_words(stage, warp, g, hi, gi);
        const u32 off = offset_word(stage, warp, g, hi, gi);
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            s[hi][c] = bf16_half(w.x, c);
            zb[hi][c] = 128.f + bf16_half(w.y, c);
            o[hi][c] = bf16_half(off, c);
        }
    }
}

// The sums of one group's k-steps: t[c][nt] over x (128 + q), xs[nt] over x alone.
__device__ __forceinline__ void biased_steps(float (&t)[2][2 * NT_PAIRS][4], float (&xs)[2 * NT_PAIRS][4],
                                             const Words& p, const char* stage, int gi, int lane) {
    const u32 ones[4] = {ONES, ONES, ONES, ONES};
#pragma unroll
    for (int j = gi * STEPS_PER_GROUP; j < (gi + 1) * STEPS_PER_GROUP; ++j) {
        u32 a[2][4];
#pragma unroll
        for (int c = 0; c < 2; ++c) {  // as mma_stage's, without the dequantization
            a[c][0] = biased_pair(p[0][0][c][j / 4], j % 4);
            a[c][1] = biased_pair(p[0][1][c][j / 4], j % 4);
            a[c][2] = biased_pair(p[1][0][c][j / 4], j % 4);
            a[c][3] = biased_pair(p[1][1][c][j / 4], j % 4);
        }
#pragma unroll
        for (int pr = 0; pr < NT_PAIRS; ++pr) {
            u32 b[4];
            read_x(b, stage, j, pr, lane);
            mma_bf16(xs[2 * pr], ones, b[0], b[1]);
            if (2 * pr + 1 < NT) mma_bf16(xs[2 * pr + 1], ones, b[2], b[3]);
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                mma_bf16(t[c][2 * pr], a[c], b[0], b[1]);
                if (2 * pr + 1 < NT) mma_bf16(t[c][2 * pr + 1], a[c], b[2], b[3]);
            }
        }
    }
}

__device__ __forceinline__ void mma_stage_biased(float (&acc)[2][2 * NT_PAIRS][4], const char* stage, int warp,
                                                 int lane) {
    Words p;
    read_words(p, stage, warp, lane);
#pragma unroll
    for (int gi = 0; gi < GROUPS_PER_TILE; ++gi) {
        float t[2][2 * NT_PAIRS][4] = {}, xs[2 * NT_PAIRS][4] = {};  // xs [nt][e]: token 8 nt + 2t + e % 2
        biased_steps(t, xs, p, stage, gi, lane);
        float s[2][2], zb[2][2], o[2][2];
        read_group_f32(s, zb, o, stage, warp, lane >> 2, gi);
#pragma unroll
        for (int c = 0; c < 2; ++c)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) {  // e: (token 2t | 2t + 1) x (row g | g + 8)
                    const float sum = s[e >> 1][c] * fmaf(-zb[e >> 1][c], xs[nt][e & 1], t[c][nt][e]);
                    acc[c][nt][e] += OFFSETS ? fmaf(o[e >> 1][c], xs[nt][e & 1], sum) : sum;
                }
    }
}
