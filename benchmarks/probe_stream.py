"""What a kernel that only streams its bytes costs per call in the GEMM bench's setting (CUDA-graph
replays of back-to-back calls over rotating copies, bench_w4a16.graph_us): the line a + bytes / BW that any
weight-only GEMM at these sizes sits on or above. probe_stream.cu; sizes are Qwen3-8B's int4 layers.

source benchmarks/gpu_env.sh && python benchmarks/probe_stream.py
"""

from __future__ import annotations

from pathlib import Path

import torch
from bench_w4a16 import copies, graph_us
from kvpilot.runtime.kernels.nvrtc import compile_cuda, launch_pdl

SOURCE = Path(__file__).with_name("probe_stream.cu")
SIZES_MB = {"o": 8.9, "qkv": 13.4, "down": 26.7, "gate_up": 53.5}  # int4 weight + scales + zeros


def main() -> None:
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print("| bytes | CTAs/SM | unroll | release | µs | GB/s |")
    for name, mb in SIZES_MB.items():
        for ctas_per_sm in (2, 3, 4):
            ctas = ctas_per_sm * sms
            per_cta = int(mb * 1e6 / 16 / ctas)
            words = ctas * per_cta * 4
            data = (torch.randint(-(2**31), 2**31 - 1, (words,), dtype=torch.int32, device="cuda"),)
            sets = copies(data)
            for unroll in (4, 8):
                for release in (0, 1, 2):
                    kernel = compile_cuda(SOURCE, "stream_read", (("UNROLL", unroll), ("RELEASE", release)))
                    out = torch.zeros(ctas, dtype=torch.int32, device="cuda")

                    def run(src, kernel=kernel, release=release, out=out, grid=(ctas, 1, 1), per_cta=per_cta):
                        if release:
                            launch_pdl(kernel, grid, (128, 1, 1), [src, out, per_cta])
                        else:
                            kernel(grid=grid, block=(128, 1, 1), args=[src, out, per_cta])

                    us = graph_us(run, [(t[0],) for t in sets])
                    nbytes = ctas * per_cta * 16
                    cells = f"{ctas_per_sm} | {unroll} | {release} | {us:.2f} | {nbytes / us / 1e3:.0f}"
                    print(f"| {name} {nbytes / 1e6:.1f} MB | {cells} |", flush=True)
            del sets, data
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
