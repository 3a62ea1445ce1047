// Cluster barriers (sm_90) for the split-K meetings of w4a16_gemv.cu and w4a16_gemm.cu: each slice of a
// column block is one CTA of a cluster, and the slices' sums meet in distributed shared memory.
#pragma once

__device__ __forceinline__ void cluster_sync() {  // every thread of every CTA in the cluster; orders memory
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// The last meeting only keeps each CTA's shared memory alive until the others have read it. Those reads
// have returned (their values are summed) before a CTA arrives, so the arrive needs no release, which would
// first wait for the CTA's global stores to be visible.
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); }
