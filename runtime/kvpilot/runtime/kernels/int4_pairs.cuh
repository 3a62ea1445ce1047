// The int4 weight word's pairs as bf16 without arithmetic (w4a16_gemv.cu, w4a16_gemm.cu): nibble pair i of a
// word, (w >> 4i) & 0x000F000F, ORed into the bf16 exponent of 128 (0x4300), is bf16x2 (128 + q, 128 + q')
// exactly (128-255 step by 1 in bf16). One lop3: (a & b) | c.
#pragma once

__device__ __forceinline__ unsigned int biased_pair(unsigned int word, int i) {
    unsigned int d;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(word >> (4 * i)), "n"(0x000F000F), "n"(0x43004300));
    return d;
}
