"""Attention of a verification step, measured: Q = k + 1 query tokens per sequence over its paged context,
with the verify kernel (split-KV, kernels/verify_attention_triton.py) vs the prefill/extend kernel given
max_q_len = Q (what a captured graph would run without the verify kernel) vs one decode step (Q = 1).

Qwen3-8B heads (32 q heads, 8 KV heads, head_dim 128), bf16, page 16; block tables as wide as the decode
graphs' (4096 positions, W3's max_model_len) whatever the real context, as inside a captured graph. Each
launch is captured in a CUDA graph and replayed (microseconds per layer call, median of --replays).

    . benchmarks/gpu_env.sh && python benchmarks/bench_verify_attention.py [--q 5] [--out $OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

SHAPES = [(1, 1024), (1, 4096), (8, 1024), (8, 4096), (64, 1024), (64, 4096)]  # (batch, context)
HEADS, KV_HEADS, HEAD_DIM, PAGE, WIDTH = 32, 8, 128, 16, 4096


def graph_time_us(fn: Callable[[], Any], replays: int) -> float:
    fn()  # compile / warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 100.0)  # ms for 10 replays -> us per replay
    return statistics.median(times)


def inputs(batch: int, ctx: int, q: int) -> dict[str, torch.Tensor]:
    dev, bf16 = "cuda", torch.bfloat16
    blocks = WIDTH // PAGE
    num_blocks = batch * blocks
    tables = torch.arange(num_blocks, dtype=torch.int32, device=dev).view(batch, blocks)
    cache = (num_blocks, PAGE, KV_HEADS, HEAD_DIM)
    return {
        "q": torch.randn(batch * q, HEADS, HEAD_DIM, device=dev, dtype=bf16),
        "k_cache": torch.randn(cache, device=dev, dtype=bf16),
        "v_cache": torch.randn(cache, device=dev, dtype=bf16),
        "cu_seqlens_q": torch.arange(0, batch * q + 1, q, dtype=torch.int32, device=dev),
        "context_lens": torch.full((batch,), ctx, dtype=torch.int32, device=dev),
        "block_tables": tables,
    }


def measure(batch: int, ctx: int, q: int, replays: int) -> dict[str, float]:
    """Microseconds per call of the three kernels at one shape (verify checked against prefill first)."""
    from kvpilot.runtime.kernels.decode_attention_triton import paged_decode_attention_triton
    from kvpilot.runtime.kernels.prefill_attention_triton import paged_prefill_attention_triton
    from kvpilot.runtime.kernels.verify_attention_triton import paged_verify_attention_triton

    scale = HEAD_DIM**-0.5
    b, d = inputs(batch, ctx, q), inputs(batch, ctx, 1)
    keys = ("k_cache", "v_cache", "context_lens", "block_tables")
    varlen = ("q", "k_cache", "v_cache", "cu_seqlens_q", "context_lens", "block_tables")
    kernels: dict[str, Callable[[], Any]] = {
        "decode": lambda: paged_decode_attention_triton(d["q"], *(d[k] for k in keys), scale),
        "verify": lambda: paged_verify_attention_triton(b["q"], *(b[k] for k in keys), scale),
        "prefill": lambda: paged_prefill_attention_triton(*(b[k] for k in varlen), scale, max_q_len=q),
    }
    torch.testing.assert_close(kernels["verify"](), kernels["prefill"](), atol=2e-2, rtol=2e-2)
    return {name: graph_time_us(fn, replays) for name, fn in kernels.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--q", type=int, default=5, help="query tokens per sequence (k + 1)")
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    rows = []
    q = args.q
    print(f"| batch x context | decode (Q=1) us | verify kernel (Q={q}) us | prefill kernel (Q={q}) us |")
    print("|---|---|---|---|")
    for batch, ctx in SHAPES:
        row = measure(batch, ctx, q, args.replays)
        rows.append({"batch": batch, "context": ctx, **row})
        print(
            f"| {batch} x {ctx} | {row['decode']:.1f} | {row['verify']:.1f} | {row['prefill']:.1f} |",
            flush=True,
        )
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "verify_attention.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
