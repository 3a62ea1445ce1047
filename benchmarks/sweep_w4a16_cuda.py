"""w4a16_gemv.cu's K slicing (ctas_per_sm) at Qwen3-8B's layer shapes beside the Triton dispatch, one run.

source benchmarks/gpu_env.sh && python benchmarks/sweep_w4a16_cuda.py [--ms 1 4]
"""

from __future__ import annotations

import argparse

import torch
from bench_w4a16 import LAYERS, Formats, copies, graph_us, nbytes
from kvpilot.runtime.kernels.w4a16_cuda import w4a16_gemv
from kvpilot.runtime.kernels.w4a16_triton import int_gemm


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", type=int, nargs="*", default=[1])
    parser.add_argument("--ctas", type=float, nargs="*", default=[0.5, 1.0, 2.0, 4.0])
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print("| layer | M | triton µs | " + " | ".join(f"cuda {c} µs" for c in args.ctas) + " |")
    for name, (n, k) in LAYERS.items():
        fmt = Formats(n, k)
        sets = copies(fmt.w4)
        for m in args.ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 0.1
            tri = graph_us(lambda x, *t: int_gemm(x, *t, 4, cuda_kernel=False), [(x, *t) for t in sets])
            cells = []
            for c in args.ctas:
                counters = torch.zeros(n // 64, device="cuda", dtype=torch.int32)

                def run(x, q, s, z, counters=counters, c=c):
                    return w4a16_gemv(x, q, s, z, sms, counters, c)

                us = graph_us(run, [(x, *t) for t in sets])
                cells.append(f"{us:.1f} ({nbytes(fmt.w4) / us / 1e3:.0f} GB/s)")
            print(f"| {name} | {m} | {tri:.1f} | " + " | ".join(cells) + " |", flush=True)
        del fmt, sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
