// w4a16_gemm.cu's split-K sums through distributed shared memory (CLUSTER_REDUCE, sm_90), included where BN,
// BM and pack_bf16x2 are defined. A column block's S K slices are one cluster (dims (1, S, 1): the slice is
// the rank). Each CTA leaves its fp32 sums in its own shared memory; then rank r adds, in slice order
// (deterministic), the r-th of S shares of the block's outputs from every rank and stores them: the adds and
// the stores are spread over the S CTAs, and no workspace, fence or counter is needed.
#include "cluster_barrier.cuh"

#define MAX_SLICES 16  // the largest cluster sm_90 allows (past 8: non-portable, nvrtc.allow_cluster)
#define SUMS_STRIDE (BN + 4)  // floats per token row: the lanes' float2 writes (rows 2t apart) hit no bank twice

__device__ __forceinline__ float4 cluster_load4(const float* local, int rank) {
    u32 remote;
    float4 v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_at(local)), "r"(rank));
    asm volatile("ld.shared::cluster.v4.f32 {%0,%1,%2,%3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(remote)
                 : "memory");
    return v;
}

// sums: [BM][SUMS_STRIDE] fp32 of this CTA's shared memory; y at the block's first token and column.
__device__ void store_by_cluster(const float (&acc)[2][2 * NT_PAIRS][4], float* sums, u16* y, int m_left,
                                 int stride_y, int warp, int lane) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int tok = 8 * nt + 2 * t + (e & 1), col = warp * 32 + (e >> 1) * 16 + 2 * g;
            *reinterpret_cast<float2*>(sums + tok * SUMS_STRIDE + col) = make_float2(acc[0][nt][e], acc[1][nt][e]);
        }
    }
    cluster_sync();  // every slice's sums are in place
    const int slices = gridDim.y, rank = blockIdx.y, quads = m_left * (BN / 4);
    const int q_hi = (rank + 1) * quads / slices;
    for (int q = rank * quads / slices + threadIdx.x; q < q_hi; q += WARPS * 32) {
        const int tok = q / (BN / 4), col = 4 * (q % (BN / 4));
        float4 part[MAX_SLICES];  // every slice's load in flight before the adds
#pragma unroll
        for (int sl = 0; sl < MAX_SLICES; ++sl)
            if (sl < slices) part[sl] = cluster_load4(sums + tok * SUMS_STRIDE + col, sl);
        float4 sum = part[0];
#pragma unroll
        for (int sl = 1; sl < MAX_SLICES; ++sl) {
            if (sl < slices) sum.x += part[sl].x, sum.y += part[sl].y, sum.z += part[sl].z, sum.w += part[sl].w;
        }
        *reinterpret_cast<uint2*>(y + (long long)tok * stride_y + col) =
            make_uint2(pack_bf16x2(sum.x, sum.y), pack_bf16x2(sum.z, sum.w));
    }
    cluster_arrive_relaxed();  // no CTA leaves (its shared memory) before the others have read it
    cluster_wait();
}
