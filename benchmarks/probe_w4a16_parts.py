"""Where w4a16_gemv.cu's time goes at 1-8 tokens: the kernel beside builds with one part taken out (the
differences are that part's cost), in the GEMM bench's setting (bench_w4a16.graph_us). The builds patch
the source text (a diagnostic only; their outputs are wrong by design):
  nocompute  tiles are loaded and XORed together, no mma and no fold
  nostage    x is not staged (the mmas read whatever shared memory holds)
  noreduce   each K slice stores its own partial (no workspace, fence, counter or final sum)
  nowait     no griddepcontrol.wait: x is read without waiting for the predecessor (the bench's x never
             changes; the slices' counters race), so the time is the kernel's without the dependency
  releasemeet  the cluster's last meeting with a release arrive (before the thirteenth session; cluster
             builds only: with --dispatched, qkv and o at 1-4 tokens)
Parts combine with "+" (--parts nowait+noreduce). --slices/--warps change launch_for's build;
--dispatched takes w4a16_gemv's own launch (clustered for qkv and o at 1-4 tokens) instead.

source benchmarks/gpu_env.sh && python benchmarks/probe_w4a16_parts.py
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

import torch
from bench_w4a16 import LAYERS, Formats, copies, graph_us
from kvpilot.runtime.kernels import w4a16_cuda
from kvpilot.runtime.kernels.nvrtc import compile_cuda, launch_pdl

# the last cluster meeting as it was before the thirteenth session (a release arrive, cluster_barrier.cuh)
RELEASE_MEET = [("cluster_arrive_relaxed();", "cluster_sync();"), ("    cluster_wait();\n}", "}")]
PATCHES = {
    "nocompute": [
        (
            "    mma_tile(part, w, xs, tile, g, t, m);",
            "    u32 v = 0;\n#pragma unroll\n    for (int rs = 0; rs < 4; ++rs) v ^= w.lo[rs].x ^ w.lo[rs].y"
            " ^ w.lo[rs].z ^ w.lo[rs].w ^ w.hi[rs].x ^ w.hi[rs].y ^ w.hi[rs].z ^ w.hi[rs].w;\n"
            "    part[0][0] = __uint_as_float(v & 0x3FFFFFFFu);",
        )
    ],
    "nostage": [("    stage_x(smem, x_sums, x, stride_x, m, t_lo * TILE, t_hi - t_lo);", "")],
    "noreduce": [
        ("    if (slices == 1) return;", "    return;"),
        ("        if (slices == 1)\n", "        if (true)\n"),
    ],
    "nowait": [("    gdc_wait();\n    stage_x(", "    stage_x(")],
    "releasemeet": RELEASE_MEET,
}


def patched(source: Path, patches: dict[str, list[tuple[str, str]]], name: str, *inline: str) -> Path:
    """A copy of source (in the temp folder) with the patches of each "+"-joined part of name applied; each
    header of inline (beside source) is pasted in place of its #include first, so patches reach it too."""
    text = source.read_text()
    for header in inline:
        text = text.replace(f'#include "{header}"', (source.parent / header).read_text())
    for old, new in [patch for part in name.split("+") for patch in patches.get(part, [])]:
        if old not in text:
            raise SystemExit(f"patch {name} no longer applies: {old!r}")
        text = text.replace(old, new)
    path = Path(tempfile.gettempdir()) / f"{source.stem}_{name}.cu"
    path.write_text(text)
    return path


def build(name: str, spec: w4a16_cuda.W4Spec) -> object:
    path = patched(w4a16_cuda.SOURCE, PATCHES, name, "w4a16_cluster.cuh")
    return compile_cuda(path, "w4a16_gemv", tuple(spec.macros().items()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", type=int, nargs="*", default=[1, 4, 8])
    parser.add_argument("--parts", nargs="*", default=list(PATCHES))
    parser.add_argument("--layers", nargs="*", default=list(LAYERS))
    parser.add_argument("--slices", type=int, default=0)
    parser.add_argument("--warps", type=int, default=w4a16_cuda.WARPS)
    parser.add_argument("--dispatched", action="store_true", help="w4a16_gemv's own launch")
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    names = ["full", *args.parts]
    print("| layer | M | slices | " + " | ".join(f"{n} µs" for n in names) + " | full, late release µs |")
    for layer in args.layers:
        n, k = LAYERS[layer]
        fmt = Formats(n, k)
        sets = copies(fmt.w4)
        for m in args.ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 0.1
            plan = w4a16_cuda.launch_for(m, n, k, 128, sms)
            spec = dataclasses.replace(plan.spec, warps=args.warps)
            plan = dataclasses.replace(plan, spec=spec, slices=args.slices or plan.slices)
            if args.dispatched:
                plan = w4a16_cuda.dispatched_launch(m, n, k, 128, sms, hopper=True)
            cells = []
            variants = [(name, plan.spec) for name in names]
            variants.append(("full", dataclasses.replace(plan.spec, early_release=False)))
            for name, spec in variants:
                kernel = build(name, spec)
                counters = torch.zeros(n // 64, device="cuda", dtype=torch.int32)
                work = torch.empty(plan.slices, m, n, device="cuda", dtype=torch.float32)

                def run(
                    x,
                    q,
                    s,
                    z,
                    kernel=kernel,
                    counters=counters,
                    work=work,
                    shape=(m, n, k),
                    plan=plan,
                ):
                    y = torch.empty(shape[:2], device="cuda", dtype=torch.bfloat16)
                    args = [x, q, s, z, y, work, counters, *shape, x.stride(0), y.stride(0)]
                    block = (32 * plan.spec.warps, 1, 1)
                    cluster = (1, plan.slices, 1) if plan.spec.cluster_reduce else None
                    launch_pdl(kernel, (shape[1] // 64, plan.slices, 1), block, args, 0, cluster)

                cells.append(f"{graph_us(run, [(x, *t) for t in sets]):.1f}")
            print(f"| {layer} | {m} | {plan.slices} | " + " | ".join(cells) + " |", flush=True)
        del fmt, sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
