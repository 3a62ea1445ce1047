// Programmatic dependent launch (sm_90; no-ops below it, and when launched without the attribute,
// nvrtc.launch_pdl): a kernel may start while its predecessor drains; it must wait before reading what
// that wrote, and may let its own successor start early.
#pragma once

__device__ __forceinline__ void gdc_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void gdc_launch_dependents() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
