"""The weight-only GEMMs against bf16 cuBLAS at Qwen3-8B's layer shapes, side by side in one run.

    source benchmarks/gpu_env.sh && python benchmarks/bench_w4a16.py --sweep --out $OUT/bench_w4a16.json

Every time is a CUDA-graph replay (as the engine runs decode: no Python or launch overhead in the number)
over enough copies of the weight that each call streams it from HBM, not the 50 MiB L2. Columns per
(layer, M): bf16 cuBLAS (F.linear); W4A16 as dispatched (int_gemm: the GEMV below M = 256), the
previous split-K tensor-core kernel (int_gemm_fused), dequantize + cuBLAS; W8A16 int8 per channel as
dispatched; fp8 weight-only GEMV (dispatched at M <= 16; timed up to 256) and fp8 W8A8 torch._scaled_mm with
per-token activation scales; at M >= 256 also the int4 GEMV at 64 tokens per program (w4_gemv64, not
dispatched there).
GB/s counts the weight bytes each format streams (scales included). Each kernel's output is checked against
the bf16 GEMM of the same dequantized weight first (max relative error printed at the end).
Targets (issue 12): W4A16 >= 2.5x bf16 at M <= 16, >= 1.0x at M = 64.

--sweep also times the decode launch shapes (kernels/int_gemv_triton.GemvConfig: multiply path, BLOCK_N,
split-K, tiles per step, reduction, warps, tokens per program) at M = 1, 16, 64 within a time budget and
prints the best per layer and M.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from kvpilot.runtime.kernels.fp8_gemv_triton import fp8_gemv
from kvpilot.runtime.kernels.int_gemv_triton import GemvConfig, default_gemv_config, int_gemv
from kvpilot.runtime.kernels.quant_reference import dequantize_int_ref
from kvpilot.runtime.kernels.split_k_triton import split_counters
from kvpilot.runtime.kernels.w4a16_triton import dequantize_triton, int_gemm, int_gemm_fused
from kvpilot.runtime.quant.fp8_gemm import fp8_linear, fp8_scaled_mm
from kvpilot.runtime.quant.int_weight import quantize_rtn

# Qwen3-8B: hidden 4096, 32 x 128 q heads, 8 x 128 kv heads, intermediate 12288.
LAYERS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
MS = (1, 4, 16, 64, 256)
SWEEP_MS = (1, 16, 64)
STREAM_BYTES = 400 * 2**20  # weight copies per graph: well past the H200's 50 MiB L2
COLUMNS = ("bf16", "w4", "w4_triton", "w4_old", "w4_deq", "w4_gemv64", "w8", "fp8_wo", "fp8_mm")


def graph_us(fn: Callable[..., Any], arg_sets: list[tuple[Any, ...]], replays: int = 10) -> float:
    """Mean microseconds per call of fn over arg_sets (one call each, distinct weights), from a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for args in arg_sets[:2]:  # compile and warm up outside the capture
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


def nbytes(tensors: tuple[torch.Tensor, ...]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def copies(tensors: tuple[torch.Tensor, ...]) -> list[tuple[torch.Tensor, ...]]:
    """Enough clones of one weight's tensors to span STREAM_BYTES (each call then reads from HBM)."""
    return [tuple(t.clone() for t in tensors) for _ in range(max(2, -(-STREAM_BYTES // nbytes(tensors))))]


class Formats:
    """One layer's weight in every format, with the call that runs each column at a given x."""

    def __init__(self, n: int, k: int, group: int = 128) -> None:
        gen = torch.Generator(device="cuda").manual_seed(0)
        w = torch.randn(n, k, device="cuda", generator=gen, dtype=torch.bfloat16) * 0.02
        w4, w8 = quantize_rtn(w, 4, group, sym=False), quantize_rtn(w, 8, -1, sym=True)
        self.w4 = (w4.qweight, w4.scales.bfloat16(), w4.zeros.bfloat16())
        self.w8 = (w8.qweight, w8.scales.bfloat16(), w8.zeros.bfloat16())
        scale = w.float().abs().amax(dim=1).clamp(min=1e-12) / 448.0
        self.fp8 = ((w.float() / scale.view(-1, 1)).to(torch.float8_e4m3fn), scale)
        self.bf16 = (w,)
        self.counters = split_counters(n, w.device)  # split-K counters, as a layer's method owns them
        self.dense = {  # [N, K] bf16 of each quantized weight: the error reference
            "w4": dequantize_int_ref(*self.w4, 4).t().contiguous(),
            "w8": dequantize_int_ref(*self.w8, 8).t().contiguous(),
            "fp8": (self.fp8[0].float() * scale.view(-1, 1)).bfloat16(),
        }

    def runs(self, m: int) -> Iterator[tuple[str, Callable[..., Any], tuple[torch.Tensor, ...], str]]:
        """(column, fn(x, *weight), weight tensors, reference key) for the columns that apply at M = m."""
        yield "bf16", F.linear, self.bf16, "bf16"
        yield "w4", lambda x, *t: int_gemm(x, *t, 4, counters=self.counters), self.w4, "w4"
        if m <= 16:  # the dispatch's Triton kernels where w4a16_gemv.cu now runs
            yield (
                "w4_triton",
                lambda x, *t: int_gemm(x, *t, 4, counters=self.counters, cuda_kernel=False),
                self.w4,
                "w4",
            )
        if m <= 64:
            yield "w4_old", lambda x, *t: int_gemm_fused(x, *t, 4), self.w4, "w4"
        if m >= 16:
            yield "w4_deq", lambda x, q, s, z: x @ dequantize_triton(q, s, z, 4, x.dtype), self.w4, "w4"
        yield "w8", lambda x, *t: int_gemm(x, *t, 8, counters=self.counters), self.w8, "w8"
        if m <= 16:
            yield "fp8_wo", lambda x, w, s: fp8_linear(x, w, s, None, counters=self.counters), self.fp8, "fp8"
        elif m <= 256:  # not dispatched above 16 tokens: is the weight-only GEMV still ahead of W8A8?
            yield "fp8_wo", lambda x, w, s: fp8_gemv(x, w, s, counters=self.counters), self.fp8, "fp8"
        if m >= 256:  # dispatched to dequantize + cuBLAS: would the GEMV (64 tokens per program) win?
            cfg = default_gemv_config(64, self.w4[0].shape[1], self.w4[0].shape[0] * 8, 4, 132)
            yield "w4_gemv64", lambda x, *t: int_gemv(x, *t, 4, cfg, self.counters), self.w4, "w4"
        yield "fp8_mm", lambda x, w, s: fp8_scaled_mm(x, w, s, None), self.fp8, "fp8"


def sweep_cell(
    run: Callable[..., torch.Tensor],
    x: torch.Tensor,
    weight: tuple[torch.Tensor, ...],
    sets: list[tuple[torch.Tensor, ...]],
    want: torch.Tensor,
    bf16_us: float,
) -> str:
    """One variant's cell of the CUDA sweeps: run(x, *weight)'s max error against want (float), then its
    graph time over the weight copies beside bf16 (a launch the driver refuses: the end of its error)."""
    try:
        err = (run(x, *weight).float() - want).abs().max() / want.abs().max()
    except RuntimeError as error:  # shared memory, cluster
        return str(error)[-24:]
    us = graph_us(run, [(x, *t) for t in sets])
    return f"{us:.1f} ({bf16_us / us:.2f}×, {nbytes(weight) / us / 1e3:.0f} GB/s, err {err:.0e})"


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def bench_layer(name: str, n: int, k: int) -> tuple[list[dict[str, Any]], Formats]:
    fmt, rows = Formats(n, k), []
    for m in MS:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 0.1
        row: dict[str, Any] = {"layer": name, "n": n, "k": k, "m": m}
        for col, fn, tensors, ref in fmt.runs(m):
            want = F.linear(x, fmt.bf16[0] if ref == "bf16" else fmt.dense[ref])
            try:  # one failing column (a compile error on this Triton) must not lose the others
                row[f"err_{col}"] = rel_err(fn(x, *tensors), want)
                row[f"{col}_us"] = graph_us(fn, [(x, *t) for t in copies(tensors)])
            except Exception as e:  # reported in the row and the log
                row[f"fail_{col}"] = repr(e)[:300]
                print(f"# {name} M={m} {col} failed: {e!r}"[:400], flush=True)
                continue
            row[f"{col}_gbs"] = nbytes(tensors) / (row[f"{col}_us"] * 1e3)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows, fmt


def sweep_configs(m: int, steps: int) -> Iterator[GemvConfig]:
    """The launch shapes worth timing at M = m (splits dividing the K steps of 128 rows), most telling
    first (a sweep cut short by its time budget keeps those)."""
    splits = [s for s in (1, 2, 4, 8, 12, 16) if steps % s == 0]
    base = GemvConfig(True, 128, max(s for s in splits if s <= 8), 1, "fixup", 4, 4, pair_asm=True)
    if m > 16:  # tokens per program (M = 64 in 1, 2 or 4 row blocks)
        for block_m, split in itertools.product((64, 32, 16), splits):
            yield dataclasses.replace(base, split_k=split, block_m=block_m, num_stages=3)
        return
    for split in splits:  # the default's neighbourhood: split-K, then wider/narrower tiles
        yield dataclasses.replace(base, split_k=split)
    for (block_n, warps), split in itertools.product(((64, 4), (256, 8), (128, 8)), splits):
        yield dataclasses.replace(base, block_n=block_n, num_warps=warps, split_k=split)
    for split in splits:  # the operands without inline PTX
        yield dataclasses.replace(base, split_k=split, pair_asm=False)
    for reduce in ("atomic", "atomic_f32", "workspace"):  # the other split-K reductions
        yield dataclasses.replace(base, reduce=reduce)
    for stages in (2, 3, 5):  # pipeline depths
        yield dataclasses.replace(base, num_stages=stages)
    if m == 1:  # float32 multiply-adds
        for block_n, split, tiles in itertools.product((64, 128), splits, (1, 2)):
            if (steps // split) % tiles == 0:
                yield GemvConfig(False, block_n, split, tiles, "fixup", 4, 1)


class Budget:
    """The sweep's time, shared out: each (layer, M, kind) slot gets an equal part of what is left."""

    def __init__(self, seconds: float, slots: int) -> None:
        self.end, self.left = time.monotonic() + seconds, slots

    def slot_deadline(self) -> float:
        now = time.monotonic()
        deadline = now + max(0.0, self.end - now) / max(1, self.left)
        self.left -= 1
        return deadline


def sweep_layer(name: str, fmt: Formats, k: int, budget: Budget) -> list[dict[str, Any]]:
    """Time the sweep's launch shapes of the int4 and fp8 GEMVs; print the best of each family per M."""
    rows = []
    for m in SWEEP_MS:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 0.1
        for kind, sets in (("w4", copies(fmt.w4)), ("fp8", copies(fmt.fp8))):
            deadline = budget.slot_deadline()
            for cfg in sweep_configs(m, k // 128):
                if kind == "fp8" and (cfg.tiles > 1 or (cfg.use_dot and not cfg.pair_asm)):
                    continue  # fp8 has no pack tiles or PTX operands: these repeat other shapes
                if time.monotonic() > deadline:
                    print(f"# sweep {name} M={m} {kind}: time budget spent", flush=True)
                    break
                try:
                    t = graph_us(functools.partial(_gemv, kind, cfg, fmt.counters), [(x, *s) for s in sets])
                except Exception as e:  # a shape this Triton cannot build
                    print(f"# sweep {name} M={m} {kind} {_cfg_text(cfg.__dict__)} failed: {e!r}"[:300])
                    continue
                rows.append({"layer": name, "m": m, "kind": kind, "us": t, **cfg.__dict__})
        for kind in ("w4", "fp8"):
            for use_dot in (False, True):
                sel = [r for r in rows if (r["m"], r["kind"], r["use_dot"]) == (m, kind, use_dot)]
                for r in sorted(sel, key=lambda r: r["us"])[:2]:
                    print(f"# sweep {name} M={m} {kind}: {r['us']:.1f} us {_cfg_text(r)}", flush=True)
    return rows


def _gemv(
    kind: str, cfg: GemvConfig, counters: torch.Tensor, x: torch.Tensor, *w: torch.Tensor
) -> torch.Tensor:
    return int_gemv(x, *w, 4, cfg, counters) if kind == "w4" else fp8_gemv(x, *w, cfg, counters)


def _cfg_text(c: dict[str, Any]) -> str:
    path = ("dot asm" if c["pair_asm"] else "dot") if c["use_dot"] else f"fma t{c['tiles']}"
    path += f" bm{c['block_m']}" if c.get("block_m", 16) != 16 else ""
    return f"{path} bn{c['block_n']} split{c['split_k']} {c['reduce']} w{c['num_warps']} s{c['num_stages']}"


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| layer | M | "
        + " | ".join(f"{c} µs (GB/s)" for c in COLUMNS)
        + " | W4 ×bf16 | W8 ×bf16 | fp8 ×bf16 |"
    )
    lines = [head, "|" + "---|" * (len(COLUMNS) + 5)]
    nan = float("nan")
    for r in rows:
        cells = [f"{r[c + '_us']:.1f} ({r[c + '_gbs']:.0f})" if c + "_us" in r else "—" for c in COLUMNS]
        fp8 = min(r.get("fp8_wo_us", 1e9), r.get("fp8_mm_us", 1e9))
        bf16 = r.get("bf16_us", nan)
        ratios = [bf16 / r.get("w4_us", nan), bf16 / r.get("w8_us", nan), bf16 / fp8]
        lines.append(
            f"| {r['layer']} | {r['m']} | "
            + " | ".join(cells)
            + " | "
            + " | ".join(f"{v:.2f}×" for v in ratios)
            + " |"
        )
    for m in MS:  # one decoder layer: the four GEMMs together
        sel = [r for r in rows if r["m"] == m]
        if len(sel) == len(LAYERS):
            bf16, w4, w8 = (sum(r.get(f"{c}_us", nan) for r in sel) for c in ("bf16", "w4", "w8"))
            fp8 = sum(min(r.get("fp8_wo_us", 1e9), r.get("fp8_mm_us", 1e9)) for r in sel)
            lines.append(
                f"| all 4 | {m} | bf16 {bf16:.1f} µs | W4 {w4:.1f} µs {bf16 / w4:.2f}× | W8 {w8:.1f} µs "
                f"{bf16 / w8:.2f}× | fp8 {fp8:.1f} µs {bf16 / fp8:.2f}× |"
            )
    worst = {c: max(r.get(f"err_{c}", 0.0) for r in rows) for c in COLUMNS}
    lines.append(
        "max relative error vs bf16 GEMM of the same weight: "
        + json.dumps({c: f"{v:.1e}" for c, v in worst.items()})
    )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None, help="write every row as JSON here")
    p.add_argument("--layers", default=",".join(LAYERS))
    p.add_argument("--sweep", action="store_true", help="also time the decode launch shapes at M <= 16")
    p.add_argument("--sweep-budget-s", type=float, default=300.0, help="sweep time, shared by the layers")
    args = p.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    rows: list[dict[str, Any]] = []
    sweeps: list[dict[str, Any]] = []
    layers = args.layers.split(",")
    budget = Budget(args.sweep_budget_s, len(layers) * len(SWEEP_MS) * 2)
    for name in layers:
        n, k = LAYERS[name]
        layer_rows, fmt = bench_layer(name, n, k)
        rows += layer_rows
        if args.sweep:
            sweeps += sweep_layer(name, fmt, k, budget)
        if args.out:
            args.out.write_text(json.dumps({"rows": rows, "sweep": sweeps}, indent=1))
        del fmt
        torch.cuda.empty_cache()
    print(table(rows))
    if sweeps:
        print(sweep_summary(sweeps, rows))
    return 0


def sweep_summary(sweeps: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    """The best swept shape per (layer, M, kind) against what the dispatch ran in the table."""
    lines = ["| layer | M | kind | dispatch µs | best µs | best shape |", "|---|---|---|---|---|---|"]
    keys = sorted({(r["layer"], r["m"], r["kind"]) for r in sweeps}, key=lambda t: (t[0], t[1], t[2]))
    for layer, m, kind in keys:
        best = min(
            (r for r in sweeps if (r["layer"], r["m"], r["kind"]) == (layer, m, kind)), key=lambda r: r["us"]
        )
        table_row = next((r for r in rows if (r["layer"], r["m"]) == (layer, m)), {})
        dispatch = table_row.get("w4_us" if kind == "w4" else "fp8_wo_us", float("nan"))
        lines.append(f"| {layer} | {m} | {kind} | {dispatch:.1f} | {best['us']:.1f} | {_cfg_text(best)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
