"""One decode token's GEMMs of Qwen3-8B at batch 1: 36 layers of (RMSNorm + residual -> QKV, a stand-in
for attention, O, RMSNorm + residual -> gate/up, SiLU-and-mul -> down) in one CUDA graph, with the real
data flow between them, as the engine replays them. Per weight format (--quant bf16,fp8,int4,int8):

  unfused     rms_norm_triton / silu_and_mul_triton + the format's GEMM as main dispatched it before the
              fused quantized GEMVs (bf16: cuBLAS; fp8: fp8_gemv; int: w4a16_triton.int_gemm)
  fused       the model's entries: bf16 kernels/gemv_dispatch.py, quantized quant/fused_gemv.py with its
              switches (what fuses by default), programmatic dependent launch where the model uses it
  the rest    fused with one thing changed (benchmarks/chain_variants.py lists them): a fusion the model
              leaves off, no PDL, split-K partials summed 4 at a time (fixup_wide), the int4 mma GEMV's
              l2_ahead prefetch, other fp8 prologue tiles.
Measured (H200, 2026-12-01): bf16 (13.89 GB of weights, floor 3.269 ms) unfused 4.01-4.07 ms/token, fused
GEMVs 3.64-3.65 (3.585 with PDL in an earlier run); the quantized formats' rows are in
quant/fused_gemv.py's doc.

    source benchmarks/gpu_env.sh && python benchmarks/bench_gemv_chain.py --quant bf16,fp8,int4

The stand-in for attention is one copy kernel (q out of qkv), launched normally: it ends any PDL overlap
as the real attention kernels would. Prints ms per token of the chain, its weight bytes over the time,
and each variant's output error against its format's unfused chain after the graph replays (PDL must
not race).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chain_variants import HIDDEN, INTER, QKV, LayerFn, make_layer, variants, weight_bytes

LAYERS = 36
BF16 = torch.bfloat16


def forward(layer_fn: LayerFn, layers: list[dict], h: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    for p in layers:
        h, r = layer_fn(h, r, p)
    return h + r


def _warm(key: tuple[str, str]) -> str:
    """Worker: run one layer of a variant so that Triton compiles into the on-disk cache."""
    quant, name = key
    torch.manual_seed(0)
    layers = [make_layer(quant)]
    h, r = torch.randn(2, 1, HIDDEN, device="cuda", dtype=BF16)
    try:
        forward(variants(quant)[name], layers, h, r)
        torch.cuda.synchronize()
        return ""
    except Exception as e:  # reported again by the timing process
        return f"{quant}/{name} failed: {e!r}"[:200]


def time_graph(fn: Callable[[], torch.Tensor], replays: int = 9) -> tuple[float, torch.Tensor]:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), out


def run_format(quant: str, only: set[str] | None) -> None:
    torch.manual_seed(0)
    layers = [make_layer(quant) for _ in range(LAYERS)]
    nbytes = LAYERS * weight_bytes(quant)
    h, r = torch.randn(2, 1, HIDDEN, device="cuda", dtype=BF16)
    ref = None
    for name, fn in variants(quant).items():
        if only and name not in only and name != "unfused":
            continue
        try:
            ms, out = time_graph(lambda fn=fn: forward(fn, layers, h, r))
        except Exception as e:
            print(f"{quant:5} {name:22} failed: {e!r}"[:300], flush=True)
            continue
        ref = out.clone() if ref is None else ref
        err = float((out.float() - ref.float()).norm() / ref.float().norm())
        tbps = nbytes / (ms * 1e-3) / 1e12
        print(f"{quant:5} {name:22} {ms:.3f} ms/token {tbps:.2f} TB/s | err vs unfused {err:.1e}", flush=True)
    floor_ms = nbytes / 4.25e12 * 1e3
    print(f"# {quant}: weights {nbytes / 1e9:.2f} GB, floor {floor_ms:.3f} ms at 4.25 TB/s", flush=True)
    layers.clear()
    torch.cuda.empty_cache()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quant", default="bf16,fp8,int4", help="comma list of bf16, fp8, int4, int8")
    parser.add_argument("--only", default="", help="comma list of variant names (unfused always runs)")
    args = parser.parse_args()
    formats = args.quant.split(",")
    only = set(args.only.split(",")) if args.only else None
    keys = [(q, n) for q in formats for n in variants(q) if not only or n in only or n == "unfused"]
    t0 = time.monotonic()
    with mp.get_context("spawn").Pool(min(len(keys), 16)) as pool:
        failed = [msg for msg in pool.map(_warm, keys) if msg]
    print(f"# warm-up of {len(keys)} variants: {time.monotonic() - t0:.1f}s; " + ("; ".join(failed) or "ok"))
    print(f"# Qwen3-8B: hidden {HIDDEN}, qkv {QKV}, intermediate {INTER}, {LAYERS} layers, M = 1")
    for quant in formats:
        run_format(quant, only)
    print(f"# {time.monotonic() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
