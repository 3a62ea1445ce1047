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
from collections.abc import Callable
from dataclasses import replace

import torch
from bench_kernels import (  # benchmarks/ is on sys.path when this file runs as a script
    BF16,
    KV8_DTYPES,
    PAGE,
    attn_bytes,
    attn_flops,
    measure,
    num_sets,
    paged_batch,
    reference,
)
from kvpilot.runtime.kernels.kv_cache import dequantize_ref
from kvpilot.runtime.kernels.prefill_attention_triton import paged_prefill_attention_triton
from kvpilot.runtime.kernels.prefill_plan import PrefillConfig, default_prefill_config

SCALE = 128**-0.5
CASES = (("8k prompt", 8192, 8192), ("last 4k of 8k", 8192, 4096), ("1x1024", 1024, 1024))


STEP_ROWS = "default + step rows (own tokens from the step's 16-bit K/V, prefix from the pages)"


def own_rows(b: dict[str, torch.Tensor], ctx: int, q_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunk's own K/V as the step's bf16 rows [q_len, KVH, D]: the dequantized page values, so the
    reference on the pages still applies."""
    pos = torch.arange(ctx - q_len, ctx, device=b["bt"].device)
    blk, off = b["bt"][0, pos // PAGE].long(), pos % PAGE
    k = dequantize_ref(b["k"][blk, off], b["ks"][blk, off] if "ks" in b else None)
    v = dequantize_ref(b["v"][blk, off], b["vs"][blk, off] if "vs" in b else None)
    return k.to(BF16), v.to(BF16)


def make_call(b: dict, cfg: PrefillConfig, ctx: int, q_len: int, rows: bool) -> Callable[[], torch.Tensor]:
    a = (b["q"], b["k"], b["v"], b["cu"], b["ctx"], b["bt"], SCALE)
    kv = own_rows(b, ctx, q_len) if rows else None
    scales = {"k_scale": b.get("ks"), "v_scale": b.get("vs")}
    return lambda: paged_prefill_attention_triton(
        *a, max_q_len=q_len, config=cfg, step_kv=kv, prefix_free=ctx == q_len, **scales
    )


def variants(dtype: torch.dtype) -> dict[str, PrefillConfig]:
    d = default_prefill_config(dtype)
    out = {"default": d, STEP_ROWS: d}
    if dtype == BF16:
        return out
    return out | {
        "v_tile": replace(d, v_tile=True),
        "bm128 w8": replace(d, block_m=128, num_warps=8),
        "old default (tile axis first)": replace(d, heads_first=False),
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

                try:
                    calls = [make_call(b, cfg, ctx, q_len, vname == STEP_ROWS) for b in sets]
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
