"""When each phase of w4a16_gemm.cu's CTAs happens, in the GEMM bench's chain (bench_w4a16.graph_us: calls
back to back over distinct weight copies, each waiting on its predecessor through PDL). A build of the
kernel (source text patched; a diagnostic only) stamps %globaltimer (ns, one clock for all SMs) in thread 0 of
every CTA at: entry, after griddepcontrol.wait, when the first K tile has landed, after the K loop, after
the cluster's sums met (split builds) and at exit. Per call, each phase's earliest / median / latest CTA is
printed relative to the predecessor's last exit, averaged over the chain's middle calls; "period" is the
distance between consecutive calls' last exits (the bench's µs per call).

source benchmarks/gpu_env.sh && python benchmarks/probe_w4a16_timeline.py --ms 8 64 --layers qkv o
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

import torch
from bench_w4a16 import LAYERS, Formats, copies, graph_us
from kvpilot.runtime.kernels import w4a16_gemm_cuda
from kvpilot.runtime.kernels.nvrtc import allow_cluster, allow_shared_memory, compile_cuda, launch_pdl
from probe_w4a16_parts import patched
from sweep_w4a16_gemm import variant_plan

PHASES = ("entry", "waited", "first tile", "K loop done", "sums met", "sums stored", "exit")  # stamp slots
STAMP = (
    "#define STAMP(p) do { if (threadIdx.x == 0) { unsigned long long t_;"
    ' asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));'
    " tl[((blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * 8 + (p)] = t_; } } while (0)\n"
)
ARRIVE = "    cluster_arrive_relaxed();  // no CTA leaves"
# w4a16_gemm.cu with the cluster header inlined (probe_w4a16_parts.patched): tl, the stamps' buffer, is a
# new last argument of the kernel and of store_by_cluster
STAMPED = [
    ('#include "pdl.cuh"\n', '#include "pdl.cuh"\n' + STAMP),
    (
        "    int stride_x, int stride_y) {",
        "    int stride_x, int stride_y, unsigned long long* tl) {\n    STAMP(0);",
    ),
    ("    gdc_wait();\n", "    gdc_wait();\n    STAMP(1);\n"),
    (
        "        __syncthreads();  // tile i is visible to all",
        "        __syncthreads();\n        if (i == 0) STAMP(2);  // tile i is visible to all",
    ),
    (
        '    asm volatile("cp.async.wait_group 0;" ::: "memory");\n',
        '    asm volatile("cp.async.wait_group 0;" ::: "memory");\n    STAMP(3);\n',
    ),
    ("int stride_y, int warp, int lane) {", "int stride_y, int warp, int lane, unsigned long long* tl) {"),
    ("    cluster_sync();  // every slice's sums are in place\n", "    cluster_sync();\n    STAMP(4);\n"),
    (ARRIVE, "    STAMP(5);\n" + ARRIVE),
    (
        "y, m_left, stride_y, warp, lane);\n        return;",
        "y, m_left, stride_y, warp, lane, tl);\n        STAMP(6);\n        return;",
    ),
]


def stamped_source() -> Path:
    """w4a16_gemm.cu with the cluster header inlined and both stamped."""
    return patched(w4a16_gemm_cuda.SOURCE, {"stamped": STAMPED}, "stamped", "w4a16_gemm_cluster.cuh")


def phase_rows(
    stamps: list[torch.Tensor], phases: tuple[str, ...] = PHASES, exits: tuple[int, ...] = (6, 3)
) -> tuple[list[list[float]], float]:
    """Per phase [earliest, median, latest] µs after the predecessor's last exit (mean over the middle
    calls), and the mean period. exits: the stamp slots that mark a CTA's exit, the first one stamped."""
    rows, periods = [[[] for _ in range(3)] for _ in phases], []
    calls = [s.view(-1, 8).cpu().double() for s in stamps]
    ends = [next(c[:, e].max().item() for e in exits if c[:, e].max() > 0 or e == exits[-1]) for c in calls]
    for i in range(2, len(calls) - 1):
        periods.append(ends[i] - ends[i - 1])
        for p in range(len(phases)):
            col = calls[i][:, p]
            if col.max() == 0:
                continue
            rel = (col - ends[i - 1]) / 1e3
            for j, v in enumerate((rel.min().item(), rel.median().item(), rel.max().item())):
                rows[p][j].append(v)
    mean = [[statistics.fmean(v) if v else float("nan") for v in phase] for phase in rows]
    return mean, statistics.fmean(periods) / 1e3


def stamped_calls(
    run: Any,
    x: torch.Tensor,
    sets: list[tuple[torch.Tensor, ...]],
    ctas: int,
    phases: tuple[str, ...],
    exits: tuple[int, ...],
) -> tuple[float, list[list[float]], float]:
    """run(x, *weight, stamps) over the weight copies in the bench's graph: µs per call, phase_rows."""
    stamps = [torch.zeros(ctas * 8, device="cuda", dtype=torch.int64) for _ in sets]
    us = graph_us(run, [(x, *t, s) for t, s in zip(sets, stamps, strict=True)])
    return (us, *phase_rows(stamps, phases, exits))


def print_phases(title: str, phases: tuple[str, ...], rows: list[list[float]]) -> None:
    print(f"\n{title}")
    print("| phase | earliest | median | latest |  (µs after the predecessor's last exit)")
    for phase, (lo, mid, hi) in zip(phases, rows, strict=True):
        print(f"| {phase} | {lo:.2f} | {mid:.2f} | {hi:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", type=int, nargs="*", default=[8, 64])
    parser.add_argument("--layers", nargs="*", default=["qkv", "o"])
    parser.add_argument("--variant", default="", help="as sweep_w4a16_gemm.py's (default: launch_for's)")
    args = parser.parse_args()
    case = dict(item.split("=") for item in args.variant.split(",") if item)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    source = stamped_source()
    for name in args.layers:
        n, k = LAYERS[name]
        fmt = Formats(n, k)
        sets = copies(fmt.w4)
        for m in args.ms:
            plan = variant_plan(case, m, n, k, sms)
            kernel = compile_cuda(source, "w4a16_gemm", tuple(plan.spec.macros().items()))
            allow_shared_memory(kernel, plan.spec.shared_bytes())
            allow_cluster(kernel, plan.slices)
            grid = plan.grid(n)
            ctas = grid[0] * grid[1] * grid[2]
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 0.1
            cluster = (1, plan.slices, 1) if plan.spec.cluster_reduce else None

            def run(x, q, sc, z, tl, kernel=kernel, plan=plan, grid=grid, cluster=cluster, m=m, n=n, k=k):
                y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                args_ = [x, q, sc, z, sc, y, m, n, k, x.stride(0), y.stride(0), tl]  # sc: no offsets
                block = (plan.spec.warps * 32, 1, 1)
                launch_pdl(kernel, grid, block, args_, plan.spec.shared_bytes(), cluster)
                return y

            us, rows, period = stamped_calls(run, x, sets, ctas, PHASES, (6, 3))
            title = f"{name} M={m} grid={grid} ctas={ctas} bench {us:.2f} µs/call, period {period:.2f} µs"
            print_phases(title, PHASES, rows)
        del fmt, sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
