// The fixed cost of a kernel that only streams bytes (benchmarks/probe_stream.py): each CTA reads its
// contiguous chunk with 16-byte loads, UNROLL in flight per thread, and XORs them into one word it stores.
// RELEASE: 0 = no PDL instructions, 1 = launch dependents after the loads, 2 = at entry (with PDL launches).
extern "C" __global__ void __launch_bounds__(128) stream_read(const uint4* __restrict__ src, unsigned* out,
                                                             long long per_cta) {
#if RELEASE == 2
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    const uint4* p = src + blockIdx.x * per_cta;
    unsigned acc = 0;
    for (long long i = threadIdx.x; i < per_cta; i += 128 * UNROLL) {
        uint4 v[UNROLL];
#pragma unroll
        for (int j = 0; j < UNROLL; ++j) v[j] = i + 128 * j < per_cta ? __ldg(p + i + 128 * j) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < UNROLL; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    }
#if RELEASE == 1
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
#if RELEASE
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    acc = __reduce_xor_sync(0xffffffffu, acc);
    if ((threadIdx.x & 31) == 0) atomicXor(out + blockIdx.x, acc);
}
