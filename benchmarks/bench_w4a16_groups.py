"""Int4 GEMMs of Qwen3-8B's layer shapes by group size (32, 64, 128 K rows: AWQ / GPTQ g32 / g64 / g128, GGUF
grids kept under int4), as the engine dispatches them (quant/methods.IntWeightMethod: from one token, groups
of 32 or 64 go to w4a16_gemm.cu), against what ran before for the small groups (the same dispatch without the
CUDA kernels) and bf16 cuBLAS, all in one run; --bits 8 times the int8 weight-only paths the same way.

    source benchmarks/gpu_env.sh && cd benchmarks && python bench_w4a16_groups.py [--ms 1,2,8,16,64,256]
    python bench_w4a16_groups.py --bits 8 --groups 32,128,-1   # int8 weight-only (Q8_0 / Q5 grids, Q6_K held)

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
from kvpilot.runtime.kernels.w4a16_mma_triton import int_gemm_mma, mma_dispatched
from kvpilot.runtime.kernels.w4a16_triton import int_gemm
from kvpilot.runtime.quant.int_weight import quantize_rtn

LAYERS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
GROUPS = (32, 64, 128)
HBM_BYTES_PER_US = 4.25e6  # 4.25 TB/s


def engine_gemm(
    x: torch.Tensor,
    q: torch.Tensor,
    s: torch.Tensor,
    z: torch.Tensor,
    bits: int,
    counters: torch.Tensor,
    cuda_kernel: bool = True,
) -> torch.Tensor:
    """As quant/methods.IntWeightMethod dispatches on a GPU: the Triton tensor-core GEMM's buckets past 16
    tokens, int_gemm otherwise (cuda_kernel False: never the CUDA kernels)."""
    k = x.shape[1]
    group = k // s.shape[0]
    gemm = int_gemm_mma if mma_dispatched(x.shape[0], k, group, bits) else int_gemm
    return gemm(x, q, s, z, bits, None, counters, cuda_kernel)


def bench_layer(name: str, n: int, k: int, ms: list[int], bits: int, groups: list[int]) -> None:
    dense = (torch.randn(n, k, device="cuda") * 0.02).bfloat16()
    w16 = copies((dense,))
    counters = split_counters(n, torch.device("cuda"))
    weights = {}
    for group in groups:
        w = quantize_rtn(dense.float(), bits, group, sym=False)
        weights[group] = (w.qweight, w.scales.bfloat16(), w.zeros.bfloat16())
    for m in ms:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        t16 = graph_us(partial(F.linear, x), w16)
        cells = []
        for group, tensors in weights.items():
            w4 = copies(tensors)
            want = x.float() @ dequantize_int_ref(*tensors, bits).float()  # the weight's own GEMM
            got = engine_gemm(x, *tensors, bits, counters).float()
            err = float((got - want).abs().amax() / want.abs().amax())
            now = graph_us(lambda q, s, z: engine_gemm(x, q, s, z, bits, counters), w4)  # noqa: B023
            cell = f"{now:.1f} ({t16 / now:.2f}×, err {err:.0e})"
            if bits == 8 or 0 < group < 128:  # what ran before the CUDA GEMM took these
                before = graph_us(lambda q, s, z: engine_gemm(x, q, s, z, bits, counters, False), w4)  # noqa: B023
                cell += f" / Triton {before:.1f} ({t16 / before:.2f}×)"
            floor = nbytes(tensors) / HBM_BYTES_PER_US
            cells.append(f"{cell}, floor {floor:.1f}")
        print(f"| {name} | {m} | {t16:.1f} | " + " | ".join(cells) + " |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ms", default="1,2,8,16,64,256")
    parser.add_argument("--layers", default=",".join(LAYERS))
    parser.add_argument("--bits", type=int, default=4)
    groups_help = "K rows per scale (-1: one per output channel)"
    parser.add_argument("--groups", default=",".join(map(str, GROUPS)), help=groups_help)
    args = parser.parse_args()
    ms = [int(m) for m in args.ms.split(",")]
    groups = [int(g) for g in args.groups.split(",")]
    print(torch.cuda.get_device_name())
    heads = " | ".join(f"int{args.bits} g{g} µs (× bf16)" for g in groups)
    print(f"| layer | M | bf16 µs | {heads} |")
    print("|---|---|---|" + "---|" * len(groups))
    for name in args.layers.split(","):
        bench_layer(name, *LAYERS[name], ms, args.bits, groups)


if __name__ == "__main__":
    main()
