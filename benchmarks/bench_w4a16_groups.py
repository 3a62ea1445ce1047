"""Int4 GEMMs of Qwen3-8B's layer shapes by group size (32, 64, 128 K rows: AWQ / GPTQ g32 / g64 / g128, GGUF
grids kept under int4), as int_gemm dispatches them (from one token, groups of 32 or 64 go to w4a16_gemm.cu),
against what ran before for the small groups (the Triton kernels: int_gemm with cuda_kernel=False) and bf16
cuBLAS, all in one run.

    source benchmarks/gpu_env.sh && cd benchmarks && python bench_w4a16_groups.py [--ms 1,2,8,16,64,256]

Times are CUDA-graph replays over weight copies past the L2 (bench_w4a16.graph_us / copies). The floor is
the int4 weight's bytes (int32 words + bf16 scales and zeros) at 4.25 TB/s, the H200 figure of the guide.
"""

from __future__ import annotations

import argparse
from functools import partial

import torch
import torch.nn.functional as F
from bench_w4a16 import copies, graph_us, nbytes
from kvpilot.runtime.kernels.quant_reference import dequantize_int_ref
from kvpilot.runtime.kernels.split_k_triton import split_counters
from kvpilot.runtime.kernels.w4a16_triton import int_gemm
from kvpilot.runtime.quant.int_weight import quantize_rtn

LAYERS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
GROUPS = (32, 64, 128)
HBM_BYTES_PER_US = 4.25e6  # 4.25 TB/s


def bench_layer(name: str, n: int, k: int, ms: list[int]) -> None:
    dense = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    w16 = copies((dense,))
    counters = split_counters(n, torch.device("cuda"))
    weights = {}
    for group in GROUPS:
        w = quantize_rtn(dense.float(), 4, group, sym=False)
        weights[group] = (w.qweight, w.scales.bfloat16(), w.zeros.bfloat16())
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        t16 = graph_us(partial(F.linear, x), w16)
        cells = []
        for group, tensors in weights.items():
            w4 = copies(tensors)
            want = x.float() @ dequantize_int_ref(*tensors, 4).float()  # the int4 weight's own GEMM
            got = int_gemm(x, *tensors, 4, None, counters).float()
            err = float((got - want).abs().amax() / want.abs().amax())
            now = graph_us(lambda q, s, z: int_gemm(x, q, s, z, 4, None, counters), w4)  # noqa: B023
            cell = f"{now:.1f} ({t16 / now:.2f}×, err {err:.0e})"
            if group < 128:
                before = graph_us(lambda q, s, z: int_gemm(x, q, s, z, 4, None, counters, False), w4)  # noqa: B023
                cell += f" / Triton {before:.1f} ({t16 / before:.2f}×)"
            floor = nbytes(tensors) / HBM_BYTES_PER_US
            cells.append(f"{cell}, floor {floor:.1f}")
        print(f"| {name} | {m} | {t16:.1f} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ms", default="1,2,8,16,64,256")
    parser.add_argument("--layers", default=",".join(LAYERS))
    args = parser.parse_args()
    ms = [int(m) for m in args.ms.split(",")]
    print(torch.cuda.get_device_name())
    heads = " | ".join(f"int4 g{g} µs (× bf16)" for g in GROUPS)
    print(f"| layer | M | bf16 µs | {heads} |")
    print("|---|---|---|" + "---|" * len(GROUPS))
    for name in args.layers.split(","):
        bench_layer(name, *LAYERS[name], ms)


if __name__ == "__main__":
    main()
