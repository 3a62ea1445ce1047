"""The weight-only GEMMs against bf16 cuBLAS at Qwen3-8B's layer shapes, side by side in one run.

    source benchmarks/gpu_env.sh && python benchmarks/bench_w4a16.py --out $OUT/bench_w4a16.json

Per (layer, M): bf16 cuBLAS (F.linear), W4A16 fused Triton kernel, W4A16 dequantize + cuBLAS, W4A16 as the
runtime dispatches it (int_gemm), W8A16 (int8 per channel) as dispatched, fp8 W8A8 (torch._scaled_mm with
per-token activation scales) where the GPU has fp8. Times from triton.testing.do_bench (median, L2 flushed
between runs), so weights come from HBM as in a real decode step. Each kernel's output is checked against
the bf16 GEMM of the same dequantized weight first (relative error printed). Targets (issue 12): W4A16
>= 2.5x bf16 at M <= 16, >= 1.0x at M = 64. --sweep also times other decode launch shapes (BLOCK_N,
split-K) so DECODE settings can be chosen from the same run.

At M <= GRAPH_MAX_M the decode-relevant columns are also timed the way the engine runs decode: replayed from
a CUDA graph (no Python/launch overhead, which do_bench includes and which dominates a ~10 µs kernel),
over enough copies of the weight that they stream from HBM rather than L2 (*_graph_us).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from kvpilot.runtime.kernels.quant_reference import dequantize_int_ref
from kvpilot.runtime.kernels.w4a16_triton import dequantize_triton, int_gemm, int_gemm_fused
from kvpilot.runtime.quant.fp8_gemm import fp8_scaled_mm
from kvpilot.runtime.quant.int_weight import quantize_rtn
from triton.testing import do_bench

# Qwen3-8B: hidden 4096, 32 x 128 q heads, 8 x 128 kv heads, intermediate 12288.
LAYERS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
MS = (1, 4, 16, 64, 256, 1024)
GRAPH_MAX_M = 64
STREAM_BYTES = 400 * 2**20  # weight copies per graph: well past the H200's 50 MiB L2


def us(fn: Any, *args: Any, **kwargs: Any) -> float:
    """Median microseconds of fn(*args, **kwargs)."""
    return float(do_bench(lambda: fn(*args, **kwargs), warmup=25, rep=100, return_mode="median")) * 1e3


def graph_us(fn: Any, arg_sets: list[tuple[Any, ...]], replays: int = 20) -> float:
    """Mean microseconds per call of fn over arg_sets (one call each, distinct weights), from a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for args in arg_sets:  # compile and warm up outside the capture
            fn(*args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for args in arg_sets:
            fn(*args)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (replays * len(arg_sets))


def copies(tensors: tuple[torch.Tensor, ...]) -> list[tuple[torch.Tensor, ...]]:
    """Enough clones of one weight's tensors to span STREAM_BYTES (each call then reads from HBM)."""
    size = sum(t.numel() * t.element_size() for t in tensors)
    return [tuple(t.clone() for t in tensors) for _ in range(max(2, -(-STREAM_BYTES // size)))]


def graph_row(x: torch.Tensor, w: torch.Tensor, w4: tuple, w8: tuple) -> dict[str, float]:
    """bf16 / W4 / W8 as dispatched at this M, each over its own rotating weight copies."""
    bf16 = graph_us(F.linear, [(x, t[0]) for t in copies((w,))])
    w4_us = graph_us(int_gemm, [(x, *t, 4) for t in copies(w4)])
    w8_us = graph_us(int_gemm, [(x, *t, 8) for t in copies(w8)])
    return {"bf16_graph_us": bf16, "w4_graph_us": w4_us, "w8_graph_us": w8_us}


def sweep_decode(name: str, x: torch.Tensor, w4_sets: list[tuple], default: float) -> dict[str, float]:
    """The fused kernel's decode launch shapes (BLOCK_N, split-K, warps), graph-timed like the default."""
    k, times = x.shape[1], {}
    for block_n, split, warps in itertools.product((32, 64, 128), (1, 2, 4, 8, 16), (4, 8)):
        if (k // 128) % split == 0:
            fn = functools.partial(int_gemm_fused, split_k=split, block_n=block_n, num_warps=warps)
            times[f"w4_bn{block_n}_split{split}_w{warps}_graph_us"] = graph_us(
                fn, [(x, *t, 4) for t in w4_sets]
            )
    best = min((v, key) for key, v in times.items())
    print(f"# {name} M={x.shape[0]}: best decode launch {best[1]} {best[0]:.1f} µs (default {default:.1f})")
    return times


def dequant_cublas(x: torch.Tensor, qweight: torch.Tensor, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    return x @ dequantize_triton(qweight, s, z, 4, x.dtype)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def bench_layer(name: str, n: int, k: int, sweep: bool) -> list[dict[str, Any]]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(n, k, device="cuda", generator=gen, dtype=torch.bfloat16) * 0.02
    w4 = quantize_rtn(w, 4, 128, sym=False)
    w8 = quantize_rtn(w, 8, -1, sym=True)
    s4, z4 = w4.scales.bfloat16(), w4.zeros.bfloat16()
    s8, z8 = w8.scales.bfloat16(), w8.zeros.bfloat16()
    w4_dense = dequantize_int_ref(w4.qweight, s4, z4, 4).t().contiguous()  # [N, K] bf16
    w8_dense = dequantize_int_ref(w8.qweight, s8, z8, 8).t().contiguous()
    fp8_ok = torch.cuda.get_device_capability() >= (8, 9)
    if fp8_ok:
        absmax = w.float().abs().amax(dim=1).clamp(min=1e-12)
        w_scale = absmax / 448.0
        w_fp8 = (w.float() / w_scale.view(-1, 1)).to(torch.float8_e4m3fn)
    rows = []
    for m in MS:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 0.1
        row: dict[str, Any] = {"layer": name, "n": n, "k": k, "m": m}
        ref4, ref8 = F.linear(x, w4_dense), F.linear(x, w8_dense)
        row["err_w4_fused"] = rel_err(int_gemm_fused(x, w4.qweight, s4, z4, 4), ref4)
        row["err_w4"] = rel_err(int_gemm(x, w4.qweight, s4, z4, 4), ref4)
        row["err_w8"] = rel_err(int_gemm(x, w8.qweight, s8, z8, 8), ref8)
        row["bf16_us"] = us(F.linear, x, w)
        row["w4_fused_us"] = us(int_gemm_fused, x, w4.qweight, s4, z4, 4)
        row["w4_dequant_cublas_us"] = us(dequant_cublas, x, w4.qweight, s4, z4)
        row["w4_us"] = us(int_gemm, x, w4.qweight, s4, z4, 4)
        row["w8_us"] = us(int_gemm, x, w8.qweight, s8, z8, 8)
        if fp8_ok:
            row["err_fp8"] = rel_err(fp8_scaled_mm(x, w_fp8, w_scale, None), F.linear(x, w))
            row["fp8_us"] = us(fp8_scaled_mm, x, w_fp8, w_scale, None)
        if m <= GRAPH_MAX_M:
            row |= graph_row(x, w, (w4.qweight, s4, z4), (w8.qweight, s8, z8))
        if sweep and m in (1, 16):
            row |= sweep_decode(name, x, copies((w4.qweight, s4, z4)), row["w4_graph_us"])
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| layer | M | bf16 µs | W4 fused µs | W4 deq+cuBLAS µs | W4 (dispatch) µs | W4 ×bf16 | W8 µs "
        "| W8 ×bf16 | fp8 µs | fp8 ×bf16 |\n|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in rows:
        fp8 = f"{r['fp8_us']:.1f} | {r['bf16_us'] / r['fp8_us']:.2f}×" if "fp8_us" in r else "— | —"
        lines.append(
            f"| {r['layer']} | {r['m']} | {r['bf16_us']:.1f} | {r['w4_fused_us']:.1f} | "
            f"{r['w4_dequant_cublas_us']:.1f} | {r['w4_us']:.1f} | {r['bf16_us'] / r['w4_us']:.2f}× | "
            f"{r['w8_us']:.1f} | {r['bf16_us'] / r['w8_us']:.2f}× | {fp8} |"
        )
    for m in MS:  # one decoder layer: the four GEMMs together
        sel = [r for r in rows if r["m"] == m]
        bf16, w4, w8 = (sum(r[key] for r in sel) for key in ("bf16_us", "w4_us", "w8_us"))
        w4_x, w8_x = bf16 / w4, bf16 / w8
        lines.append(
            f"| all 4 | {m} | {bf16:.1f} | | | {w4:.1f} | {w4_x:.2f}× | {w8:.1f} | {w8_x:.2f}× | | |"
        )
    lines += ["", "CUDA-graph replay, weights streamed from HBM (the engine's decode):", graph_table(rows)]
    return "\n".join(lines)


def graph_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| layer | M | bf16 µs | W4 µs | W4 ×bf16 | W4 GB/s | W8 µs | W8 ×bf16 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "w4_graph_us" not in r:
            continue
        bf16, w4, w8 = r["bf16_graph_us"], r["w4_graph_us"], r["w8_graph_us"]
        gbps = r["n"] * r["k"] / 2 / (w4 * 1e3)  # int4 weight bytes per ns = GB/s
        lines.append(
            f"| {r['layer']} | {r['m']} | {bf16:.1f} | {w4:.1f} | {bf16 / w4:.2f}× | {gbps:.0f} | "
            f"{w8:.1f} | {bf16 / w8:.2f}× |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None, help="write every row as JSON here")
    p.add_argument("--layers", default=",".join(LAYERS))
    p.add_argument("--sweep", action="store_true", help="also time split-K choices at M <= 16")
    args = p.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    rows = []
    for name in args.layers.split(","):
        rows += bench_layer(name, *LAYERS[name], args.sweep)
        if args.out:
            args.out.write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
