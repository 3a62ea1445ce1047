// w4a16_gemm.cu's K tile on Hopper's warpgroup mma (WGMMA, sm_90a; 16, 32 or 64 tokens a CTA: NT = 2, 4 or 8;
// each 4 warps one warpgroup), included where read_words, read_group, dequant_step and smem_at are defined.
//
// Why: at 33-64 tokens the mma.sync build is bound by its mmas (~13 cycles each per SM quarter, about half of
// what the tensor cores do through wgmma; BENCHMARKS, eleventh session). Here the dequantized weight stays
// the A operand straight from registers, exactly the A fragments mma_stage builds (warp w's 16 rows of the
// 64-row A are its own 16 columns of mma block c), and x is B, read by the tensor cores from the stage: at 64
// tokens one wgmma.m64n64k16 per mma block and k-step stands for 16 mma.sync + 4 ldmatrix a warp. Its fp32
// sums land in the mma.sync C layout (token tile i: registers 4i..4i+3), so acc and the stores are unchanged.
//
// x's stage is laid out for it (w4a16_gemm.cu's x_stage_offset under WGMMA): two K halves of [BM tokens][128
// bytes], chunk c of token row r at c ^ (r % 8), the 128-byte swizzle the descriptor names.
#pragma once

// Shared-memory matrix descriptor of B = x^T for K rows [16 j, 16 j + 16): K-major, 128-byte swizzle
// (bits 62-63 = 1), 8-token atoms 1024 bytes apart (stride offset, bits 32-45, in 16-byte units); the
// leading offset (bits 16-29) is unused with this swizzle. A k-step moves the start by 32 bytes inside
// the 128-byte rows, which the swizzle (from the address bits) follows.
__device__ __forceinline__ unsigned long long x_descriptor(u32 stage, int j) {
    const u32 start = stage + (j >> 2) * (BM * X_ROW_BYTES) + (j & 3) * 32;
    return (unsigned long long)((start & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }

// d [64 rows x 8 NTILES tokens] += A (this warp's 16 rows from a) x B (desc): wgmma.m64n(8 NTILES)k16, its
// sums in the mma.sync C layout per token tile (for 16, 32 and 64 tokens a CTA)
template <int NTILES>
__device__ __forceinline__ void wgmma_tokens(float (&d)[NTILES][4], const u32 (&a)[4], unsigned long long desc);

template <>
__device__ __forceinline__ void wgmma_tokens<2>(float (&d)[2][4], const u32 (&a)[4], unsigned long long desc) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, "
        "1, 1, 1, 0;"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
          "+f"(d[1][2]), "+f"(d[1][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc)
        : "memory");
}

template <>
__device__ __forceinline__ void wgmma_tokens<4>(float (&d)[4][4], const u32 (&a)[4], unsigned long long desc) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,"
        "%8,%9,%10,%11,%12,%13,%14,%15}, "
        "{%16,%17,%18,%19}, %20, 1, 1, 1, 0;"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
          "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc)
        : "memory");
}

template <>
__device__ __forceinline__ void wgmma_tokens<8>(float (&d)[8][4], const u32 (&a)[4], unsigned long long desc) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
        "{%32,%33,%34,%35}, %36, 1, 1, 1, 0;"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
          "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
          "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
          "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc)
        : "memory");
}

template <>
__device__ __forceinline__ void wgmma_tokens<16>(float (&d)[16][4], const u32 (&a)[4], unsigned long long desc) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
        "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
        "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
        "{%64,%65,%66,%67}, %68, 1, 1, 1, 0;"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
          "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
          "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
          "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
          "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
          "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),
          "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]),
          "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),
          "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc)
        : "memory");
}

// acc[c] += this warp's 32 columns x the CTA's BM tokens over one K tile: each k-step's A fragments are
// dequantized into registers of their own (the wgmmas read them asynchronously until the wait), then its two
// wgmmas are issued; one wait at the tile's end frees the registers and the stage (WGMMA_WAIT_STEPS: earlier
// waits free the registers of all but the last steps issued, so fewer are live at once).
// SCALE_AFTER (16 tokens a CTA, one group a tile, no offsets): the A pairs are q - z exactly (unscaled_step,
// one bf16x2 FMA), the tile's wgmmas sum into t, and after the tile's wait acc += s t in fp32.
__device__ __forceinline__ void mma_stage_wgmma(float (&acc)[2][NT][4], const char* stage, const char* x, int warp,
                                                int lane) {
    const int g = lane >> 2;
    Words p;
    read_words(p, stage, warp, lane);
    const u32 base = smem_at(x);
    u32 a[8][2][4];
#if SCALE_AFTER
    float t[2][NT][4] = {};
    float (&sums)[2][NT][4] = t;
#else
    float (&sums)[2][NT][4] = acc;
#endif
    u32 s[2][2], nz[2][2], o[2][2];
#pragma unroll
    for (int gi = 0; gi < GROUPS_PER_TILE; ++gi) {
        read_group(s, nz, o, stage, warp, g, gi);
#pragma unroll
        for (int j = gi * STEPS_PER_GROUP; j < (gi + 1) * STEPS_PER_GROUP; ++j) {
#if SCALE_AFTER
            unscaled_step(a[j], p, nz, j);
#else
            dequant_step(a[j], p, s, nz, o, j);  // as mma_stage's fragments
#endif
            wgmma_fence();  // this step's A registers (and the sums) are written before the wgmmas read them
#pragma unroll
            for (int c = 0; c < 2; ++c) wgmma_tokens<NT>(sums[c], a[j][c], x_descriptor(base, j));
#if WGMMA_WAIT_STEPS  // the steps before the last WGMMA_WAIT_STEPS free their A registers (GemmSpec.wait_steps)
            if ((j + 1) % WGMMA_WAIT_STEPS == 0) {
                asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
                asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
            }
#endif
        }
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
#if SCALE_AFTER
    add_scaled(acc, t, s);
#endif
}
