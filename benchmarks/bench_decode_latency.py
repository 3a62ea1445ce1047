"""Decode attention at the small batches of latency-bound serving (W3: one sequence, ~1.2k positions),
with and without programmatic dependent launch, and with shorter split partitions. Qwen3-8B heads (32 q,
8 KV, 128).

  no-pdl       the decode kernel, then (split plans) the reduce kernel, launched normally
  pdl          the same two launches with programmatic dependent launch (the default on sm_90+)
  pdl/64       partitions of 64 positions (one tile each: twice the programs)

Block tables are GRAPH_MAX_CONTEXT wide, as in the engine's decode graphs. µs per call: the median over
replays of one CUDA graph of back-to-back calls (bench_kernels.time_graph), so launch gaps count as they
do in the engine's decode graph. Each variant's output is checked against the reference first.

    source benchmarks/gpu_env.sh && python benchmarks/bench_decode_latency.py
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import KVH, PAGE, attn_bytes, close, num_sets, paged_batch, reference, time_graph
from kvpilot.runtime.kernels.decode_attention_triton import (
    DecodeConfig,
    default_decode_config,
    paged_decode_attention_triton,
    plan_decode,
)

GRAPH_MAX_CONTEXT = 16384  # model_runner's (not imported: it pulls the engine in)
SHAPES = ((1, 1152), (1, 4096), (4, 2048), (16, 1024), (32, 512))
VARIANTS = {
    "no-pdl": DecodeConfig(pdl=False),
    "pdl": DecodeConfig(),
    "pdl/64": DecodeConfig(min_partition=64),
}


def run(batch: int, ctx: int, cfg: DecodeConfig, replays: int = 200) -> tuple[float, bool, int]:
    sets = [paged_batch(batch, ctx, 1) for _ in range(num_sets(attn_bytes(batch, ctx, 1)))]
    for b in sets:  # the decode graphs' block-table width (model_runner.GRAPH_MAX_CONTEXT): the plan's
        pad = GRAPH_MAX_CONTEXT // PAGE - b["bt"].shape[1]
        b["bt"] = torch.nn.functional.pad(b["bt"], (0, max(pad, 0)))
    scale = 128**-0.5

    def call(b: dict[str, torch.Tensor]) -> Callable[[], torch.Tensor]:
        return lambda: paged_decode_attention_triton(
            b["q"], b["k"], b["v"], b["ctx"], b["bt"], scale, config=cfg
        )

    ok = close(call(sets[0])(), reference(sets[0], scale))
    us = time_graph([call(b) for b in sets], replays)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = plan_decode(batch, KVH, sets[0]["bt"].shape[1] * PAGE, sms, cfg).num_splits
    return us, ok, splits


def main() -> None:
    if default_decode_config(torch.bfloat16) != DecodeConfig():
        raise SystemExit("the bf16 default is no longer DecodeConfig(): update VARIANTS")
    rows = []
    for batch, ctx in SHAPES:
        cells = []
        for name, cfg in VARIANTS.items():
            us, ok, splits = run(batch, ctx, cfg)
            cells.append(f"{us:7.2f}{'' if ok else ' WRONG'}")
            if name == "pdl":
                plan = splits
        rows.append(f"| {batch} x {ctx} (splits {plan}) | " + " | ".join(cells) + " |")
    print("| batch x ctx | " + " | ".join(VARIANTS) + " |")
    print("|---" * (len(VARIANTS) + 1) + "|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
