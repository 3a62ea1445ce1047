"""w4a16_gemv.cu's builds and slicings at Qwen3-8B's layer shapes, beside bf16 cuBLAS and the Triton
dispatch, one run; each CUDA cell's error against the Triton output is printed. A variant is
CTAS:STAGES:EARLY[:RING:MIN] (K slices until ~CTAS CTAs per SM, or sN: N slices; register ring depth,
1 = release the next kernel at entry, 0 = after the K loop; RING > 0: shared-memory stages per warp in
place of the register ring, MIN: the launch bound's CTAs per SM).

source benchmarks/gpu_env.sh && python benchmarks/sweep_w4a16_cuda.py [--ms 1 4 16] [--variants 3:2:0 3:2:1]
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
import torch.nn.functional as F
from bench_w4a16 import LAYERS, Formats, copies, graph_us, nbytes
from kvpilot.runtime.kernels.w4a16_cuda import launch_for, w4a16_gemv
from kvpilot.runtime.kernels.w4a16_triton import int_gemm


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", type=int, nargs="*", default=[1])
    parser.add_argument("--variants", nargs="*", default=["3:2:0", "3:2:1"])
    parser.add_argument("--layers", nargs="*", default=[])
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    optin = torch.cuda.get_device_properties(0).shared_memory_per_block_optin - 1024
    cases = [v.split(":") for v in args.variants]
    head = " | ".join(f"cuda {v} µs (×bf16)" for v in args.variants)
    print(f"| layer | M | bf16 µs | triton µs (×bf16) | {head} |")
    for name, (n, k) in LAYERS.items():
        if args.layers and name not in args.layers:
            continue
        fmt = Formats(n, k)
        sets, dense = copies(fmt.w4), copies(fmt.bf16)
        for m in args.ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 0.1
            bf16 = graph_us(F.linear, [(x, *t) for t in dense])
            tri = graph_us(lambda x, *t: int_gemm(x, *t, 4, cuda_kernel=False), [(x, *t) for t in sets])
            want = int_gemm(x, *fmt.w4, 4, cuda_kernel=False).float()
            cells = []
            for ctas, stages, early, *shared in cases:
                counters = torch.zeros(n // 64, device="cuda", dtype=torch.int32)
                ring, min_ctas = (int(v) for v in shared) if shared else (0, 1)
                per_sm = float(ctas.lstrip("s"))
                plan = launch_for(m, n, k, 128, sms, per_sm, int(stages), ring, min_ctas)
                spec = dataclasses.replace(plan.spec, early_release=early == "1")
                slices = int(per_sm) if ctas.startswith("s") else plan.slices
                plan = dataclasses.replace(plan, spec=spec, slices=slices)
                if plan.shared_bytes(m, k) > optin:
                    cells.append("too much shared memory")
                    continue

                def run(x, q, sc, z, counters=counters, plan=plan):
                    return w4a16_gemv(x, q, sc, z, sms, counters, plan)

                err = (run(x, *fmt.w4).float() - want).abs().max() / want.abs().max()
                us = graph_us(run, [(x, *t) for t in sets])
                gbs = nbytes(fmt.w4) / us / 1e3
                cells.append(f"{us:.1f} ({bf16 / us:.2f}×, {gbs:.0f} GB/s, err {err:.0e})")
            row = f"| {name} | {m} | {bf16:.1f} | {tri:.1f} ({bf16 / tri:.2f}×) | " + " | ".join(cells) + " |"
            print(row, flush=True)
        del fmt, sets, dense
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
