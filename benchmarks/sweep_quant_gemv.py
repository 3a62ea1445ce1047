"""Decode GEMVs of the quantized formats at Qwen3-8B's layer shapes (issue 12): the dispatched int4 / int8 /
fp8 kernels against their candidate replacements and bf16 cuBLAS, M = 1, 4, 16, in about a minute.

    source benchmarks/gpu_env.sh && python benchmarks/sweep_quant_gemv.py [--budget 75]

One row per (format, M, variant): µs per call on qkv / o / gate_up / down, the sum of the four (one decoder
layer) and its speed-up over bf16 cuBLAS, and TB/s on the bytes each format streams (scales included).
Times are CUDA-graph replays cycling over enough weight copies that each call reads HBM, median of 5.
Each variant is first checked against the float32 GEMM of its dequantized weight (err > 1e-2 is flagged).
Variants: "cur" = the dispatch (w4a16_triton.int_gemm / quant.fp8_gemm.fp8_linear); int4 "mma sS tT pP":
kernels/int4_mma_gemv_triton (split-K S, T pack tiles per step, prefetch P); "fma bnB tT pP sS":
kernels/int_gemv_fma_triton; fp8 "fma bnB bkK wW": fp8_gemv_triton's multiply-add path; int4 "dot ..."
at M = 16: int_gemv_triton's tensor-core GEMV. Triton compiles in worker processes first (on-disk cache).
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import statistics
import time
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from kvpilot.runtime.kernels.fp8_gemv_triton import default_fp8_gemv_config, fp8_gemv
from kvpilot.runtime.kernels.int4_mma_gemv_triton import MmaConfig, int4_mma_gemv
from kvpilot.runtime.kernels.int_gemv_fma_triton import (
    FmaConfig,
    default_fma_config,
    default_fma_split,
    int_gemv_fma,
)
from kvpilot.runtime.kernels.int_gemv_triton import GemvConfig, default_gemv_config, default_split_k, int_gemv
from kvpilot.runtime.kernels.quant_reference import dequantize_int_ref
from kvpilot.runtime.kernels.split_k_triton import split_counters
from kvpilot.runtime.kernels.w4a16_triton import int_gemm
from kvpilot.runtime.quant.fp8_gemm import fp8_linear
from kvpilot.runtime.quant.int_weight import quantize_rtn

LAYERS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
MS = (1, 4, 16)
L2_BYTES = 60e6
SMS = 132
Fn = Callable[..., torch.Tensor]


def mma_split(n: int, k: int, per_sm: int, step: int = 1) -> int:
    """Fewest splits (each a whole number of steps of `step` 128-row tiles) giving >= per_sm warps per SM."""
    tiles, blocks = k // 128, -(-n // 64)
    fits = [s for s in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48) if tiles % (s * step) == 0]
    return next((s for s in fits if blocks * s >= per_sm * SMS), fits[-1])


def variants(fmt: str, m: int, n: int, k: int, counters: torch.Tensor) -> Iterator[tuple[str, Fn]]:
    """(name, fn(x, *weight tensors)) of one format at one shape and M; names are shape-independent.
    "cur": the dispatch; "old": the dispatch before issue 12's sweep (the Triton-dot GEMV for int4 /
    int8, 64 x 128 tiles of 4 warps for fp8 at M = 1); "wide": split_k_triton's fixup_wide reduce."""
    if fmt == "bf16":
        yield "cublas", F.linear
    elif fmt == "fp8":
        yield "cur", lambda x, w, s: fp8_linear(x, w, s, None, counters=counters)
        if m == 1:
            yield from _fp8_variants(n, k, counters)
    else:
        bits = 4 if fmt == "int4" else 8
        yield "cur", lambda x, *t: int_gemm(x, *t, bits, counters=counters)
        old = default_gemv_config(m, n, k, bits, SMS)
        for name, cfg in (("old", old), ("old wide", dataclasses.replace(old, reduce="fixup_wide"))):
            yield name, lambda x, *t, c=cfg: int_gemv(x, *t, bits, c, counters)
        if fmt == "int4":
            yield from _mma_variants(n, k, counters)
        if m <= 4:
            yield from _fma_variants(n, k, bits, counters)
        if fmt == "int4" and m == 16:
            for bn, split, warps in ((64, 4, 4), (64, 8, 4), (128, 4, 4), (32, 8, 4)):
                cfg = GemvConfig(True, bn, split, num_warps=warps, pair_asm=True)
                yield f"dot bn{bn} s{split}", lambda x, *t, c=cfg: int_gemv(x, *t, 4, c, counters)


def _fp8_variants(n: int, k: int, counters: torch.Tensor) -> Iterator[tuple[str, Fn]]:
    """fp8 at M = 1: multiply-add tiles (rows x K, warps), split-K for 8 / warps programs per SM."""
    old = GemvConfig(False, 64, default_split_k(-(-n // 64), k // 128, SMS), num_stages=1, block_m=1)
    cur = default_fp8_gemv_config(1, n, k, SMS)
    yield "old", lambda x, w, s: fp8_gemv(x, w, s, old, counters)
    yield (
        "cur wide",
        lambda x, w, s: fp8_gemv(x, w, s, dataclasses.replace(cur, reduce="fixup_wide"), counters),
    )
    tiles = ((8, 512, 4), (16, 512, 4), (8, 1024, 4), (16, 256, 4), (4, 1024, 4), (32, 256, 4),
             (8, 512, 1), (4, 512, 1), (4, 1024, 1), (2, 1024, 1), (4, 256, 1), (16, 512, 2),
             (8, 512, 2))  # fmt: skip
    for bn, bk, warps in tiles:
        steps, blocks, per_sm = k // bk, -(-n // bn), 8 // warps  # one warp: more programs
        split = next((s for s in (1, 2, 4, 8) if blocks * s >= per_sm * SMS and steps % s == 0), 1)
        cfg = GemvConfig(False, bn, split, num_warps=warps, num_stages=1, block_m=1, block_k=bk)
        yield f"fma bn{bn} bk{bk} w{warps}", lambda x, w, s, c=cfg: fp8_gemv(x, w, s, c, counters)


def _mma_variants(n: int, k: int, counters: torch.Tensor) -> Iterator[tuple[str, Fn]]:
    """int4 mma GEMV: one-warp programs per SM (split-K), tiles per step, prefetch, the reduce."""
    fix, wide = "fixup", "fixup_wide"
    shapes = ((4, 1, True, fix, 0), (8, 1, True, fix, 0), (16, 1, True, fix, 0), (32, 1, True, fix, 0),
              (8, 1, False, fix, 0), (8, 2, True, fix, 0), (16, 2, False, fix, 0),
              (8, 1, True, wide, 0), (16, 1, True, wide, 0), (32, 1, True, wide, 0),
              (4, 1, True, fix, 2), (8, 1, True, fix, 2), (8, 1, True, fix, 4),
              (16, 1, True, wide, 2))  # fmt: skip
    for per_sm, tiles, pf, reduce, l2 in shapes:
        cfg = MmaConfig(mma_split(n, k, per_sm, tiles), tiles, pf, reduce=reduce, l2_ahead=l2)
        name = f"mma w{per_sm}/sm t{tiles} p{int(pf)}" + (" wide" if reduce == wide else "")
        yield (
            name + (f" L2+{l2}" if l2 else ""),
            lambda x, q, s, z, c=cfg: int4_mma_gemv(x, q, s, z, c, counters),
        )


def _fma_variants(n: int, k: int, bits: int, counters: torch.Tensor) -> Iterator[tuple[str, Fn]]:
    """Multiply-add GEMV: columns, tiles per step, prefetch, warps, programs per SM."""
    shapes = ((64, 1, True, 4, 2), (64, 1, True, 4, 4), (64, 2, True, 4, 2), (128, 1, True, 4, 2),
              (32, 1, True, 2, 4), (64, 1, False, 4, 4))  # fmt: skip
    for bn, tiles, pf, warps, per_sm in shapes:
        cfg = FmaConfig(bn, tiles, 1, pf, warps)
        cfg = FmaConfig(bn, tiles, default_fma_split(n, k, bits, cfg, SMS, per_sm), pf, warps)
        name = f"fma bn{bn} t{tiles} p{int(pf)} w{warps} {per_sm}/sm"
        yield name, lambda x, *t, c=cfg: int_gemv_fma(x, *t, bits, c, counters)
    default = default_fma_config(n, k, bits, SMS)
    for name, cfg in (
        ("fma default wide", dataclasses.replace(default, reduce="fixup_wide")),
        ("fma default L2+2", dataclasses.replace(default, l2_ahead=2)),
        ("fma default L2+4", dataclasses.replace(default, l2_ahead=4)),
    ):
        yield name, lambda x, *t, c=cfg: int_gemv_fma(x, *t, bits, c, counters)


def weights(fmt: str, w: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """(the format's tensors, the float32 dequantized W [N, K]: the error reference)."""
    if fmt == "bf16":
        return (w,), w.float()
    if fmt == "fp8":
        scale = w.float().abs().amax(dim=1).clamp(min=1e-12) / 448.0
        q = (w.float() / scale.view(-1, 1)).to(torch.float8_e4m3fn)
        return (q, scale), q.float() * scale.view(-1, 1)
    bits, group, sym = (4, 128, False) if fmt == "int4" else (8, -1, True)
    qw = quantize_rtn(w, bits, group, sym=sym)
    t = (qw.qweight, qw.scales.bfloat16(), qw.zeros.bfloat16())
    return t, dequantize_int_ref(*t, bits).float().t()


def graph_us(fn: Fn, x: torch.Tensor, sets: list[tuple[torch.Tensor, ...]]) -> float:
    """Median µs per call over 5 replays of a CUDA graph of >= 20 calls cycling over the weight copies."""
    seq = [sets[i % len(sets)] for i in range(max(20, len(sets)))]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(x, *sets[0])
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for ts in seq:
            fn(x, *ts)
    graph.replay()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(seq))
    return statistics.median(times)


FORMATS = ("bf16", "int4", "int8", "fp8")


def _warm(job: tuple[str, int, str]) -> tuple[tuple[str, int, str], str]:
    """Worker: run one variant of one (format, M) once per shape, filling Triton's on-disk cache; returns
    the job and "" or its first error (a faulting kernel is then not run by the timing process, whose
    CUDA context it would poison)."""
    fmt, m, want = job
    for n, k in LAYERS.values():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        tensors, _ = weights(fmt, w)
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        for name, fn in variants(fmt, m, n, k, split_counters(n, w.device)):
            if name != want:
                continue
            try:
                fn(x, *tensors)
                torch.cuda.synchronize()
            except Exception as e:
                return job, repr(e)[:200]
    return job, ""


def warm_up(workers: int, timeout: float) -> tuple[str, dict[tuple[str, int, str], str]]:
    """Compile every variant in worker processes: (a log line, {job: error or ""})."""
    start = time.monotonic()
    jobs = {}
    for fmt in FORMATS[1:]:
        for m in MS:
            for n, k in LAYERS.values():
                jobs.update({(fmt, m, name): None for name, _ in variants(fmt, m, n, k, torch.empty(0))})
    with mp.get_context("spawn").Pool(workers) as pool:
        res = pool.map_async(_warm, list(jobs), chunksize=1)
        try:
            done = dict(res.get(timeout=timeout))
        except mp.TimeoutError:
            pool.terminate()
            return f"# warm-up timed out after {timeout:.0f}s ({len(jobs)} jobs)", {}
    bad = sum(1 for e in done.values() if e)
    return f"# warm-up: {len(jobs)} jobs ({bad} failed) in {time.monotonic() - start:.1f}s", done


def measure(
    deadline: float, warm: dict[tuple[str, int, str], str]
) -> dict[tuple[str, int, str], dict[str, tuple[float, float, int]]]:
    """{(format, M, variant): {layer: (µs, rel err, bytes)}}; shapes one at a time (their copies freed).
    Variants whose warm-up failed are skipped (their error printed once)."""
    res: dict[tuple[str, int, str], dict[str, tuple[float, float, int]]] = {}
    failed: set[tuple[str, int, str]] = set()
    for job, err in warm.items():
        if err:
            print(f"# {job[0]} M={job[1]} {job[2]} failed in warm-up: {err}"[:300], flush=True)
            failed.add(job)
    for layer, (n, k) in LAYERS.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        counters = split_counters(n, w.device)
        for fmt in FORMATS:
            tensors, dense = weights(fmt, w)
            nbytes = sum(t.numel() * t.element_size() for t in tensors)
            sets = [tensors] + [tuple(t.clone() for t in tensors) for _ in range(int(4 * L2_BYTES / nbytes))]
            for m in MS:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 0.5
                want = x.float() @ dense.t()
                for name, fn in variants(fmt, m, n, k, counters):
                    if time.monotonic() > deadline or (fmt, m, name) in failed:
                        continue
                    try:
                        got = fn(x, *tensors).float()
                        err = float((got - want).norm() / want.norm())
                        us = graph_us(fn, x, sets)
                    except Exception as e:  # a variant this Triton cannot build: say so once, keep the rest
                        if (fmt, m, name) not in failed:
                            print(f"# {fmt} M={m} {name} {layer}: {e!r}"[:300], flush=True)
                        failed.add((fmt, m, name))
                        continue
                    res.setdefault((fmt, m, name), {})[layer] = (us, err, nbytes)
            del sets
            torch.cuda.empty_cache()
        print(f"# {layer} timed, {deadline - time.monotonic():.0f}s of the budget left", flush=True)
    return res


def report(res: dict[tuple[str, int, str], dict[str, tuple[float, float, int]]]) -> None:
    print("| fmt | M | variant | " + " | ".join(f"{lay} µs (TB/s)" for lay in LAYERS) + " | sum µs | ×bf16 |")
    print("|---|---|---|" + "---|" * (len(LAYERS) + 2))
    for (fmt, m, name), row in res.items():
        bf16 = res.get(("bf16", m, "cublas"), {})
        cells, total, ref = [], 0.0, 0.0
        for lay in LAYERS:
            if lay not in row:
                cells.append("—")
                total = ref = float("nan")
                continue
            us, err, nbytes = row[lay]
            flag = "" if err < 1e-2 else f" !err{err:.0e}"
            cells.append(f"{us:.1f} ({nbytes / us / 1e6:.2f}){flag}")
            total += us
            ref += bf16.get(lay, (float("nan"),))[0]
        print(f"| {fmt} | {m} | {name} | " + " | ".join(cells) + f" | {total:.1f} | {ref / total:.2f} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=75.0, help="seconds for the whole run")
    p.add_argument("--workers", type=int, default=12)
    args = p.parse_args()
    start = time.monotonic()
    import triton

    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    for per_sm in (4, 8, 16, 32):  # the split-K each mma row uses per layer
        splits = {lay: mma_split(n, k, per_sm) for lay, (n, k) in LAYERS.items()}
        print(f"# mma w{per_sm}/sm: split-K {splits}")
    line, warm = warm_up(args.workers, 0.45 * args.budget)
    print(line, flush=True)
    report(measure(start + args.budget - 3, warm))
    print(f"# total {time.monotonic() - start:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
