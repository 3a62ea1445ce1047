"""w4a16_resident.cu (the int4 GEMV whose grid holds its whole weight in shared memory) beside bf16 cuBLAS and
int_gemm's CUDA dispatch at Qwen3-8B's layer shapes, one run; each cell's error against the Triton output.
Times are bench_w4a16.graph_us: back-to-back calls over 400 MiB of weight copies in a CUDA graph. A variant is
"w<warps>[+part...]": the warps per CTA, and parts patched out as in probe_w4a16_parts.py (nowait: no
griddepcontrol.wait, so the time is the kernel's without the dependency; the bench's x never changes;
nocompute: no mma or fold; paceGxF: the weight's copies in G groups, F in flight; sleepN: copies issued N ns
after entry). Each cell ends with the CTAs an SM holds (two either way: the carveout the kernel asks for made
no difference in the first call).

source benchmarks/gpu_env.sh && python benchmarks/sweep_w4a16_resident.py --ms 1 2 --variants w8 w16 w8+nowait
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from bench_w4a16 import LAYERS, Formats, copies, graph_us, sweep_cell
from kvpilot.runtime.kernels.nvrtc import compile_cuda, max_active_ctas, num_registers
from kvpilot.runtime.kernels.w4a16_cuda import w4a16_gemv
from kvpilot.runtime.kernels.w4a16_resident import (
    SOURCE,
    ResidentSpec,
    grid_ctas,
    resident_spec,
    w4a16_resident,
)
from kvpilot.runtime.kernels.w4a16_triton import int_gemm
from probe_w4a16_parts import patched

PATCHES = {
    "nowait": [("    gdc_wait();\n", "")],
    # the weight's copies in G groups, F in flight at once (paced: the running grid's x loads queue behind
    # fewer of them); or issued after a sleep
    **{
        f"pace{g}x{f}": [
            ("#define PREFETCH_GROUPS 1", f"#define PREFETCH_GROUPS {g}"),
            ("#define IN_FLIGHT 1", f"#define IN_FLIGHT {f}"),
        ]
        for g, f in ((4, 1), (4, 2), (8, 2), (8, 4))
    },
    **{f"sleep{ns}": [("#define SLEEP_NS 0", f"#define SLEEP_NS {ns}")] for ns in (500, 1000, 2000)},
    # no mmas and no fold: the period without the compute (the output is zero)
    "nocompute": [("tile < tiles; tile += WARPS) tile_into(", "tile < 0; tile += WARPS) tile_into(")],
}


def build(spec: ResidentSpec, variant: str) -> tuple[ResidentSpec, Any]:
    """The variant's spec and kernel: its warps, its parts patched out."""
    warps, _, parts = variant.partition("+")
    spec = dataclasses.replace(spec, warps=int(warps.removeprefix("w")))
    source = patched(SOURCE, PATCHES, parts) if parts else SOURCE
    return spec, compile_cuda(source, "w4a16_resident", tuple(spec.macros().items()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", type=int, nargs="*", default=[1, 2, 4])
    parser.add_argument("--layers", nargs="*", default=["qkv", "o"])
    parser.add_argument("--variants", nargs="*", default=["w8", "w16", "w8+nowait"])
    args = parser.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    head = " | ".join(f"resident {v} µs (×bf16)" for v in args.variants)
    print(f"| layer | M | bf16 µs | dispatch µs (×bf16) | cluster GEMV µs (×bf16) | {head} | build |")
    for name in args.layers:
        n, k = LAYERS[name]
        fmt = Formats(n, k)
        sets, dense = copies(fmt.w4), copies(fmt.bf16)
        for m in args.ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 0.1
            bf16 = graph_us(F.linear, [(x, *t) for t in dense])
            want = int_gemm(x, *fmt.w4, 4, cuda_kernel=False).float()

            def dispatched(x: torch.Tensor, *t: torch.Tensor, c: torch.Tensor = fmt.counters) -> torch.Tensor:
                return int_gemm(x, *t, 4, counters=c)

            dispatch = sweep_cell(dispatched, x, fmt.w4, sets, want, bf16)

            def cluster_gemv(x: torch.Tensor, *t: torch.Tensor, c: torch.Tensor = fmt.counters) -> Any:
                return w4a16_gemv(x, *t, sms, c)  # the launch it takes by itself (before this kernel)

            dispatch += " | " + sweep_cell(cluster_gemv, x, fmt.w4, sets, want, bf16)
            spec = resident_spec(m, n, k, 128, sms)
            if spec is None:
                print(f"| {name} | {m} | {bf16:.1f} | {dispatch} | does not fit |", flush=True)
                continue
            cells = []
            for variant in args.variants:
                vspec, kernel = build(spec, variant)

                def run(x: torch.Tensor, *t: torch.Tensor, kern: Any = kernel, s: Any = vspec) -> Any:
                    return w4a16_resident(x, *t, sms, kern, s)

                cell = sweep_cell(run, x, fmt.w4, sets, want, bf16)
                held = max_active_ctas(kernel, vspec.warps * 32, vspec.shared_bytes(m, k, 128))
                cells.append(f"{cell}, {held} per SM, {num_registers(kernel)} registers")
            build_text = f"at most {spec.blocks} blocks, {grid_ctas(n, sms)} CTAs"
            print(f"| {name} | {m} | {bf16:.1f} | {dispatch} | " + " | ".join(cells) + f" | {build_text} |")
        del fmt, sets, dense
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
