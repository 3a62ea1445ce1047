"""w4a16_gemm.cu's builds at Qwen3-8B's layer shapes, beside bf16 cuBLAS and what ran there before it (what
int_gemm dispatches at <= 8 tokens: the decode GEMV w4a16_gemv.cu at 1-2 (1-4 for a long K), this kernel from
3 (5); above, the Triton tensor-core GEMM w4a16_mma_triton, past 128 tokens dequantize + cuBLAS), one run;
each CUDA cell's error against the bf16 GEMM of the dequantized weight is printed. A variant is key=value
pairs joined by commas, each defaulting to launch_for's ("stages=0" is launch_for's own launch): warps (32
columns each), stages, ctas (K slices until ~ctas CTAs per SM) or slices (exactly), tt (token tiles of 8 per
CTA at most), biased (token tiles of 8 up to which the mmas take 128 + q; 0: never), deep (0: not deep_split's
extra stage at 25-64 tokens, which asks the GPU how many clusters it holds), wgmma (warpgroup mmas from this
many token tiles, and at 9-16 tokens where sixteen_token_wgmma says; 0: mma.sync only; default the
dispatch's), wait (GemmSpec.wait_steps: 2, 4, or 0; default the dispatch's), after (1: the builds
unscaled_mmas allows take GemmSpec.scale_after; 0: x sums or dequantized pairs; default the dispatch's). Each
cell ends with its launch's clusters against those held at once. --group 32 / 64 quantizes the weight in
groups of that many K rows (default 128); --bits 8 times the int8 builds (symmetric; --group -1: one scale per
output channel), their before the engine's dispatch without the CUDA kernels.

source benchmarks/gpu_env.sh && python benchmarks/sweep_w4a16_gemm.py --ms 32 64 --variants warps=4 warps=8
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
import torch.nn.functional as F
from bench_w4a16 import LAYERS, Formats, copies, graph_us, sweep_cell
from kvpilot.runtime.kernels.quant_reference import dequantize_int_ref
from kvpilot.runtime.kernels.w4a16_cuda import PREFERRED_MAX_M
from kvpilot.runtime.kernels.w4a16_gemm_cuda import clusters_held, w4a16_gemm
from kvpilot.runtime.kernels.w4a16_gemm_plan import (
    BIASED_MAX_TOKEN_TILES,
    CTAS_PER_SM,
    MAX_TOKEN_TILES,
    SCALE_AFTER,
    STAGES,
    WGMMA_FIRST_TOKEN_TILES,
    GemmLaunch,
    launch_for,
)
from kvpilot.runtime.kernels.w4a16_mma_triton import int_gemm_mma, mma_dispatched
from kvpilot.runtime.kernels.w4a16_triton import dequantize_triton, int_gemm
from kvpilot.runtime.quant.int_weight import quantize_rtn


def variant_plan(
    case: dict[str, str], m: int, n: int, k: int, sms: int, group: int = 128, bits: int = 4
) -> GemmLaunch:
    get = {key: float(value) for key, value in case.items()}.get
    warps, stages = int(get("warps", 0)), int(get("stages", STAGES))
    tiles, biased = int(get("tt", MAX_TOKEN_TILES)), int(get("biased", BIASED_MAX_TOKEN_TILES))
    held = clusters_held if get("deep", 1) else None  # deep=0: the budget's stages at 25-64 tokens
    wgmma, after = int(get("wgmma", WGMMA_FIRST_TOKEN_TILES)), bool(get("after", SCALE_AFTER))
    plan = launch_for(
        m, n, k, group, sms, True, warps, stages, get("ctas", CTAS_PER_SM), tiles, biased, held, wgmma,
        bits=bits, scale_after=after,
    )  # fmt: skip
    plan = plan.sliced(int(get("slices", plan.slices)))
    return dataclasses.replace(
        plan, spec=dataclasses.replace(plan.spec, wait_steps=int(get("wait", plan.spec.wait_steps)))
    )


def waves(plan: GemmLaunch, n: int) -> str:
    """The launch's clusters over those the GPU holds at once (cuOccupancyMaxActiveClusters): above 1, a
    second wave."""
    if not plan.spec.cluster_reduce:
        return "no cluster"
    held, grid = clusters_held(plan.spec, plan.slices), plan.grid(n)
    return f"{grid[0] * grid[2]} clusters / {held} held"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", type=int, nargs="*", default=[64])
    parser.add_argument("--variants", nargs="*", default=["stages=0"])
    parser.add_argument("--layers", nargs="*", default=[])
    parser.add_argument("--group", type=int, default=128, help="K rows a scale (-1: a row)")
    parser.add_argument("--bits", type=int, default=4, choices=(4, 8))
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    optin = torch.cuda.get_device_properties(0).shared_memory_per_block_optin - 1024
    cases = [dict(item.split("=") for item in v.split(",")) for v in args.variants]
    head = " | ".join(f"cuda {v} µs (×bf16)" for v in args.variants)
    print(f"| layer | M | bf16 µs | before µs (×bf16) | {head} |")
    for name, (n, k) in LAYERS.items():
        if args.layers and name not in args.layers:
            continue
        fmt = Formats(n, k, args.group if args.bits == 4 else 128)
        group = k if args.group == -1 else args.group
        weight, reference = fmt.w4, fmt.dense["w4"]
        if args.bits == 8:
            w8 = quantize_rtn(fmt.bf16[0], 8, args.group, sym=True)
            weight = (w8.qweight, w8.scales.bfloat16(), w8.zeros.bfloat16())
            reference = dequantize_int_ref(*weight, 8).t().contiguous()
        sets, dense = copies(weight), copies(fmt.bf16)
        for m in args.ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 0.1
            want = F.linear(x, reference).float()
            bf16 = graph_us(F.linear, [(x, *t) for t in dense])

            def before(x, q, sc, z, counters=fmt.counters, m=m, k=k, group=group):
                if args.bits == 8:  # the engine's int8 dispatch without the CUDA GEMM
                    gemm = int_gemm_mma if mma_dispatched(m, k, group, 8) else int_gemm
                    return gemm(x, q, sc, z, 8, None, counters, cuda_kernel=False)
                if m <= PREFERRED_MAX_M:  # the dispatch's own (the decode GEMV, w4a16_gemv.cu; groups of
                    # 32 / 64 now take this kernel there, so their before is the Triton dispatch)
                    return int_gemm(x, q, sc, z, 4, None, counters, args.group >= 128)
                if not mma_dispatched(m, k, args.group, 4):  # past the Triton GEMM's buckets
                    return x @ dequantize_triton(q, sc, z, 4, x.dtype)
                return int_gemm_mma(x, q, sc, z, 4, None, counters, cuda_kernel=False)

            tri = graph_us(before, [(x, *t) for t in sets])
            cells = []
            for case in cases:
                plan = variant_plan(case, m, n, k, sms, group, args.bits)
                if plan.spec.shared_bytes() > optin:
                    cells.append("too much shared memory")
                    continue

                def run(x, q, sc, z, plan=plan):
                    return w4a16_gemm(x, q, sc, z, sms, plan)

                build = f"{plan.spec.warps}w {plan.spec.stages}st {plan.slices}sl"
                cells.append(sweep_cell(run, x, weight, sets, want, bf16) + f", {build}, {waves(plan, n)}")
            row = f"| {name} | {m} | {bf16:.1f} | {tri:.1f} ({bf16 / tri:.2f}×) | " + " | ".join(cells) + " |"
            print(row, flush=True)
        del fmt, sets, dense
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
