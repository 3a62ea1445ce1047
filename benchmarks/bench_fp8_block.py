"""Block-wise fp8 weights (Qwen3-FP8 / DeepSeek-V3 checkpoints, 128 x 128 blocks) against bf16 cuBLAS and
per-channel fp8 (the dispatch of quant/fp8_gemm.py: weight-only GEMV up to 16 tokens, torch._scaled_mm
above) at Qwen3-8B's layer shapes, side by side in one run: the weight-only Triton GEMM at every M, and
above 16 tokens the W8A8 block-scaled torch._scaled_mm that the dispatch runs there.

    source benchmarks/gpu_env.sh && python benchmarks/bench_fp8_block.py --bw 4.25e12

Times are CUDA-graph replays over enough weight copies to stream from HBM (bench_w4a16.graph_us). The floor
of each cell is the larger of its weight bytes / --bw and its FLOPs / --flops (defaults: the H200's
measured 4.25 TB/s and 784 TFLOP/s; --bw 0 measures this GPU's copy rate). Each block-fp8 output is
checked against the reference first.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from bench_w4a16 import LAYERS, copies, graph_us
from kvpilot.runtime.kernels.fp8_block_gemm_triton import fp8_block_gemm
from kvpilot.runtime.kernels.quant_reference import (
    FP8_WEIGHT_ONLY_MAX_M,
    fp8_block_gemm_ref,
    quantize_fp8_rows_ref,
)
from kvpilot.runtime.kernels.split_k_triton import split_counters
from kvpilot.runtime.quant.fp8_block import block_scaled_mm, quantize_fp8_blocks
from kvpilot.runtime.quant.fp8_gemm import fp8_linear

MS = (1, 4, 16, 64, 256, 1024)
BLOCK = 128


def row(name: str, n: int, k: int, m: int, bw: float, flops: float) -> str:
    dev = torch.device("cuda")
    w = 0.02 * torch.randn(n, k, device=dev)
    q, scale = quantize_fp8_blocks(w, BLOCK, BLOCK)  # [N / 128, K / 128]
    channel_q, channel_scale = quantize_fp8_rows_ref(w)
    x = (0.1 * torch.randn(m, k, device=dev)).bfloat16()
    counters = split_counters(n, dev)
    got = fp8_block_gemm(x, q, scale, (BLOCK, BLOCK), counters).float()
    want = fp8_block_gemm_ref(x.float(), q, scale, (BLOCK, BLOCK))
    err = float((got - want).norm() / want.norm())
    bf16 = graph_us(lambda wt: F.linear(x, wt), copies((w.bfloat16(),)))
    channel = graph_us(
        lambda wq, ws: fp8_linear(x, wq, ws, None), copies((channel_q, channel_scale.view(-1)))
    )
    block = graph_us(lambda wq, ws: fp8_block_gemm(x, wq, ws, (BLOCK, BLOCK), counters), copies((q, scale)))
    w8a8, dispatched = "-", block
    if m > FP8_WEIGHT_ONLY_MAX_M:  # what the dispatch runs there (quant/fp8_block.py)
        dispatched = graph_us(lambda wq, ws: block_scaled_mm(x, wq, ws), copies((q, scale)))
        w8a8 = f"{dispatched:.1f} ({bf16 / dispatched:.2f}×)"
    fp8_bytes = n * k + scale.numel() * 4
    floor = max(fp8_bytes / bw, 2 * m * n * k / flops) * 1e6
    return (
        f"| {name} | {m} | {bf16:.1f} | {channel:.1f} ({bf16 / channel:.2f}×) | "
        f"{block:.1f} ({bf16 / block:.2f}×, {fp8_bytes / block / 1e3:.0f} GB/s) | {w8a8} | "
        f"{floor:.1f} ({dispatched / floor:.1f}× floor) | {err:.0e} |"
    )


def copy_bandwidth() -> float:
    """Bytes per second of a 2 GiB device-to-device copy (read + write): this GPU's measured HBM rate."""
    src = torch.empty(2**30, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    us = graph_us(lambda a, b: b.copy_(a), [(src, dst)] * 4)
    return 2 * src.numel() / (us * 1e-6)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ms", type=int, nargs="*", default=list(MS))
    parser.add_argument("--layers", nargs="*", default=list(LAYERS))
    parser.add_argument("--bw", type=float, default=4.25e12)
    parser.add_argument("--flops", type=float, default=784e12)
    args = parser.parse_args()
    bw = args.bw or copy_bandwidth()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, floor at {bw / 1e12:.2f} TB/s")
    print(
        "| layer | M | bf16 µs | fp8 per channel µs (×bf16) | fp8 block µs (×bf16, GB/s) | floor µs | err |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in args.layers:
        n, k = LAYERS[name]
        for m in args.ms:
            print(row(name, n, k, m, bw, args.flops), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
