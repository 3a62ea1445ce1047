"""Prefill attention over 8-bit pages against 16-bit ones (issue 13's W2L row: 64 prompts of 8k, whose
prefill steps attend over pages that are int8/fp8 when the cache is): one H200 call.

    source benchmarks/gpu_env.sh && python benchmarks/sweep_prefill_kv8.py [--budget 80]

Cases (Qwen3-8B heads): a whole 8k prompt (q 8192 over ctx 8192, causal), the last 4k chunk of an 8k
prompt, 1 x 1024. Each KV dtype runs its default PrefillConfig and a few alternatives (tiles, warps,
stages, program order); every row prints µs, TFLOP/s, the ratio to the bf16 default of the same case and
max |out - reference on the dequantized cache|.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch
from bench_kernels import (  # benchmarks/ is on sys.path when this file runs as a script
    BF16,
    KV8_DTYPES,
    attn_bytes,
    attn_flops,
    measure,
    num_sets,
    paged_batch,
    reference,
)
from kvpilot.runtime.kernels.prefill_attention_triton import paged_prefill_attention_triton
from kvpilot.runtime.kernels.prefill_plan import PrefillConfig, default_prefill_config

SCALE = 128**-0.5
CASES = (("8k prompt", 8192, 8192), ("last 4k of 8k", 8192, 4096), ("1x1024", 1024, 1024))


def variants(dtype: torch.dtype) -> dict[str, PrefillConfig]:
    d = default_prefill_config(dtype)
    out = {"default": d}
    if dtype == BF16:
        return out
    hf = replace(d, heads_first=True)
    vt = replace(hf, v_tile=True)
    return out | {
        "heads_first": hf,
        "v_tile": replace(d, v_tile=True),
        "hf v_tile": vt,
        "hf v_tile s3": replace(vt, num_stages=3),
        "hf v_tile bn32": replace(vt, block_n=32),
        "hf v_tile bm128 w8": replace(vt, block_m=128, num_warps=8),
        "hf bn32": replace(hf, block_n=32),
        "hf bm128 w8": replace(hf, block_m=128, num_warps=8),
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--replays", type=int, default=5)
    p.add_argument("--budget", type=float, default=80.0)
    args = p.parse_args()
    start = time.time()
    print("| case | cache | config | µs | TFLOP/s | vs bf16 default | max_err |")
    print("|---|---|---|---|---|---|---|")
    for case, ctx, q_len in CASES:
        base = 0.0
        flops = attn_flops(1, ctx, q_len)
        for name, dtype in (("bf16", BF16), *KV8_DTYPES.items()):
            n_sets = num_sets(attn_bytes(1, ctx, q_len, dtype))
            sets = [paged_batch(1, ctx, q_len, dtype) for _ in range(n_sets)]
            ref = reference(sets[0], SCALE).float()
            for vname, cfg in variants(dtype).items():
                if time.time() - start > args.budget:
                    print(f"| {case} | {name} | {vname} | skipped (budget) |")
                    continue

                def call(b: dict, cfg: PrefillConfig = cfg, n: int = q_len):
                    a = (b["q"], b["k"], b["v"], b["cu"], b["ctx"], b["bt"], SCALE)
                    return lambda: paged_prefill_attention_triton(
                        *a, max_q_len=n, config=cfg, k_scale=b.get("ks"), v_scale=b.get("vs")
                    )

                try:
                    calls = [call(b) for b in sets]
                    err = float((calls[0]().float() - ref).abs().max())
                    us = measure(calls, args.replays)[0]
                except Exception as e:  # report a variant that does not compile, go on
                    print(f"| {case} | {name} | {vname} | failed: {str(e)[:90]} |", flush=True)
                    continue
                base = base or us
                tf = flops / (us * 1e-6) / 1e12
                cells = f"{us:.1f} | {tf:.0f} | {base / us:.2f}x | {err:.1e}"
                print(f"| {case} | {name} | {vname} | {cells} |", flush=True)
            del sets


if __name__ == "__main__":
    main()
