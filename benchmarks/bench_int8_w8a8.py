"""W8A8 int8 checkpoints' GEMMs (quant/int8_channel.py) at Qwen3-8B's layer shapes, side by side in one
run: bf16 cuBLAS; the int8 weight-only dispatch on the packed layout (quant/methods.py: what a W8A8
checkpoint ran before); fp8 per-channel W8A8 (torch._scaled_mm); at decode sizes the GEMV on the plain
int8 weight, above them the int8 GEMM (kernels/int8_gemm_triton.py, activation quantization included) in
each launch shape of CONFIGS, and torch._int_mm alone (no quantization, no scaling) for scale.
Times are CUDA-graph replays over ~400 MiB of weight copies.

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
from kvpilot.runtime.kernels.fp8_gemv_triton import fp8_gemv
from kvpilot.runtime.kernels.int8_gemm_triton import Int8GemmConfig, int8_gemm, quantize_int8_rows_triton
from kvpilot.runtime.kernels.quant_reference import quantize_fp8_rows_ref
from kvpilot.runtime.kernels.split_k_triton import split_counters
from kvpilot.runtime.kernels.w4a16_mma_triton import int_gemm_mma, mma_dispatched
from kvpilot.runtime.kernels.w4a16_triton import int_gemm
from kvpilot.runtime.quant.fp8_gemm import fp8_scaled_mm
from kvpilot.runtime.quant.int_weight import quantize_rtn

MS = (1, 16, 17, 64, 256, 1024, 4096)
CONFIGS = {
    "plain 128x128x128": Int8GemmConfig(),
    "plain 128x256x128": Int8GemmConfig(128, 256, 128, 8, 8, 3),
    "plain 128x128x64 4w": Int8GemmConfig(128, 128, 64, 8, 4, 5),
    "plain 64x128x128 4w": Int8GemmConfig(64, 128, 128, 8, 4, 4),
    "plain 64x64x256 4w": Int8GemmConfig(64, 64, 256, 8, 4, 4),
}


def row(name: str, n: int, k: int, m: int, bw: float, flops: float) -> str:
    dev = torch.device("cuda")
    w = 0.02 * torch.randn(n, k, device=dev, dtype=torch.bfloat16)
    q = quantize_rtn(w, 8, -1, sym=True)
    qw, s, z = q.qweight, q.scales.bfloat16(), q.zeros.bfloat16()
    plain, sw = quantize_int8_rows_triton(w)  # int8 [N, K] and its channel scales [N]
    fq, fs = quantize_fp8_rows_ref(w)
    x = (0.1 * torch.randn(m, k, device=dev)).bfloat16()
    counters = split_counters(n, dev)
    xq, sx = quantize_int8_rows_triton(x)
    want = (xq.double() @ plain.double().t() * sx.double()[:, None] * sw.double()[None, :]).float()
    err = float((int8_gemm(xq, sx, plain, sw, torch.bfloat16).float() - want).norm() / want.norm())
    gemv_want = x.float() @ (plain.float() * sw[:, None]).t()
    gemv_err = float((fp8_gemv(x, plain, sw).float() - gemv_want).norm() / gemv_want.norm()) if m <= 16 else 0

    def weight_only(qw_: torch.Tensor, s_: torch.Tensor, z_: torch.Tensor) -> torch.Tensor:
        if mma_dispatched(m, k, k, 8):
            return int_gemm_mma(x, qw_, s_, z_, 8, None, counters)
        return int_gemm(x, qw_, s_, z_, 8, None, counters)

    bf16 = graph_us(lambda wt: F.linear(x, wt), copies((w,)))
    w8a16 = graph_us(weight_only, copies((qw, s, z)))
    fp8 = graph_us(lambda a, b: fp8_scaled_mm(x, a, b.view(-1), None), copies((fq, fs)))
    if m <= 16:  # the plain int8 weight through the fp8 GEMV (its loads convert any 8-bit type)
        gemv = graph_us(lambda a, b: fp8_gemv(x, a, b, None, counters), copies((plain, sw)))
        return (
            f"| {name} | {m} | {bf16:.1f} | {w8a16:.1f} ({bf16 / w8a16:.2f}×) | GEMV on plain int8 "
            f"{gemv:.1f} ({bf16 / gemv:.2f}×) | {gemv_err:.0e} |"
        )
    times = {
        label: graph_us(
            lambda a, b, c=cfg: int8_gemm(quantize_int8_rows_triton(x)[0], sx, a, b, torch.bfloat16, c),
            copies((plain, sw)),
        )
        for label, cfg in CONFIGS.items()
    }
    int_mm = graph_us(lambda a: torch._int_mm(xq, a.t()), copies((plain,))) if m > 16 else float("nan")
    best = min(times, key=times.__getitem__)
    us = times[best]
    floor = max((n * k + 2 * n) / bw, 2 * m * n * k / (2 * flops)) * 1e6
    others = " / ".join(f"{t:.1f}" for t in times.values())
    return (
        f"| {name} | {m} | {bf16:.1f} | {w8a16:.1f} ({bf16 / w8a16:.2f}×) | {fp8:.1f} ({bf16 / fp8:.2f}×) | "
        f"**{us:.1f} ({bf16 / us:.2f}×)** {best} | {others} | _int_mm alone {int_mm:.1f} | "
        f"{floor:.1f} ({us / floor:.1f}×) | {err:.0e} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", type=int, nargs="*", default=list(MS))
    parser.add_argument("--layers", nargs="*", default=list(LAYERS))
    parser.add_argument("--bw", type=float, default=4.25e12)
    parser.add_argument("--flops", type=float, default=784e12)
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), {k: dataclasses.astuple(c) for k, c in CONFIGS.items()})
    print(
        "| layer | M | bf16 µs | int8 weight-only | fp8 W8A8 | int8 W8A8 (best) | all | _int_mm | floor"
        " | err |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.layers:
        n, k = LAYERS[name]
        for m in args.ms:
            print(row(name, n, k, m, args.bw, args.flops), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
