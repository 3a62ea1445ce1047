"""Where w4a16_gemm.cu's time goes at 16-128 tokens: the kernel beside builds with one part taken out (the
differences are that part's cost), in the GEMM bench's setting (bench_w4a16.graph_us). The builds patch
the source text (a diagnostic only; their outputs are wrong by design):
  nomma      the tiles are copied and waited for, but no stage is read: no dequantization, ldmatrix or mma
  nodequant  the weight pairs go to the mmas as they come out of the lop3 (no subtraction, no scaling; the
             builds above 16 tokens: the biased ones at 5-16 never dequantize per pair)
  noreduce   each K slice stores its own sums (no cluster barrier, no distributed shared memory)
  nowait     no griddepcontrol.wait (the bench's x never changes): the time without the dependency
  nox        no x tile is copied (the mmas read whatever the stage holds): the time without x's L2 reads
  noxs       the biased builds' x sums skip their ones-mma (with --variant after=0: the dispatch's biased
             builds take no x sums since the twenty-sixth session)
  halfx      only even column blocks copy x: half of x's L2 reads, each CTA that copies as before (what x
             multicast to a pair of column blocks would read)
  releasemeet  the cluster's last meeting with a release arrive, as before the thirteenth session
Parts combine with "+" (--parts nowait+noreduce).

source benchmarks/gpu_env.sh && python benchmarks/probe_w4a16_gemm.py --ms 16 64
"""

from __future__ import annotations

import argparse

import torch
from bench_w4a16 import LAYERS, Formats, copies, graph_us
from kvpilot.runtime.kernels import w4a16_gemm_cuda
from kvpilot.runtime.kernels.nvrtc import allow_cluster, allow_shared_memory, compile_cuda, launch_pdl
from kvpilot.runtime.kernels.w4a16_gemm_plan import GemmLaunch, GemmSpec
from probe_w4a16_parts import RELEASE_MEET, patched
from sweep_w4a16_gemm import variant_plan

PATCHES = {
    "nomma": [
        (
            f"        {stage}(acc, stage_at(smem, i % STAGES), warp, lane);",
            f"        if (acc[0][0][0] == 1234.5f)\n"
            f"            {stage}(acc, stage_at(smem, i % STAGES), warp, lane);",
        )
        for stage in ("mma_stage_biased", "mma_stage")
    ],
    "nodequant": [
        (
            "    return fma_bf16x2(fma_bf16x2(biased_pair(p, i), ONES, nz), s, o);",
            "    return biased_pair(p, i);",
        )
    ],
    "noreduce": [
        ("    if (slices > 1) {\n        __syncthreads();", "    if (false) {\n        __syncthreads();")
    ],
    "nowait": [("    gdc_wait();\n", "")],
    "noxs": [
        (
            "            mma_bf16(xs[2 * pr], ones, b[0], b[1]);\n"
            "            if (2 * pr + 1 < NT) mma_bf16(xs[2 * pr + 1], ones, b[2], b[3]);\n",
            "",
        )
    ],
    "nox": [("fetch_x(x_at(smem, ", "if (false) fetch_x(x_at(smem, ")],
    "halfx": [("fetch_x(x_at(smem, ", "if (!(blockIdx.x & 1)) fetch_x(x_at(smem, ")],
    "releasemeet": RELEASE_MEET,
}


def build(name: str, spec: GemmSpec) -> object:
    path = patched(w4a16_gemm_cuda.SOURCE, PATCHES, name, "w4a16_gemm_cluster.cuh", "w4a16_gemm_biased.cuh")
    kernel = compile_cuda(path, "w4a16_gemm", tuple(spec.macros().items()), "90a" if spec.wgmma else None)
    allow_shared_memory(kernel, spec.shared_bytes())
    return kernel


def launcher(kernel: object, plan: GemmLaunch, m: int, n: int, k: int) -> object:
    block, shared = (plan.spec.warps * 32, 1, 1), plan.spec.shared_bytes()
    cluster = (1, plan.slices, 1) if plan.spec.cluster_reduce else None
    allow_cluster(kernel, plan.slices)

    def run(x: torch.Tensor, q: torch.Tensor, sc: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        args = [x, q, sc, z, sc, y, m, n, k, x.stride(0), y.stride(0)]  # sc in the offsets' place: unread
        launch_pdl(kernel, plan.grid(n), block, args, shared, cluster)
        return y

    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", type=int, nargs="*", default=[16, 64])
    parser.add_argument("--parts", nargs="*", default=["base", "nomma", "nodequant", "noreduce", "nowait"])
    parser.add_argument("--layers", nargs="*", default=[])
    parser.add_argument("--variant", default="", help="as sweep_w4a16_gemm.py's (default: launch_for's)")
    args = parser.parse_args()
    case = dict(item.split("=") for item in args.variant.split(",") if item)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print("| layer | M | grid | " + " | ".join(f"{p} µs (max error)" for p in args.parts) + " |")
    for name, (n, k) in LAYERS.items():
        if args.layers and name not in args.layers:
            continue
        fmt = Formats(n, k)
        sets = copies(fmt.w4)
        for m in args.ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 0.1
            plan = variant_plan(case, m, n, k, sms)
            reference = (x @ fmt.dense["w4"].t()).float()
            cells = []
            for part in args.parts:
                kernel = build(part, plan.spec)

                run = launcher(kernel, plan, m, n, k)
                err = (run(x, *fmt.w4).float() - reference).abs().max().item()
                cells.append(f"{graph_us(run, [(x, *t) for t in sets]):.1f} ({err:.0e})")
            print(f"| {name} | {m} | {plan.grid(n)} | " + " | ".join(cells) + " |", flush=True)
        del fmt, sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
