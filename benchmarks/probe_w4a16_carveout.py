"""Does a kernel between two int4 GEMVs undo w4a16_resident.cu's gain? (issue 12, prepared in the fifteenth
session, not yet run.) Alone, back to back, the resident GEMV beat the cluster GEMV (qkv 6.2-6.4 against
7.1 µs at one token, o 5.0-5.3 against 5.6), but W3 int4 was 4% slower with it dispatched. The guess: its
113 KB CTAs need the SM's whole shared-memory carveout, the decode step's other kernels ask for little, and
an SM must drain before it switches, so neither neighbour overlaps it under PDL.

The probe times pairs (a one-CTA RMSNorm stand-in, then the GEMV on its output) back to back in a CUDA graph
over the bench's weight copies, with each GEMV build and with the norm asking for the driver's carveout or
all of it as shared memory (cuFuncSetAttribute PREFERRED_SHARED_MEMORY_CARVEOUT). If the guess holds, the
resident pair loses with the default and wins at 100%.

source benchmarks/gpu_env.sh && python benchmarks/probe_w4a16_carveout.py --layers qkv o
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import torch
from bench_w4a16 import LAYERS, Formats, copies, graph_us
from kvpilot.runtime.kernels.nvrtc import compile_cuda, launch_pdl, prefer_carveout
from kvpilot.runtime.kernels.w4a16_cuda import w4a16_gemv
from kvpilot.runtime.kernels.w4a16_resident import w4a16_resident

# one CTA: out = h / rms(h) (no weight) over the first k values of h, released at entry, waits for h
NORM = r"""
#include "pdl.cuh"
extern "C" __global__ void norm_stand_in(const unsigned short* h, unsigned short* out, int k) {
    gdc_launch_dependents();
    gdc_wait();
    __shared__ float part[32];
    float ss = 0.f;
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        const float v = __uint_as_float((unsigned)h[i] << 16);
        ss += v * v;
    }
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = ss;
    __syncthreads();
    float total = 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) total += part[w];
    const float scale = rsqrtf(total / k + 1e-6f);
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        unsigned short b;
        const float v = __uint_as_float((unsigned)h[i] << 16) * scale;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(v));
        out[i] = b;
    }
}
"""


def norm_kernel() -> Any:
    source = Path(tempfile.gettempdir()) / "norm_stand_in.cu"
    source.write_text(NORM)
    return compile_cuda(source, "norm_stand_in", ())


class Pairs:
    """One layer's GEMV calls over the weight copies: alone, and each after the norm stand-in on the
    previous call's output (a dependent chain, as in a decode step)."""

    def __init__(self, gemv: Any, norm: Any, fmt: Formats, k: int) -> None:
        self.gemv, self.norm, self.counters, self.k = gemv, norm, fmt.counters, k
        self.x = torch.empty(1, k, device="cuda", dtype=torch.bfloat16)
        self.last = torch.randn(1, max(k, fmt.w4[0].shape[1]), device="cuda", dtype=torch.bfloat16)

    def alone(self, q: torch.Tensor, s: torch.Tensor, z: torch.Tensor) -> Any:
        return self.gemv(self.x, q, s, z, self.counters)

    def pair(self, q: torch.Tensor, s: torch.Tensor, z: torch.Tensor) -> Any:
        launch_pdl(self.norm, (1, 1, 1), (256, 1, 1), [self.last, self.x, self.k])
        self.last = self.gemv(self.x, q, s, z, self.counters)
        return self.last


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", nargs="*", default=["qkv", "o"])
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    norm = norm_kernel()
    gemvs = {
        "cluster GEMV": lambda x, q, s, z, c: w4a16_gemv(x, q, s, z, sms, c),
        "resident": lambda x, q, s, z, c: w4a16_resident(x, q, s, z, sms),
    }
    print("| layer | GEMV | alone µs | after the norm, driver carveout µs | after the norm, 100% shared µs |")
    for name in args.layers:
        n, k = LAYERS[name]
        fmt = Formats(n, k)
        sets = copies(fmt.w4)
        for label, gemv in gemvs.items():
            pairs = Pairs(gemv, norm, fmt, k)
            cells = [graph_us(pairs.alone, sets)]
            for carveout in (-1, 100):
                prefer_carveout(norm, carveout)
                cells.append(graph_us(pairs.pair, sets))
            print(f"| {name} | {label} | " + " | ".join(f"{c:.1f}" for c in cells) + " |", flush=True)
        del fmt, sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
