"""W4A16 / W8A16 at 16 <= M <= 256 (issue 12: >= 1.0x bf16 cuBLAS at M = 64): bf16 cuBLAS, the current
dispatch (w4a16_triton.int_gemm: the GEMV up to M = 64, dequantize + cuBLAS above) and the launch shapes
of kernels/w4a16_mma_triton.py, Qwen3-8B's layer shapes, side by side in one run of about 80 s.

    source benchmarks/gpu_env.sh && python benchmarks/sweep_w4_mma.py [--ms 16,32,64,128,256] [--repeat 2]

Times: bench_w4a16.graph_us (a CUDA graph over 400 MiB of weight copies, so each call streams from HBM).
One row per (format, M, variant): µs per layer with its speed-up over bf16 cuBLAS, the sum of the four
(one decoder layer) and its speed-up. Each variant is first checked against the bf16 GEMM of its
dequantized weight (relative error > 1e-2 is flagged "!err"). Variant names: "m<BLOCK_M> n<BLOCK_N>
w<warps> s<stages>", "<P>/sm" programs per SM that split-K aims at (default 2), "split<S>" a fixed split,
"swap" the transposed dot (the weight as the left operand, from registers); "dispatch" the new dispatch
(quant/methods.py: w4a16_mma_triton.int_gemm_mma in its buckets, int_gemm elsewhere). --only times a subset.
Triton compiles every variant first in worker processes (its on-disk cache), in parallel.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import time
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from bench_w4a16 import copies, graph_us
from kvpilot.runtime.kernels.quant_reference import dequantize_int_ref
from kvpilot.runtime.kernels.split_k_triton import split_counters
from kvpilot.runtime.kernels.w4a16_mma_triton import MmaGemmConfig, int_gemm_mma, mma_dispatched, w4a16_mma
from kvpilot.runtime.kernels.w4a16_triton import int_gemm
from kvpilot.runtime.quant.int_weight import quantize_rtn

LAYERS = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
Fn = Callable[..., torch.Tensor]
C = MmaGemmConfig
INT4 = {
    "swap m32 n128 w4 s3": C(32, 128, swap=True),
    "swap m32 n64 w4 s3": C(32, 64, swap=True),
    "swap m32 n64 w4 s3 1/sm": C(32, 64, swap=True, per_sm=1),
    "swap m32 n64 w4 s4 4/sm": C(32, 64, swap=True, per_sm=4, num_stages=4),
    "swap m64 n128 w4 s3": C(swap=True),
    "swap m64 n128 w4 s3 1/sm": C(swap=True, per_sm=1),
    "swap m64 n64 w4 s3": C(64, 64, swap=True),
    "swap m64 n64 w4 s3 1/sm": C(64, 64, swap=True, per_sm=1),
    "swap m64 n64 w4 s3 4/sm": C(64, 64, swap=True, per_sm=4),
    "swap m64 n64 w4 s4": C(64, 64, swap=True, num_stages=4),
    "swap m64 n64 w4 s3 split2": C(64, 64, swap=True, split_k=2),
    "swap m64 n128 w8 s3": C(swap=True, num_warps=8),
    "swap m64 n256 w8 s3": C(64, 256, swap=True, num_warps=8),
    "swap m128 n64 w4 s3": C(128, 64, swap=True),
    "swap m128 n64 w4 s3 1/sm": C(128, 64, swap=True, per_sm=1),
    "swap m128 n128 w8 s3": C(128, 128, swap=True, num_warps=8),
    "swap m128 n64 w8 s3": C(128, 64, swap=True, num_warps=8),
}
INT8 = (
    "swap m32 n128 w4 s3",
    "swap m64 n128 w4 s3",
    "swap m64 n128 w4 s3 1/sm",
    "swap m64 n64 w4 s3",
    "swap m32 n64 w4 s3",
    "swap m128 n64 w4 s3",
    "swap m128 n128 w8 s3",
)


def applies(cfg: MmaGemmConfig, m: int) -> bool:
    """Row blocks worth timing at M = m: no more than one padded block, no more than 4 blocks."""
    pow2 = max(16, 1 << (m - 1).bit_length())
    return cfg.block_m <= pow2 and 4 * cfg.block_m >= m


def variants(
    fmt: str, m: int, counters: torch.Tensor, only: tuple[str, ...] = ()
) -> Iterator[tuple[str, Fn]]:
    """(name, fn(x, *weight tensors)) of one format at M = m (only: these names, when given)."""
    for name, fn in _variants(fmt, m, counters):
        if not only or fmt == "bf16" or name in only:
            yield name, fn


def _variants(fmt: str, m: int, counters: torch.Tensor) -> Iterator[tuple[str, Fn]]:
    if fmt == "bf16":
        yield "cublas", F.linear
        return
    bits = 4 if fmt == "int4" else 8
    yield "cur", lambda x, *t: int_gemm(x, *t, bits, counters=counters)
    if mma_dispatched(m, 4096, 128 if bits == 4 else 4096, bits):  # as quant/methods.py dispatches
        yield "dispatch", lambda x, *t: int_gemm_mma(x, *t, bits, None, counters)
    for name, cfg in INT4.items():
        if applies(cfg, m) and (bits == 4 or name in INT8):
            yield name, lambda x, *t, c=cfg: w4a16_mma(x, *t, bits, c, counters)


def weights(fmt: str, w: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """(the format's tensors, W [N, K] bf16 as the format holds it: the error reference)."""
    if fmt == "bf16":
        return (w,), w
    bits, group, sym = (4, 128, False) if fmt == "int4" else (8, -1, True)
    qw = quantize_rtn(w, bits, group, sym=sym)
    t = (qw.qweight, qw.scales.bfloat16(), qw.zeros.bfloat16())
    return t, dequantize_int_ref(*t, bits).t().contiguous()


def _warm(job: tuple[str, str, tuple[int, ...]]) -> tuple[tuple[str, str, tuple[int, ...]], str]:
    """Worker: run one variant at every layer and M once (Triton's on-disk cache); "" or its error."""
    fmt, want, ms = job
    for n, k in LAYERS.values():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        tensors, _ = weights(fmt, w)
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            for name, fn in variants(fmt, m, split_counters(n, w.device)):
                if name == want:
                    try:
                        fn(x, *tensors)
                        torch.cuda.synchronize()
                    except Exception as e:  # reported by the parent; the variant is then not timed
                        return job, repr(e)[:200]
    return job, ""


def warm_up(
    ms: tuple[int, ...], workers: int, timeout: float, only: tuple[str, ...]
) -> dict[tuple[str, str], str]:
    names = {"int4": ("cur", "dispatch", *INT4), "int8": ("cur", "dispatch", *INT8)}
    jobs = [
        (fmt, name, ms) for fmt, fmt_names in names.items() for name in fmt_names if not only or name in only
    ]
    start = time.monotonic()
    with mp.get_context("spawn").Pool(workers) as pool:
        res = pool.map_async(_warm, jobs, chunksize=1)
        try:
            done = dict(res.get(timeout=timeout))
        except mp.TimeoutError:
            pool.terminate()
            print(f"# warm-up timed out after {timeout:.0f}s", flush=True)
            return {}
    errors = {(job[0], job[1]): err for job, err in done.items() if err}
    for (fmt, name), err in errors.items():
        print(f"# {fmt} {name} failed in warm-up: {err}", flush=True)
    print(f"# warm-up: {len(jobs)} jobs in {time.monotonic() - start:.1f}s", flush=True)
    return errors


Results = dict[tuple[str, int, str], dict[str, tuple[float, float]]]


def measure(
    ms: tuple[int, ...], deadline: float, failed: dict[tuple[str, str], str], only: tuple[str, ...]
) -> Results:
    """{(format, M, variant): {layer: (µs, relative error)}}, one layer's copies at a time."""
    res: Results = {}
    for layer, (n, k) in LAYERS.items():
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
        counters = split_counters(n, w.device)
        for fmt in ("bf16", "int4", "int8"):
            tensors, dense = weights(fmt, w)
            sets = copies(tensors)
            for m in ms:
                x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 0.5
                want = F.linear(x, dense).float()
                for name, fn in variants(fmt, m, counters, only):
                    if time.monotonic() > deadline or (fmt, name) in failed:
                        continue
                    try:
                        got = fn(x, *tensors).float()
                        err = float((got - want).norm() / want.norm())
                        us = graph_us(fn, [(x, *t) for t in sets])
                    except Exception as e:  # say so once, keep the rest
                        print(f"# {fmt} M={m} {name} {layer}: {e!r}"[:300], flush=True)
                        failed[(fmt, name)] = repr(e)
                        continue
                    res.setdefault((fmt, m, name), {})[layer] = (us, err)
            del sets
            torch.cuda.empty_cache()
        print(f"# {layer} timed, {deadline - time.monotonic():.0f}s left", flush=True)
    return res


def report(res: Results, ms: tuple[int, ...]) -> None:
    head = " | ".join(f"{lay} µs (×bf16)" for lay in LAYERS)
    print(f"| fmt | M | variant | {head} | sum µs | ×bf16 |")
    print("|---|---|---|" + "---|" * (len(LAYERS) + 2))
    for m in ms:
        bf16 = res.get(("bf16", m, "cublas"), {})
        for (fmt, mm, name), row in res.items():
            if mm != m:
                continue
            cells, total, ref = [], 0.0, 0.0
            for lay in LAYERS:
                if lay not in row or lay not in bf16:
                    cells.append("—")
                    total = ref = float("nan")
                    continue
                us, err = row[lay]
                flag = "" if err < 1e-2 else f" !err{err:.0e}"
                cells.append(f"{us:.1f} ({bf16[lay][0] / us:.2f}){flag}")
                total += us
                ref += bf16[lay][0]
            print(f"| {fmt} | {m} | {name} | " + " | ".join(cells) + f" | {total:.1f} | {ref / total:.2f} |")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=80.0, help="seconds for the whole run")
    p.add_argument("--ms", default="16,32,64,128,256")
    p.add_argument("--repeat", type=int, default=1, help="time the --repeat-ms rows this many times in all")
    p.add_argument("--repeat-ms", default="64", help="the Ms the repeats time again (the spread)")
    p.add_argument("--workers", type=int, default=12)
    p.add_argument("--only", default="", help="comma-separated variant names (bf16 always)")
    args = p.parse_args()
    start = time.monotonic()
    ms = tuple(int(v) for v in args.ms.split(","))
    only = tuple(v for v in args.only.split(",") if v)
    import triton

    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} triton {triton.__version__}")
    failed = warm_up(ms, args.workers, 0.55 * args.budget, only)
    for run in range(args.repeat):
        run_ms = ms if run == 0 else tuple(int(v) for v in args.repeat_ms.split(","))
        left = start + args.budget - 2 - time.monotonic()
        print(f"# run {run + 1} of {args.repeat}: M {run_ms}", flush=True)
        report(measure(run_ms, time.monotonic() + left / (args.repeat - run), failed, only), run_ms)
    print(f"# total {time.monotonic() - start:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
