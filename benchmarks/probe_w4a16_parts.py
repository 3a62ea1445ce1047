"""Where w4a16_gemv.cu's time goes at 1-8 tokens: the kernel beside builds with one part taken out (the
differences are that part's cost), in the GEMM bench's setting (bench_w4a16.graph_us). The builds patch
the source text (a diagnostic only; their outputs are wrong by design):
  nocompute  tiles are loaded and XORed together, no mma and no fold
  nostage    x is not staged (the mmas read whatever shared memory holds)
  noreduce   each K slice stores its own partial (no workspace, fence, counter or final sum)

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

PATCHES = {
    "nocompute": [
        (
            "    mma_tile(part, xsum, w, xs, tile, g, t, m);",
            "    u32 v = 0;\n#pragma unroll\n    for (int rs = 0; rs < 4; ++rs) v ^= w.lo[rs].x ^ w.lo[rs].y"
            " ^ w.lo[rs].z ^ w.lo[rs].w ^ w.hi[rs].x ^ w.hi[rs].y ^ w.hi[rs].z ^ w.hi[rs].w;\n"
            "    part[0][0] = __uint_as_float(v & 0x3FFFFFFFu);",
        )
    ],
    "nostage": [("    stage_x(smem, x, stride_x, m, t_lo * TILE, t_hi - t_lo);", "")],
    "noreduce": [
        ("    if (slices == 1) return;", "    return;"),
        ("        if (slices == 1)\n", "        if (true)\n"),
    ],
}


def build(name: str, spec: w4a16_cuda.W4Spec) -> object:
    text = w4a16_cuda.SOURCE.read_text()
    for old, new in PATCHES.get(name, []):
        if old not in text:
            raise SystemExit(f"patch {name} no longer applies: {old!r}")
        text = text.replace(old, new)
    path = Path(tempfile.gettempdir()) / f"w4a16_{name}.cu"
    path.write_text(text)
    return compile_cuda(path, "w4a16_gemv", tuple(spec.macros().items()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", type=int, nargs="*", default=[1, 4, 8])
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    names = ["full", *PATCHES]
    print("| layer | M | slices | " + " | ".join(f"{n} µs" for n in names) + " | full, late release µs |")
    for layer, (n, k) in LAYERS.items():
        fmt = Formats(n, k)
        sets = copies(fmt.w4)
        for m in args.ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 0.1
            plan = w4a16_cuda.launch_for(m, n, k, 128, sms)
            cells = []
            variants = [(name, plan.spec) for name in names]
            variants.append(("full", dataclasses.replace(plan.spec, early_release=False)))
            for name, spec in variants:
                kernel = build(name, spec)
                counters = torch.zeros(n // 64, device="cuda", dtype=torch.int32)
                work = torch.empty(plan.slices, m, n, device="cuda", dtype=torch.float32)

                def run(x, q, s, z, kernel=kernel, counters=counters, work=work, shape=(m, n, k), plan=plan):
                    y = torch.empty(shape[:2], device="cuda", dtype=torch.bfloat16)
                    args = [x, q, s, z, y, work, counters, *shape, x.stride(0), y.stride(0)]
                    launch_pdl(kernel, (shape[1] // 64, plan.slices, 1), (128, 1, 1), args)

                cells.append(f"{graph_us(run, [(x, *t) for t in sets]):.1f}")
            print(f"| {layer} | {m} | {plan.slices} | " + " | ".join(cells) + " |", flush=True)
        del fmt, sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
