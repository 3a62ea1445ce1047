// w4a16_gemv.cu's split-K sums through distributed shared memory (CLUSTER_REDUCE, sm_90), included where
// COLS, WARPS and f32_to_bf16 are defined.

// The S slices of a column block launched as one cluster (dims (1, S, 1), so the slice is the rank): each
// CTA's sum stays in its shared memory and rank 0 adds them in slice order (deterministic, as the workspace
// path) through distributed shared memory: no workspace round trip, fence or counter, which cost ~2 us of
// o_proj's 6.7 at one token (H200, benchmarks/probe_w4a16_parts.py).
#include "cluster_barrier.cuh"

__device__ __forceinline__ float cluster_load(const float* local, int rank) {
    const u32 at = static_cast<u32>(__cvta_generic_to_shared(local));
    u32 remote;
    float v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(at), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
    return v;
}

__device__ void store_by_cluster(const float (*sums)[COLS], u16* y, int m, int n0, int stride_y) {
    cluster_sync();  // every slice's sums are in place
    if (blockIdx.y == 0) {
        for (int i = threadIdx.x; i < m * COLS; i += WARPS * 32) {
            const int tok = i / COLS, c = i % COLS;
            float part[8];  // all slices' loads in flight before the adds (S <= 8, a portable cluster)
#pragma unroll
            for (int sl = 0; sl < 8; ++sl) part[sl] = sl < gridDim.y ? cluster_load(&sums[tok][c], sl) : 0.f;
            float sum = 0.f;
#pragma unroll
            for (int sl = 0; sl < 8; ++sl) sum += part[sl];
            y[(long long)tok * stride_y + n0 + c] = f32_to_bf16(sum);
        }
    }
    cluster_arrive_relaxed();  // no CTA leaves (its shared memory) before rank 0 has read it
    cluster_wait();
}
