// w4a16_gemv.cu's fused RMSNorm (NORM, one token): x = bf16(h * rsqrt(mean(h^2) + eps) * w) with
// h = hidden + residual, as kernels/norm.py's rms_norm_ref, made by every CTA for its own K slice, so the
// separate norm kernel (and its wait on the GEMV before it) goes. Every CTA reads the whole row for the sum
// of squares (8 KB at K = 4096, from L2); CTA (0, 0) writes h for the next residual add.

__device__ __forceinline__ float bf16_lo(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(u32 w) { return __uint_as_float(w & 0xFFFF0000u); }

__device__ __forceinline__ u32 bf16x2(float lo, float hi) {
    u32 d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

// 8 values of h from K row k on: each sum rounded to bf16, as torch adds two bf16 tensors. Plain loads:
// hidden and residual are the previous kernels' outputs.
__device__ __forceinline__ uint4 residual_add(const u16* hidden, const NormArgs& norm, int k) {
    const uint4 a = *reinterpret_cast<const uint4*>(hidden + k);
    if (!norm.add) return a;
    const uint4 b = *reinterpret_cast<const uint4*>(norm.residual + k);
    const u32* pa = &a.x;
    const u32* pb = &b.x;
    u32 h[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
        h[i] = bf16x2(bf16_lo(pa[i]) + bf16_lo(pb[i]), bf16_hi(pa[i]) + bf16_hi(pb[i]));
    return make_uint4(h[0], h[1], h[2], h[3]);
}

// 1 / rms of the row (all threads; returns the same value in each); CTA (0, 0) also stores h.
__device__ float inverse_rms(const u16* hidden, const NormArgs& norm, int k) {
    __shared__ float warp_sums[WARPS];
    const bool writer = norm.add && blockIdx.x == 0 && blockIdx.y == 0;
    float ss = 0.f;
#pragma unroll 4
    for (int i = threadIdx.x * 8; i < k; i += WARPS * 32 * 8) {
        const uint4 h = residual_add(hidden, norm, i);
        if (writer) *reinterpret_cast<uint4*>(norm.h_out + i) = h;
        const u32* p = &h.x;
#pragma unroll
        for (int j = 0; j < 4; ++j) ss += bf16_lo(p[j]) * bf16_lo(p[j]) + bf16_hi(p[j]) * bf16_hi(p[j]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
    if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = ss;
    __syncthreads();
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) total += warp_sums[w];
    return rsqrtf(total / k + norm.eps);
}

// 8 values of x from K row k on: (h * inv) * w in fp32, rounded once to bf16.
__device__ __forceinline__ uint4 normed_chunk(const u16* hidden, const NormArgs& norm, int k, float inv) {
    const uint4 h = residual_add(hidden, norm, k);
    const uint4 w = __ldg(reinterpret_cast<const uint4*>(norm.weight + k));
    const u32* ph = &h.x;
    const u32* pw = &w.x;
    u32 x[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
        x[i] = bf16x2(bf16_lo(ph[i]) * inv * bf16_lo(pw[i]), bf16_hi(ph[i]) * inv * bf16_hi(pw[i]));
    return make_uint4(x[0], x[1], x[2], x[3]);
}
