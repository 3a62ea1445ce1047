"""A W2L mixed step's prefill launch on the GPU: the tail of one 8k prompt (40 tokens after 8,152 cached
positions) and the first 8,150 tokens of the next prompt in one launch, Qwen3-8B heads (issue 13's W2L
row; BENCHMARKS.md, fifth session).

    source benchmarks/gpu_env.sh && python benchmarks/bench_prefill_mixed.py

bf16 runs its engine path (the pages, no step rows: the launch has a prefix). int8 and fp8 run theirs
(the step's own K/V rows, the prefix from the 8-bit pages) with the tail's prefix split over programs
(prefill_split_triton.py) or not, at 2 or 3 stages, and as two launches (the tail alone, then the prompt
as a prefix-free launch). Prints µs (eager medians: each launch takes ms) and max |out - reference|.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from bench_kernels import BF16, KV8_DTYPES, PAGE, measure, paged_batch, reference
from kvpilot.runtime.kernels.kv_cache import dequantize_ref
from kvpilot.runtime.kernels.prefill_attention_triton import paged_prefill_attention_triton
from kvpilot.runtime.kernels.prefill_plan import default_prefill_config

SCALE = 128**-0.5
CTX, TAIL, PROMPT = 8192, 40, 8150


def mixed_batch(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Two sequences on shuffled pages: [tail: q 40, ctx 8192], [prompt: q 8150, ctx 8150]."""
    b = paged_batch(2, CTX, 1, dtype)
    dev = b["q"].device
    b["q"] = torch.randn(TAIL + PROMPT, *b["q"].shape[1:], device=dev, dtype=BF16)
    b["cu"] = torch.tensor([0, TAIL, TAIL + PROMPT], device=dev, dtype=torch.int32)
    b["ctx"] = torch.tensor([CTX, PROMPT], device=dev, dtype=torch.int32)
    rows = [_own(b, 0, CTX - TAIL, CTX), _own(b, 1, 0, PROMPT)]
    b["kr"], b["vr"] = (torch.cat([r[i] for r in rows]) for i in range(2))
    return b


def _own(b: dict[str, torch.Tensor], seq: int, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
    pos = torch.arange(lo, hi, device=b["bt"].device)
    blk, off = b["bt"][seq, pos // PAGE].long(), pos % PAGE
    k = dequantize_ref(b["k"][blk, off], b["ks"][blk, off] if "ks" in b else None)
    v = dequantize_ref(b["v"][blk, off], b["vs"][blk, off] if "vs" in b else None)
    return k.to(BF16), v.to(BF16)


def call(b: dict[str, torch.Tensor], cfg, rows: bool, max_ctx: int | None, sel: slice | None = None):
    seqs = sel or slice(0, 2)
    lo, hi = int(b["cu"][seqs.start]), int(b["cu"][seqs.stop])
    cu = b["cu"][seqs.start : seqs.stop + 1] - lo
    kv = (b["kr"][lo:hi], b["vr"][lo:hi]) if rows else None
    scales = {"k_scale": b.get("ks"), "v_scale": b.get("vs")}
    prefix_free = rows and seqs.start == 1
    return lambda: paged_prefill_attention_triton(
        b["q"][lo:hi], b["k"], b["v"], cu, b["ctx"][seqs], b["bt"][seqs], SCALE, max_q_len=int(cu[-1]),
        config=cfg, step_kv=kv, prefix_free=prefix_free, max_context_len=max_ctx, **scales,
    )  # fmt: skip


def main() -> None:
    print("| cache | variant | µs | max_err |")
    print("|---|---|---|---|")
    for name, dtype in (("bf16", BF16), *KV8_DTYPES.items()):
        b = mixed_batch(dtype)
        ref = reference(b, SCALE).float()
        cfg = default_prefill_config(dtype)
        if dtype == BF16:
            rows = {"engine path (pages)": [call(b, cfg, False, CTX)]}
        else:
            rows = {
                "step rows, split (default)": [call(b, cfg, True, CTX)],
                "step rows, no split": [call(b, cfg, True, None)],
                "step rows, split, 3 stages": [call(b, replace(cfg, num_stages=3), True, CTX)],
                "two launches: tail (split) + prompt (prefix-free)": [
                    call(b, cfg, True, CTX, slice(0, 1)),
                    call(b, cfg, True, CTX, slice(1, 2)),
                ],
            }
        for vname, calls in rows.items():
            outs = [c() for c in calls]
            err = float((torch.cat(outs).float() - ref).abs().max())
            us = measure([lambda calls=calls: [c() for c in calls]], 5, graph=False)[0]
            print(f"| {name} | {vname} | {us:.1f} | {err:.1e} |", flush=True)


if __name__ == "__main__":
    main()
