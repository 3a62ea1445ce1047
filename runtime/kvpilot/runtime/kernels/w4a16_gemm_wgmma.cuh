// w4a16_gemm.cu's Hopper tensor-core path (WGMMA, sm_90a), included where read_words, read_group, dequant
// and the x core-matrix layout (x_core) are defined: the same dequantized A fragments, fed to
// wgmma.mma_async (A from registers, 64 x 64 x 16 per warpgroup) instead of mma.sync, which on Hopper
// issues at about half the tensor cores' rate (the mma.sync build measured ~7 cycles per m16n8k16 per SM
// quarter at 64 tokens: the compute floor of the whole GEMM).
//
// The CTA's 4 warps are one warpgroup: wgmma c (0, 1) takes A rows 16w..16w+15 from warp w's fragment of
// mma block c, so its 64 rows are the columns (32w + 2g + c | 32w + 16 + 2g + c) of the 4 warps, and its
// accumulator fragment is acc[c] exactly as the mma.sync build lays it out (the epilogues are shared).
#if NT != 8
#error "the wgmma build takes 64 tokens (NT = 8) per CTA"
#endif
#if WARPS != 4
#error "the wgmma build is one warpgroup (WARPS = 4)"
#endif

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// The shared-memory matrix descriptor of B (x: K 16 x 64 tokens, K-major, no swizzle): start address,
// LBO (the next core matrix along K: XG groups on), SBO (the next 8 tokens: 128 bytes on), all >> 4.
__device__ __forceinline__ unsigned long long x_descriptor(u32 at) {
    const unsigned long long lbo = (XG * 128) >> 4, sbo = 128 >> 4;
    return (unsigned long long)((at >> 4) & 0x3FFF) | (lbo << 16) | (sbo << 32);
}

// d [64 rows of this warpgroup][64 tokens] += A (registers) B (descriptor): d[nt][e] as mma.sync's acc[c][nt][e]
__device__ __forceinline__ void wgmma_64x64(float (&d)[8][4], const u32* a, unsigned long long b) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),
          "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),
          "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
          "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),
          "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),
          "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
          "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
          "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// acc += the warpgroup's 128 columns x 64 tokens over one K tile. A fragments alternate between two sets:
// a set is rewritten only after the wgmmas that read it have completed (wait_group 1: at most the last
// step's pair still in flight).
__device__ __forceinline__ void wgmma_stage(float (&acc)[2][8][4], const char* stage, int warp, int lane) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // cp.async wrote x: wgmma reads it async
    const int g = lane >> 2;
    u32 p[2][2][2][2], s[2][2], nz[2][2], a[2][2][4];
    read_words(p, stage, warp, lane);
    read_group(s, nz, stage, warp, g);
    const u32 x0 = smem_at(stage);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        u32 (&aj)[2][4] = a[j & 1];
        if (j >= 2) wgmma_wait<1>();
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            aj[c][0] = dequant(p[0][0][c][j / 4], j % 4, s[0][c], nz[0][c]);
            aj[c][1] = dequant(p[0][1][c][j / 4], j % 4, s[1][c], nz[1][c]);
            aj[c][2] = dequant(p[1][0][c][j / 4], j % 4, s[0][c], nz[0][c]);
            aj[c][3] = dequant(p[1][1][c][j / 4], j % 4, s[1][c], nz[1][c]);
        }
        wgmma_fence();
        const unsigned long long b = x_descriptor(x0 + x_core(0, 2 * j));  // K chunks 2j, 2j + 1
        wgmma_64x64(acc[0], aj[0], b);
        wgmma_64x64(acc[1], aj[1], b);
        wgmma_commit();
    }
    wgmma_wait<0>();  // the stage is refilled after the next barrier; acc is read after the loop
}
