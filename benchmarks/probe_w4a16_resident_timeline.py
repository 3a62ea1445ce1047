"""When each phase of w4a16_resident.cu's CTAs happens in the GEMM bench's chain (bench_w4a16.graph_us), as
probe_w4a16_timeline.py does for w4a16_gemm.cu: a patched build (a diagnostic only) stamps %globaltimer in
thread 0 of every CTA at entry, after griddepcontrol.wait, after staging x, when its weight has landed, after
its K tiles and at exit. --parts +nowait also drops the wait (the bench's x never changes).

source benchmarks/gpu_env.sh && python benchmarks/probe_w4a16_resident_timeline.py --layers qkv o
"""

from __future__ import annotations

import argparse

import torch
from bench_w4a16 import LAYERS, Formats, copies
from kvpilot.runtime.kernels.nvrtc import allow_shared_memory, compile_cuda, launch_pdl
from kvpilot.runtime.kernels.w4a16_resident import SOURCE, grid_ctas, resident_spec
from probe_w4a16_parts import patched
from probe_w4a16_timeline import STAMP, print_phases, stamped_calls

PHASES = ("entry", "waited", "x staged", "weight landed", "K tiles done", "exit")
SIGNATURE = "int k, int stride_x, int stride_y"
LANDED = "    __syncthreads();\n\n    float acc"
DONE = "    __syncthreads();  // every warp is done"
X_STAGED = "stage_x_sums(xs, x_sums, x, stride_x, m, tiles);\n"
STAMPED = [
    ('#include "pdl.cuh"\n', '#include "pdl.cuh"\n' + STAMP),
    (SIGNATURE + ") {", SIGNATURE + ", unsigned long long* tl) {\n    STAMP(0);"),
    ("    gdc_wait();\n", "    gdc_wait();\n    STAMP(1);\n"),
    (X_STAGED, X_STAGED + "    STAMP(2);\n"),
    (LANDED, LANDED.replace("\n\n", "\n    STAMP(3);\n\n")),
    (DONE, "    STAMP(4);\n" + DONE),
    ("stride_y, warp, g, t);\n}", "stride_y, warp, g, t);\n    STAMP(5);\n}"),
]
PATCHES = {
    "stamped": STAMPED,
    "nowait": [("    gdc_wait();\n    STAMP(1);\n", "    STAMP(1);\n")],
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", type=int, nargs="*", default=[1])
    parser.add_argument("--layers", nargs="*", default=["qkv", "o"])
    parser.add_argument("--parts", default="", help="+nowait")
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    source = patched(SOURCE, PATCHES, "stamped" + args.parts)
    for name in args.layers:
        n, k = LAYERS[name]
        fmt = Formats(n, k)
        sets = copies(fmt.w4)
        for m in args.ms:
            spec = resident_spec(m, n, k, 128, sms)
            if spec is None:
                continue
            kernel = compile_cuda(source, "w4a16_resident", tuple(spec.macros().items()))
            shared = spec.shared_bytes(m, k, 128)
            allow_shared_memory(kernel, shared)
            ctas = grid_ctas(n, sms)
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 0.1

            def run(x, q, sc, z, tl, kernel=kernel, m=m, n=n, k=k, ctas=ctas, shared=shared, spec=spec):
                y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                args_ = [x, q, sc, z, y, m, n, k, x.stride(0), y.stride(0), tl]
                launch_pdl(kernel, (ctas, 1, 1), (spec.warps * 32, 1, 1), args_, shared)
                return y

            us, rows, period = stamped_calls(run, x, sets, ctas, PHASES, (5,))
            title = f"{name} M={m} ctas={ctas} bench {us:.2f} µs/call, period {period:.2f} µs"
            print_phases(title, PHASES, rows)
        del fmt, sets
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
