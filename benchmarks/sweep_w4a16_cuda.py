"""w4a16_gemv.cu's builds and slicings at Qwen3-8B's layer shapes, beside bf16 cuBLAS and the Triton
dispatch, one run; each CUDA cell's error against the Triton output is printed. A variant is key=value
pairs joined by commas, each defaulting to the dispatched launch: ctas (K slices until ~ctas CTAs per SM) or
slices (exactly), stages (register ring depth), early (1: release the next kernel at entry, 0: after the K
loop), min (the launch bound's CTAs
per SM), warps, cluster (1: the slices meet in a cluster's shared memory; 2..8 slices); dispatch=1 is
the launch w4a16_gemv takes by itself. Each cell ends with its launch's CTAs, or its clusters against those
the GPU holds at once.

source benchmarks/gpu_env.sh && python benchmarks/sweep_w4a16_cuda.py --ms 1 4 --variants early=1 cluster=1
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
import torch.nn.functional as F
from bench_w4a16 import LAYERS, Formats, copies, graph_us, sweep_cell
from kvpilot.runtime.kernels.nvrtc import max_active_clusters
from kvpilot.runtime.kernels.w4a16_cuda import (
    CTAS_PER_SM,
    STAGES,
    WARPS,
    W4Launch,
    cluster_fits,
    compiled,
    dispatched_launch,
    launch_for,
    w4a16_gemv,
)
from kvpilot.runtime.kernels.w4a16_triton import int_gemm


def variant_plan(case: dict[str, str], m: int, n: int, k: int, sms: int) -> W4Launch:
    get = {key: float(value) for key, value in case.items()}.get
    if get("dispatch"):
        return dispatched_launch(m, n, k, 128, sms, hopper=True)
    plan = launch_for(
        m, n, k, 128, sms, get("ctas", CTAS_PER_SM), int(get("stages", STAGES)), int(get("min", 1)),
        clusters=bool(get("cluster", 0)),
    )  # fmt: skip
    slices = int(get("slices", plan.slices))
    spec = dataclasses.replace(
        plan.spec,
        early_release=bool(get("early", 1)),
        warps=int(get("warps", WARPS)),
        cluster_reduce=bool(get("cluster", 0)) and cluster_fits(slices),
    )
    return dataclasses.replace(plan, spec=spec, slices=slices)


def waves(plan: W4Launch, n: int) -> str:
    """A cluster build's clusters against those the GPU holds at once (cuOccupancyMaxActiveClusters)."""
    if not plan.spec.cluster_reduce:
        return f"{n // 64 * plan.slices} CTAs"
    kernel = compiled(plan.spec)
    try:
        held = max_active_clusters(kernel, (plan.spec.warps * 32, 1, 1), 0, (1, plan.slices, 1))
    except RuntimeError as error:  # a diagnostic: the cell's time stands without it
        return f"{n // 64} clusters / held unknown ({str(error)[-24:]})"
    return f"{n // 64} clusters / {held} held"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", type=int, nargs="*", default=[1])
    parser.add_argument("--variants", nargs="*", default=["early=0", "early=1"])
    parser.add_argument("--layers", nargs="*", default=[])
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cases = [dict(item.split("=") for item in v.split(",")) for v in args.variants]
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
            for case in cases:
                counters = torch.zeros(n // 64, device="cuda", dtype=torch.int32)
                plan = variant_plan(case, m, n, k, sms)

                def run(x, q, sc, z, counters=counters, plan=plan):
                    return w4a16_gemv(x, q, sc, z, sms, counters, plan)

                cells.append(sweep_cell(run, x, fmt.w4, sets, want, bf16) + f", {waves(plan, n)}")
            row = f"| {name} | {m} | {bf16:.1f} | {tri:.1f} ({bf16 / tri:.2f}×) | " + " | ".join(cells) + " |"
            print(row, flush=True)
        del fmt, sets, dense
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
