"""W8A8 int8 (kernels/int8_w8a8_triton.py) at Qwen3-8B's layer shapes against bf16 cuBLAS, the int8
weight-only dispatch it replaces above decode sizes (quant/methods.py), and fp8 per-channel W8A8
(torch._scaled_mm), side by side in one run. Times are CUDA-graph replays over ~400 MiB of weight copies.

    source benchmarks/gpu_env.sh && python benchmarks/bench_int8_w8a8.py

Each launch shape in CONFIGS is timed; the table gives the best and names it. Floors: the int8 weight bytes
at --bw, and 2·M·N·K at twice --flops (the int8 tensor cores' dense rate is twice bf16's on Hopper).
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
import torch.nn.functional as F
from bench_w4a16 import LAYERS, copies, graph_us
from kvpilot.runtime.kernels.int8_w8a8_triton import W8A8Config, int8_w8a8
from kvpilot.runtime.kernels.quant_reference import int8_w8a8_ref, quantize_fp8_rows_ref
from kvpilot.runtime.kernels.split_k_triton import split_counters
from kvpilot.runtime.kernels.w4a16_mma_triton import int_gemm_mma, mma_dispatched
from kvpilot.runtime.kernels.w4a16_triton import int_gemm
from kvpilot.runtime.quant.fp8_gemm import fp8_scaled_mm
from kvpilot.runtime.quant.int_weight import quantize_rtn

MS = (17, 32, 64, 128, 256, 1024, 4096)
CONFIGS = {
    "128x128": W8A8Config(),
    "128x128 swap": W8A8Config(swap=True),
    "128x128 4st": W8A8Config(num_stages=4),
    "64x128 4w": W8A8Config(64, 128, 4, 4),
    "64x128 4w swap": W8A8Config(64, 128, 4, 4, swap=True),
    "128x256": W8A8Config(128, 256, 8, 3),
    "32x128 4w swap": W8A8Config(32, 128, 4, 4, swap=True),
}


def row(name: str, n: int, k: int, m: int, bw: float, flops: float) -> str:
    dev = torch.device("cuda")
    w = 0.02 * torch.randn(n, k, device=dev, dtype=torch.bfloat16)
    q = quantize_rtn(w, 8, -1, sym=True)
    qw, s, z = q.qweight, q.scales.bfloat16(), q.zeros.bfloat16()
    fq, fs = quantize_fp8_rows_ref(w)
    x = (0.1 * torch.randn(m, k, device=dev)).bfloat16()
    counters = split_counters(n, dev)
    want = int8_w8a8_ref(x.float(), qw, s.float())
    err = float((int8_w8a8(x, qw, s).float() - want).norm() / want.norm())

    def weight_only(qw_: torch.Tensor, s_: torch.Tensor, z_: torch.Tensor) -> torch.Tensor:
        if mma_dispatched(m, k, k, 8):
            return int_gemm_mma(x, qw_, s_, z_, 8, None, counters)
        return int_gemm(x, qw_, s_, z_, 8, None, counters)

    bf16 = graph_us(lambda wt: F.linear(x, wt), copies((w,)))
    w8a16 = graph_us(weight_only, copies((qw, s, z)))
    fp8 = graph_us(lambda a, b: fp8_scaled_mm(x, a, b.view(-1), None), copies((fq, fs)))
    times = {
        label: graph_us(lambda a, b, c=cfg: int8_w8a8(x, a, b, c), copies((qw, s)))
        for label, cfg in CONFIGS.items()
    }
    best = min(times, key=times.__getitem__)
    us = times[best]
    floor = max((n * k + 2 * n) / bw, 2 * m * n * k / (2 * flops)) * 1e6
    return (
        f"| {name} | {m} | {bf16:.1f} | {w8a16:.1f} ({bf16 / w8a16:.2f}×) | {fp8:.1f} ({bf16 / fp8:.2f}×) | "
        f"**{us:.1f} ({bf16 / us:.2f}×)** {best} | {times['128x128']:.1f} | {floor:.1f} ({us / floor:.1f}×) "
        f"| {err:.0e} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", type=int, nargs="*", default=list(MS))
    parser.add_argument("--layers", nargs="*", default=list(LAYERS))
    parser.add_argument("--bw", type=float, default=4.25e12)
    parser.add_argument("--flops", type=float, default=784e12)
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), {k: dataclasses.astuple(c) for k, c in CONFIGS.items()})
    print("| layer | M | bf16 µs | int8 weight-only | fp8 W8A8 | int8 W8A8 (best) | 128x128 | floor | err |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in args.layers:
        n, k = LAYERS[name]
        for m in args.ms:
            print(row(name, n, k, m, args.bw, args.flops), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
