"""The attention prologue (kernels/qkv_prepare_triton.py) at prefill size on the GPU: one step of 8,192 tokens
of Qwen3-8B heads (32 q / 8 KV, head_dim 128, q/k norm, rotary) into a bf16, fp8 or int8 paged cache, with
and without the step's k written back over qkv (k_to_qkv: the 8-bit caches' prefill steps), per launch
width (num_warps; the default is 1). A W2L profile (BENCHMARKS.md, fifth session) had this launch at
123 µs per layer with an int8 cache against 80 with bf16, at 2 warps.

    source benchmarks/gpu_env.sh && python benchmarks/bench_qkv_prepare.py

Prints µs (CUDA-graph median) and the bytes moved over the time as a share of 4.25 TB/s.
"""

from __future__ import annotations

import torch
from bench_kernels import time_graph
from kvpilot.runtime.kernels.qkv_prepare_triton import qkv_prepare_triton

TOKENS, H, KVH, D, PAGE = 8192, 32, 8, 128, 16
DEV, BF16 = "cuda", torch.bfloat16
CACHES = {"bf16": BF16, "fp8": torch.float8_e4m3fn, "int8": torch.int8}


def launch(dtype: torch.dtype, warps: int, k_to_qkv: bool):
    qkv = torch.randn(TOKENS, (H + 2 * KVH) * D, device=DEV, dtype=BF16)
    positions = torch.arange(TOKENS, device=DEV)
    cos_sin = torch.randn(TOKENS, D, device=DEV, dtype=torch.float32)
    k = torch.zeros(TOKENS // PAGE, PAGE, KVH, D, device=DEV, dtype=dtype)
    v = torch.zeros_like(k)
    scales = {}
    if dtype.itemsize == 1:
        scales = {n: torch.zeros(TOKENS // PAGE, PAGE, KVH, device=DEV) for n in ("k_scale", "v_scale")}
    slots = torch.randperm(TOKENS, device=DEV)
    nw = torch.ones(D, device=DEV, dtype=BF16)
    return lambda: qkv_prepare_triton(
        qkv, positions, cos_sin, k, v, slots, nw, nw, k_to_qkv=k_to_qkv, num_warps=warps, **scales
    )


def main() -> None:
    print("| cache | k_to_qkv | num_warps | µs | % of 4.25 TB/s |")
    print("|---|---|---|---|---|")
    for name, dtype in CACHES.items():
        for k_to_qkv in (False, True) if dtype.itemsize == 1 else (False,):
            for warps in (1, 2, 4):
                us = time_graph([launch(dtype, warps, k_to_qkv)], 10)
                # read qkv; write q, k, v (and the scales, and k over qkv)
                moved = TOKENS * ((H + 2 * KVH) * D * 2 + H * D * 2 + 2 * KVH * D * dtype.itemsize)
                moved += TOKENS * KVH * 8 * (dtype.itemsize == 1) + TOKENS * KVH * D * 2 * k_to_qkv
                pct = 100 * moved / (us * 1e-6) / 4.25e12
                print(f"| {name} | {k_to_qkv} | {warps} | {us:.1f} | {pct:.0f}% |", flush=True)


if __name__ == "__main__":
    main()
