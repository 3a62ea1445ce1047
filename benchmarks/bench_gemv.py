"""Decode GEMVs at M = 1, 2, 4 on Qwen3-8B's and Qwen3-0.6B's layer shapes: bf16 cuBLAS vs the Triton
GEMV (kernels/gemv_triton.py) plain and with its fused prologue, and the int4 / int8 / fp8 decode GEMVs.

    source benchmarks/gpu_env.sh && python benchmarks/bench_gemv.py [--quick] [--budget 80]

Per (shape, M), one line per variant: (a) cublas F.linear; (b) unfused: rms_norm_triton(+residual) ->
F.linear (qkv, gate_up) or silu_and_mul_triton -> F.linear (down); (c) gemv: the plain GEMV over the swept
launch shapes (legend at the top; best first); (d) fused: the GEMV with the norm / SiLU-and-mul prologue
over a subset of them; (e) the int4 (g128) / int8 (per channel) / fp8 (per channel) GEMVs as dispatched
(w4a16_triton.int_gemm, quant/fp8_gemm.fp8_linear), GB/s counted on the bytes each streams.
Times: CUDA-graph replays of back-to-back calls cycling over enough weight copies that every call reads
from HBM (>= 4x the L2), median of several replays, per call. % is of 4.25 TB/s (H200 copy bandwidth).
Triton compiles first in parallel worker processes (they fill the on-disk cache), so the timing process
only loads kernels; --budget (s) stops timing early and still prints what was measured.

H200, 2026-12-01, Qwen3-8B, M = 1 (µs; cuBLAS | GEMV as dispatched | unfused -> fused as dispatched):
  qkv 15.25 | 14.9 fused (18.12 unfused)   o 13.18 | 10.71   gate_up 49.64 | 48.98 fused (52.30)
  down 30.56 | 27.87 fused (31.82)   one layer's four GEMMs: 115.4 unfused -> 102.5
At M = 2 and 4 neither the plain nor the fused GEMV beat cuBLAS + the separate kernels per layer, so the
model dispatches them at M = 1 only (kernels/gemv.GEMV_MAX_M). The int4 / int8 / fp8 decode GEMVs streamed
at 21-45% / 35-64% / 36-62% of 4.25 TB/s on their own bytes at the 8B shapes (0.6B: 4-21%).
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from kvpilot.runtime.kernels.activation_triton import silu_and_mul_triton
from kvpilot.runtime.kernels.gemv import norm_linear_ref, silu_linear_ref
from kvpilot.runtime.kernels.gemv_dispatch import (
    linear_triton,
    norm_linear_triton,
    silu_linear_triton,
)
from kvpilot.runtime.kernels.gemv_triton import (
    GemvBf16Config,
    default_gemv_bf16_config,
    gemv_bf16,
    norm_gemv_bf16,
    silu_gemv_bf16,
)
from kvpilot.runtime.kernels.norm_triton import rms_norm_triton
from kvpilot.runtime.kernels.split_k_triton import split_counters

COPY_BW = 4.25e12
L2_BYTES = 60e6
EPS = 1e-6
BF16 = torch.bfloat16
DEV = "cuda"
# (model, layer): (N, K, fused prologue)
SHAPES = {
    ("8B", "qkv"): (6144, 4096, "norm"),
    ("8B", "o"): (4096, 4096, None),
    ("8B", "gate_up"): (24576, 4096, "norm"),
    ("8B", "down"): (4096, 12288, "silu"),
    ("0.6B", "qkv"): (4096, 1024, "norm"),
    ("0.6B", "o"): (1024, 2048, None),
    ("0.6B", "gate_up"): (6144, 1024, "norm"),
    ("0.6B", "down"): (1024, 3072, "silu"),
}
MS = (1, 2, 4)
C = GemvBf16Config
SWEEP_M1 = {  # multiply-adds (fma) unless use_dot; pf: the next W tile loaded before this one is used
    "a0": C(8, 512),
    "a1": C(8, 512, prefetch=True),
    "a2": C(8, 1024),
    "a3": C(16, 256),
    "a4": C(16, 256, prefetch=True),
    "a5": C(32, 128),
    "a6": C(32, 128, prefetch=True),
    "a7": C(16, 512, num_warps=8),
    "a8": C(4, 512),
    "a9": C(8, 256, prefetch=True),
}
SWEEP_MN = {  # M = 2..4: multiply-adds (one accumulator per row) or dots (x padded to 16 rows)
    "e0": C(8, 512),
    "e1": C(8, 256),
    "e2": C(16, 256),
    "e3": C(4, 512),
    "e4": C(8, 256, prefetch=True),
    "d0": C(16, 256, use_dot=True, num_stages=3),
    "d3": C(32, 256, use_dot=True, num_stages=4),
}
FUSED_M1 = ("a0", "a1", "a2", "a3", "a4", "a5", "a6", "a9")
FUSED_MN = ("e0", "e1", "e2", "e4")


def sweep_for(m: int, fused: bool, quick: bool) -> dict[str, GemvBf16Config]:
    table = SWEEP_M1 if m == 1 else SWEEP_MN
    names = (FUSED_M1 if m == 1 else FUSED_MN) if fused else tuple(table)
    return {name: table[name] for name in (names[:2] if quick else names)}


def fit(cfg: GemvBf16Config, n: int, k: int, sms: int = 132) -> GemvBf16Config:
    """The config with the fewest split-K (1, 2, 4, 8) that gives >= 2 programs per SM."""
    tiles = -(-n // cfg.block_n)
    split = next((s for s in (1, 2, 4, 8) if tiles * s >= 2 * sms and k % (s * 16) == 0), 1)
    return C(**{**cfg.__dict__, "split_k": split})


@dataclass
class Layer:
    """One shape's tensors: weight copies (one per call of a graph), x, norm / SiLU inputs, quant weights."""

    n: int
    k: int
    prologue: str | None
    weights: list[torch.Tensor]
    counters: torch.Tensor
    quant: dict[str, list[tuple[torch.Tensor, ...]]] | None = None  # time_quant's copies, made once

    @staticmethod
    def make(n: int, k: int, prologue: str | None, copies: int) -> Layer:
        w = torch.randn(n, k, device=DEV, dtype=BF16) * 0.02
        return Layer(
            n, k, prologue, [w] + [w.clone() for _ in range(copies - 1)], split_counters(n, w.device)
        )

    @property
    def nbytes(self) -> int:
        return self.n * self.k * 2


def copies_for(nbytes: float) -> int:
    return max(2, min(64, math.ceil(4 * L2_BYTES / nbytes)))


def inputs(layer: Layer, m: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator(device=DEV).manual_seed(m)
    k = layer.k

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=DEV, dtype=BF16)

    return {"x": rnd(m, k), "h": rnd(m, k), "r": rnd(m, k), "nw": 1 + 0.1 * rnd(k), "gu": rnd(m, 2 * k)}


def variants(
    layer: Layer, m: int, quick: bool
) -> Iterator[tuple[str, str, Callable[..., Any], Callable[..., Any]]]:
    """(kind, name, fn(inputs, W), reference(inputs, W)) of the bf16 variants at this shape and M."""
    plain_ref = lambda t, w: F.linear(t["x"], w)  # noqa: E731
    yield "cublas", "F.linear", lambda t, w: F.linear(t["x"], w), plain_ref
    if layer.prologue == "norm":
        ref = lambda t, w: norm_linear_ref(t["h"], t["r"], t["nw"], EPS, w)[0]  # noqa: E731
        yield (
            "unfused",
            "norm+F.linear",
            lambda t, w: F.linear(rms_norm_triton(t["h"], t["nw"], EPS, t["r"])[0], w),
            ref,
        )
    elif layer.prologue == "silu":
        ref = lambda t, w: silu_linear_ref(t["gu"], w)  # noqa: E731
        yield "unfused", "silu+F.linear", lambda t, w: F.linear(silu_and_mul_triton(t["gu"]), w), ref
    for name, cfg in sweep_for(m, False, quick).items():
        c = fit(cfg, layer.n, layer.k)
        yield "gemv", name, lambda t, w, c=c: gemv_bf16(t["x"], w, c, layer.counters), plain_ref
    yield "gemv", "model", lambda t, w: linear_triton(t["x"], w, None), plain_ref  # KernelOps.linear
    if layer.prologue is None:
        return
    for name, cfg in sweep_for(m, True, quick).items():
        c = fit(cfg, layer.n, layer.k)
        if layer.prologue == "norm":
            fn = lambda t, w, c=c: norm_gemv_bf16(t["h"], t["r"], t["nw"], EPS, w, c, layer.counters)[0]  # noqa: E731
        else:
            fn = lambda t, w, c=c: silu_gemv_bf16(t["gu"], w, c, layer.counters)  # noqa: E731
        yield "fused", name, fn, ref
    default = default_gemv_bf16_config(m, layer.n, layer.k, 132, layer.prologue or "plain")
    yield "gemv", "default", lambda t, w: gemv_bf16(t["x"], w, default, layer.counters), plain_ref
    if layer.prologue == "norm":  # what the decoder layer runs (KernelOps "triton")
        yield "fused", "model", lambda t, w: norm_linear_triton(t["h"], t["r"], t["nw"], EPS, w)[0], ref
    elif layer.prologue == "silu":
        yield "fused", "model", lambda t, w: silu_linear_triton(t["gu"], w), ref


def quant_weights(layer: Layer) -> dict[str, list[tuple[torch.Tensor, ...]]]:
    """int4 (asymmetric, groups of 128), int8 (symmetric, per channel), fp8 (per channel) copies of W."""
    from kvpilot.runtime.quant.int_weight import quantize_rtn

    w = layer.weights[0]
    w4, w8 = quantize_rtn(w, 4, 128, sym=False), quantize_rtn(w, 8, -1, sym=True)
    scale = w.float().abs().amax(dim=1).clamp(min=1e-12) / 448.0
    one = {
        "int4": (w4.qweight, w4.scales.to(BF16), w4.zeros.to(BF16)),
        "int8": (w8.qweight, w8.scales.to(BF16), w8.zeros.to(BF16)),
        "fp8": ((w.float() / scale.view(-1, 1)).to(torch.float8_e4m3fn), scale),
    }
    out = {}
    for name, tensors in one.items():
        n = copies_for(sum(t.numel() * t.element_size() for t in tensors))
        out[name] = [tensors] + [tuple(t.clone() for t in tensors) for _ in range(n - 1)]
    return out


def quant_variants(layer: Layer) -> Iterator[tuple[str, Callable[..., Any]]]:
    """(format, fn(x, *weight tensors)) as the engine dispatches them at decode."""
    from kvpilot.runtime.kernels.w4a16_triton import int_gemm
    from kvpilot.runtime.quant.fp8_gemm import fp8_linear

    yield "int4", lambda x, *t: int_gemm(x, *t, 4, counters=layer.counters)
    yield "int8", lambda x, *t: int_gemm(x, *t, 8, counters=layer.counters)
    yield "fp8", lambda x, w, s: fp8_linear(x, w, s, None, counters=layer.counters)


def graph_us(fn: Callable[[Any], Any], args: list[Any], replays: int = 7) -> float:
    """Median µs per call over replays of one CUDA graph of >= 20 calls cycling over args."""
    seq = [args[i % len(args)] for i in range(max(20, len(args)))]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for a in args[:2]:  # compile (or load) and allocate outside the capture
            fn(a)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for a in seq:
            fn(a)
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(seq))
    return statistics.median(times)


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def pct(nbytes: float, us: float) -> str:
    return f"{nbytes / (us * 1e-6) / 1e12:.2f}TB/s {100 * nbytes / (us * 1e-6) / COPY_BW:.0f}%"


# ------------------------------------------------------------------------------------------------ warm-up


def _warm(job: tuple[str, str, int, bool]) -> int:
    """Worker: one launch shape (kind, name, M) on every layer shape, so that Triton compiles it into the
    on-disk cache once (M = 2 stands for 4: the same kernels)."""
    want_kind, want_name, m, quick = job
    done = 0
    for n, k, prologue in SHAPES.values():
        layer = Layer.make(n, k, prologue, 1)
        t = inputs(layer, m)
        try:
            if want_kind == "quant":
                copies = quant_weights(layer)[want_name]
                dict(quant_variants(layer))[want_name](t["x"], *copies[0])
                done += 1
            for kind, name, fn, _ in variants(layer, m, quick):
                if (kind, name) == (want_kind, want_name):
                    fn(t, layer.weights[0])
                    done += 1
        except Exception:  # reported by the timing process, which runs it again
            pass
    torch.cuda.synchronize()
    return done


def warm_jobs(quick: bool, quant: bool = True) -> list[tuple[str, str, int, bool]]:
    jobs = []
    for m in (1, 2):
        names: dict[tuple[str, str], None] = {}
        for n, k, prologue in SHAPES.values():
            spec = Layer(n, k, prologue, [], torch.empty(0))
            names.update(
                {(kind, name): None for kind, name, _, _ in variants(spec, m, quick) if kind != "cublas"}
            )
        jobs += [(kind, name, m, quick) for kind, name in names if kind != "unfused" or m == 1]
        jobs += [("quant", fmt, m, quick) for fmt in ("int4", "int8", "fp8") if quant]
    return jobs


def warm_up(quick: bool, workers: int, timeout: float, quant: bool) -> str:
    """Spread the compiles over worker processes, one launch shape each."""
    ctx = mp.get_context("spawn")
    start = time.monotonic()
    jobs = warm_jobs(quick, quant)
    with ctx.Pool(workers) as pool:
        result = pool.map_async(_warm, jobs, chunksize=1)
        try:
            n = sum(result.get(timeout=timeout))
        except mp.TimeoutError:
            pool.terminate()
            return f"# warm-up: timed out after {timeout:.0f}s (the rest compiles while timing)"
    return (
        f"# warm-up: {len(jobs)} jobs, {n} launches by {workers} workers in {time.monotonic() - start:.1f}s"
    )


# ------------------------------------------------------------------------------------------------ timing


def time_layer(
    layer: Layer, m: int, quick: bool, deadline: float
) -> tuple[list[str], dict[str, list[tuple[float, str, str]]]]:
    """The printed lines of one (shape, M): each variant timed (and checked once against its reference)."""
    t = inputs(layer, m)
    res: dict[str, list[tuple[float, str, str]]] = {}  # kind -> [(us, name, flag)]
    for kind, name, fn, ref in variants(layer, m, quick):
        if time.monotonic() > deadline:
            res.setdefault("skipped", []).append((0.0, f"{kind}:{name}", ""))
            continue
        try:
            err = rel_err(fn(t, layer.weights[0]), ref(t, layer.weights[0]))
            us = graph_us(lambda w, fn=fn: fn(t, w), layer.weights)
        except Exception as e:  # a launch shape this Triton cannot build: say so, keep the others
            res.setdefault("failed", []).append((0.0, f"{kind}:{name}", repr(e)[:120]))
            continue
        res.setdefault(kind, []).append((us, name, "" if err < 2e-2 else f"!err{err:.0e}"))
    lines = []
    cub = res.get("cublas", [(float("nan"), "", "")])[0][0]
    head = f"cublas {cub:.2f}us {pct(layer.nbytes, cub)}"
    if "unfused" in res:
        head += f" | unfused {res['unfused'][0][0]:.2f}us"
    lines.append(head)
    for kind in ("gemv", "fused"):
        rows = sorted(res.get(kind, []))
        if rows:
            us, name, flag = rows[0]
            vs = (
                f" ({us - res['unfused'][0][0]:+.2f} vs unfused)"
                if kind == "fused" and "unfused" in res
                else ""
            )
            rest = " ".join(f"{nm} {u:.2f}{fl}" for u, nm, fl in rows[1:])
            lines.append(f"  {kind:5} best {name} {us:.2f}us {pct(layer.nbytes, us)}{flag}{vs} | {rest}")
    for kind in ("failed", "skipped"):
        if kind in res:
            lines.append(f"  {kind}: " + "; ".join(f"{nm} {fl}" for _, nm, fl in res[kind]))
    return lines, res


LAYERS_PER_MODEL = {"8B": 36, "0.6B": 28}


def layer_summary(model: str, m: int, res: dict[str, dict[str, list[tuple[float, str, str]]]]) -> str:
    """One decoder layer's four GEMMs (with their norms / activation): unfused (cuBLAS + norm / SiLU
    kernels), as the model now runs them, and with the best swept shapes; x layers = ms per token."""

    def pick(layer: str, kinds: tuple[str, ...], name: str | None) -> float:
        rows = [r for k in kinds for r in res.get(layer, {}).get(k, []) if name is None or r[1] == name]
        return min((r[0] for r in rows), default=float("nan"))

    unfused = sum(pick(n, ("unfused",), None) for n in ("qkv", "gate_up", "down")) + pick(
        "o", ("cublas",), None
    )
    model_path = sum(pick(n, ("fused",), "model") for n in ("qkv", "gate_up", "down")) + pick(
        "o", ("gemv",), "model"
    )
    best = sum(pick(n, ("fused",), None) for n in ("qkv", "gate_up", "down")) + pick("o", ("gemv",), None)
    per = LAYERS_PER_MODEL[model] / 1e3
    return (
        f"# {model} M{m} one layer's GEMMs: unfused {unfused:.1f}us ({unfused * per:.3f} ms/token) | "
        f"model path {model_path:.1f}us ({model_path * per:.3f}) | best swept {best:.1f}us ({best * per:.3f})"
    )


def time_quant(layer: Layer, m: int, deadline: float) -> str:
    if time.monotonic() > deadline:
        return "  quant skipped (budget)"
    x = inputs(layer, m)["x"]
    cells = []
    layer.quant = layer.quant or quant_weights(layer)
    for fmt, copies in layer.quant.items():
        fn = dict(quant_variants(layer))[fmt]
        nbytes = sum(t.numel() * t.element_size() for t in copies[0])
        try:
            us = graph_us(lambda ts, fn=fn: fn(x, *ts), copies)
            cells.append(f"{fmt} {us:.2f}us {pct(nbytes, us)}")
        except Exception as e:
            cells.append(f"{fmt} failed {e!r}"[:100])
    return "  quant " + " | ".join(cells)


def legend() -> list[str]:
    def text(c: GemvBf16Config) -> str:
        path = "dot" if c.use_dot else ("fma+pf" if c.prefetch else "fma")
        return f"{path} bn{c.block_n} bk{c.block_k} w{c.num_warps} s{c.num_stages}"

    out = ["# configs (split-K: fewest of 1/2/4/8 giving >= 2 programs per SM):"]
    for table in (SWEEP_M1, SWEEP_MN):
        out.append("#  " + "; ".join(f"{k}={text(c)}" for k, c in table.items()))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="two launch shapes per sweep")
    p.add_argument("--budget", type=float, default=80.0, help="seconds for the whole run")
    p.add_argument("--workers", type=int, default=min(14, max(1, (mp.cpu_count() or 2) - 2)))
    p.add_argument("--models", default="8B,0.6B")
    p.add_argument("--no-quant", action="store_true", help="skip the int4 / int8 / fp8 GEMVs")
    p.add_argument("--ms", default="1,2,4")
    args = p.parse_args()
    start = time.monotonic()
    deadline = start + args.budget
    import triton

    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    print("\n".join(legend()), flush=True)
    if args.workers > 0:
        try:
            print(warm_up(args.quick, args.workers, 0.45 * args.budget, not args.no_quant), flush=True)
        except Exception as e:  # the timing process compiles what it needs instead
            print(f"# warm-up failed: {e!r}"[:200], flush=True)
    layers: dict[tuple[str, str], Layer] = {}
    for model in args.models.split(","):
        for m in (int(v) for v in args.ms.split(",")):
            res = {}
            for (mdl, name), (n, k, prologue) in SHAPES.items():
                if mdl != model:
                    continue
                if (mdl, name) not in layers:
                    layers[(mdl, name)] = Layer.make(n, k, prologue, copies_for(n * k * 2))
                layer = layers[(mdl, name)]
                lines, res[name] = time_layer(layer, m, args.quick, deadline)
                print(f"{model} {name} N{n} K{k} M{m} | " + lines[0], flush=True)
                if not args.no_quant:
                    lines.append(time_quant(layer, m, deadline))
                print("\n".join(lines[1:]), flush=True)
            print(layer_summary(model, m, res), flush=True)
        layers.clear()  # free one model's copies before the next
    print(f"# total {time.monotonic() - start:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
