"""Kernel benchmarks on the GPU: paged decode/prefill attention and the fused kernels vs torch.

    source benchmarks/gpu_env.sh && python benchmarks/bench_kernels.py --out $OUT/kernels.json [--sweep]

Shapes are Qwen3-8B's (32 query heads, 8 KV heads, head_dim 128, hidden 4096, intermediate 12288), bf16,
page size 16, block tables a random permutation of the pool (pages not contiguous).

Timing: every number is the median over many CUDA-event-timed replays of a CUDA graph that holds
CALLS_PER_GRAPH back-to-back calls (after warm-up and compilation), divided by CALLS_PER_GRAPH: this is
device time without Python launch overhead, as the engine's captured decode steps see it. The eager
median (events around single Python calls, launch overhead included) is reported beside it. L2 is not
flushed; instead the calls cycle over enough distinct input sets that the working set is >= 4x the L2
(60 MB), so every call reads its K/V from HBM. Bytes for attention = K+V read + q read + out written.

8-bit KV caches (fp8 e4m3, int8; --kv8-only to run just these): decode over pages quantized per token and
head, bytes counted as actually read (1-byte values + one fp32 scale per token, head, K/V), with the
speed-up over the bf16 kernel on the same shape in the same run.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from kvpilot.runtime.kernels.activation import silu_and_mul_ref
from kvpilot.runtime.kernels.activation_triton import silu_and_mul_triton
from kvpilot.runtime.kernels.attention import paged_attention_ref
from kvpilot.runtime.kernels.decode_attention_triton import (
    DecodeConfig,
    DecodePlan,
    default_decode_config,
    paged_decode_attention_triton,
    plan_decode,
)
from kvpilot.runtime.kernels.kv_cache import quantize_ref
from kvpilot.runtime.kernels.norm import rms_norm_ref
from kvpilot.runtime.kernels.norm_triton import rms_norm_triton
from kvpilot.runtime.kernels.prefill_attention_triton import paged_prefill_attention_triton

COPY_BW = 4.25e12  # bytes/s, device-to-device copy measured on the H200 (DESIGN.md)
L2_BYTES = 60e6
CALLS_PER_GRAPH = 20
H, KVH, D, PAGE = 32, 8, 128, 16
HIDDEN, INTER = 4096, 12288
BF16 = torch.bfloat16
DEV = "cuda"
DECODE_CASES = ((64, 2048), (64, 4096), (1, 4096))  # (batch, context)
PREFILL_CASES = ((1, 1024, 1024), (1, 4096, 512))  # (batch, context, new tokens)
FUSED_TOKENS = (256, 4096)
KV8_DTYPES = {"fp8": torch.float8_e4m3fn, "int8": torch.int8}
KV8_CASES = ((64, 4096), (64, 2048), (256, 1024), (16, 8192), (1, 4096))  # 64 x 4k is the target
SCALE_BYTES = 4  # one fp32 scale per (token, KV head) for K and for V (kvpilot.contracts.kv_cache)


@dataclass
class Result:
    group: str  # decode | prefill | fused | sweep
    name: str
    impl: str  # triton | torch-sdpa | torch-ref
    us: float  # graph-replay median per call
    eager_us: float | None
    bytes: float
    flops: float = 0.0
    ok: bool | None = None  # matches the reference (bf16 tolerance)
    note: str = ""

    @property
    def tbps(self) -> float:
        return self.bytes / (self.us * 1e-6) / 1e12


# ------------------------------------------------------------------------------------------------ timing


def _event_pairs(n: int) -> list[tuple[torch.cuda.Event, torch.cuda.Event]]:
    return [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]


def time_graph(calls: Sequence[Callable[[], Any]], replays: int) -> float:
    """Median µs per call over replays of one CUDA graph holding CALLS_PER_GRAPH calls."""
    seq = [calls[i % len(calls)] for i in range(CALLS_PER_GRAPH)]
    for c in calls:  # compile every specialisation, allocate, warm up outside the capture
        c()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in seq:
            c()
    for _ in range(3):
        graph.replay()
    events = _event_pairs(replays)
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events) * 1e3 / len(seq)


def time_eager(calls: Sequence[Callable[[], Any]], iters: int) -> float:
    for c in calls:
        c()
    events = _event_pairs(iters)
    for i, (start, end) in enumerate(events):
        start.record()
        calls[i % len(calls)]()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events) * 1e3


def measure(calls: Sequence[Callable[[], Any]], replays: int, graph: bool = True) -> tuple[float, float]:
    """(graph µs, eager µs); graph=False for calls that sync with the host (they report eager twice)."""
    eager_us = time_eager(calls, 5 * replays)
    return (time_graph(calls, replays) if graph else eager_us), eager_us


def num_sets(bytes_per_set: float) -> int:
    return max(1, min(CALLS_PER_GRAPH, math.ceil(4 * L2_BYTES / bytes_per_set)))


def copy_bandwidth() -> float:
    src = torch.empty(1 << 30, dtype=torch.uint8, device=DEV).random_()
    dst = torch.empty_like(src)
    us, _ = measure([lambda: dst.copy_(src)], 20)
    return 2 * src.numel() / (us * 1e-6)


# ------------------------------------------------------------------------------------------------ data


def paged_batch(batch: int, ctx: int, q_len: int, kv_dtype: torch.dtype = BF16) -> dict[str, torch.Tensor]:
    """Equal-length sequences; pages drawn from a shuffled pool (random, non-contiguous block tables).
    An 8-bit kv_dtype quantizes the pages per token and head (kernels/kv_cache.py), scales in ks/vs."""
    per_seq = -(-ctx // PAGE)
    perm = torch.randperm(batch * per_seq, device=DEV).to(torch.int32)
    out = {
        "q": torch.randn(batch * q_len, H, D, device=DEV, dtype=BF16),
        "k": torch.randn(batch * per_seq, PAGE, KVH, D, device=DEV, dtype=BF16),
        "v": torch.randn(batch * per_seq, PAGE, KVH, D, device=DEV, dtype=BF16),
        "cu": torch.arange(0, batch * q_len + 1, q_len, device=DEV, dtype=torch.int32),
        "ctx": torch.full((batch,), ctx, device=DEV, dtype=torch.int32),
        "bt": perm.view(batch, per_seq),
    }
    if kv_dtype != BF16:
        out["k"], out["ks"] = quantize_ref(out["k"], kv_dtype)
        out["v"], out["vs"] = quantize_ref(out["v"], kv_dtype)
    return out


def attn_bytes(batch: int, ctx: int, q_len: int, kv_dtype: torch.dtype = BF16) -> float:
    """K+V bytes read (values, and scales for 8-bit caches) + q read + out written (bf16)."""
    per_vector = D * kv_dtype.itemsize + (SCALE_BYTES if kv_dtype.itemsize == 1 else 0)
    return batch * (2 * ctx * KVH * per_vector + 2 * q_len * H * D * 2)


def reference(b: dict[str, torch.Tensor], scale: float) -> torch.Tensor:
    return paged_attention_ref(
        b["q"], b["k"], b["v"], b["cu"], b["ctx"], b["bt"], scale, k_scale=b.get("ks"), v_scale=b.get("vs")
    )


def close(out: torch.Tensor, ref: torch.Tensor) -> bool:
    return bool(torch.allclose(out.float(), ref.float(), atol=2e-2, rtol=2e-2))


# ------------------------------------------------------------------------------------------------ attention


def bench_decode(
    batch: int,
    ctx: int,
    replays: int,
    config: DecodeConfig | None = None,
    plan: DecodePlan | None = None,
    group: str = "decode",
    kv: str = "bf16",
) -> Result:
    kv_dtype = KV8_DTYPES.get(kv, BF16)
    nbytes = attn_bytes(batch, ctx, 1, kv_dtype)
    sets = [paged_batch(batch, ctx, 1, kv_dtype) for _ in range(num_sets(nbytes))]
    scale = D**-0.5

    def call(b: dict[str, torch.Tensor]) -> Callable[[], torch.Tensor]:
        return lambda: paged_decode_attention_triton(
            b["q"],
            b["k"],
            b["v"],
            b["ctx"],
            b["bt"],
            scale,
            config=config,
            plan=plan,
            k_scale=b.get("ks"),
            v_scale=b.get("vs"),
        )

    b0 = sets[0]
    ok = close(call(b0)(), reference(b0, scale))
    us, eager = measure([call(b) for b in sets], replays)
    cfg = config or default_decode_config(kv_dtype)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    chosen = plan or plan_decode(batch, KVH, b0["bt"].shape[1] * PAGE, sms, cfg)
    note = (
        f"bn={cfg.block_n} w={cfg.num_warps} s={cfg.num_stages} "
        f"splits={chosen.num_splits} part={chosen.partition_size}"
    )
    impl = "triton" if kv == "bf16" else f"triton-{kv}"
    return Result(group, f"decode b{batch} ctx{ctx}", impl, us, eager, nbytes, ok=ok, note=note)


def bench_kv8(replays: int) -> tuple[list[Result], list[str]]:
    """8-bit decode beside bf16 on the same shapes; lines of 'speed-up over bf16' for the report."""
    results, lines = [], []
    for batch, ctx in KV8_CASES:
        base = bench_decode(batch, ctx, replays, group="kv8")
        results.append(base)
        for kv in KV8_DTYPES:
            r = bench_decode(batch, ctx, replays, group="kv8", kv=kv)
            results.append(r)
            lines.append(
                f"decode b{batch} ctx{ctx} {kv}: {r.us:.1f} µs vs bf16 {base.us:.1f} µs = "
                f"{base.us / r.us:.2f}x, {r.bytes / 1e6:.1f} MB read (values + scales), "
                f"{100 * r.bytes / (r.us * 1e-6) / COPY_BW:.0f}% of 4.25 TB/s"
            )
    return results, lines


def sweep_kv8(replays: int) -> list[Result]:
    """Tile/warps/stages for the 8-bit decode defaults."""
    out = []
    for batch, ctx in ((64, 4096), (16, 8192)):
        for kv in KV8_DTYPES:
            for bn in (64, 128, 256):
                for warps in (4, 8):
                    for stages in (2, 3):
                        cfg = DecodeConfig(block_n=bn, num_warps=warps, num_stages=stages)
                        out.append(bench_decode(batch, ctx, replays, cfg, group="sweep", kv=kv))
    return out


def bench_sdpa(batch: int, ctx: int, q_len: int, replays: int) -> Result:
    """torch SDPA on contiguous (unpaged) K/V in [batch, seq, heads, dim] memory, GQA without repeats."""

    def make() -> tuple[torch.Tensor, ...]:
        q = torch.randn(batch, q_len, H, D, device=DEV, dtype=BF16).transpose(1, 2)
        k, v = (torch.randn(batch, ctx, KVH, D, device=DEV, dtype=BF16).transpose(1, 2) for _ in range(2))
        return q, k, v

    sets = [make() for _ in range(num_sets(attn_bytes(batch, ctx, q_len)))]
    causal = q_len > 1
    calls = [lambda s=s: F.scaled_dot_product_attention(*s, is_causal=causal, enable_gqa=True) for s in sets]
    us, eager = measure(calls, replays)
    kind = "decode" if q_len == 1 else "prefill"
    return Result(
        kind,
        f"{kind} b{batch} ctx{ctx}" + ("" if q_len == 1 else f" q{q_len}"),
        "torch-sdpa",
        us,
        eager,
        attn_bytes(batch, ctx, q_len),
        flops=attn_flops(batch, ctx, q_len),
    )


def attn_flops(batch: int, ctx: int, q_len: int) -> float:
    keys = sum(ctx - q_len + i + 1 for i in range(q_len))  # causal: query i sees ctx - q_len + i + 1 keys
    return batch * 4 * H * D * keys


def bench_prefill(batch: int, ctx: int, q_len: int, replays: int) -> Result:
    sets = [paged_batch(batch, ctx, q_len) for _ in range(num_sets(attn_bytes(batch, ctx, q_len)))]
    scale = D**-0.5

    def call(b: dict[str, torch.Tensor]) -> Callable[[], torch.Tensor]:
        args = (b["q"], b["k"], b["v"], b["cu"], b["ctx"], b["bt"], scale)
        return lambda: paged_prefill_attention_triton(*args, max_q_len=q_len)

    calls = [call(b) for b in sets]
    ok = close(calls[0](), reference(sets[0], scale))
    us, eager = measure(calls, replays)
    return Result(
        "prefill",
        f"prefill b{batch} ctx{ctx} q{q_len}",
        "triton",
        us,
        eager,
        attn_bytes(batch, ctx, q_len),
        flops=attn_flops(batch, ctx, q_len),
        ok=ok,
    )


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def sweep_decode(replays: int) -> list[Result]:
    """Tile/warps/stages and split choices, for picking DecodeConfig defaults on this GPU."""
    out = []
    for batch, ctx in DECODE_CASES:
        for bn in (32, 64, 128):
            for warps in (4, 8):
                for stages in (1, 2, 3):
                    cfg = DecodeConfig(block_n=bn, num_warps=warps, num_stages=stages)
                    out.append(bench_decode(batch, ctx, replays, cfg, group="sweep"))
        for splits in (1, 2, 4, 8, 16, 32, 64):
            part = _cdiv(_cdiv(ctx, splits), 64) * 64  # a multiple of the default block_n
            plan = DecodePlan(_cdiv(ctx, part), part)
            out.append(bench_decode(batch, ctx, replays, plan=plan, group="sweep"))
    return out


# ------------------------------------------------------------------------------------------------ fused


def fused_cases(tokens: int) -> list[tuple[str, float, Callable[[], Any], Callable[[], Any]]]:
    """(name, bytes, make_triton_call, make_torch_call) per kernel; each maker draws fresh inputs."""
    x_bytes = tokens * HIDDEN * 2

    def norm() -> tuple[Callable[[], Any], Callable[[], Any]]:
        x, r = (torch.randn(tokens, HIDDEN, device=DEV, dtype=BF16) for _ in range(2))
        w = torch.randn(HIDDEN, device=DEV, dtype=BF16)
        return lambda: rms_norm_triton(x, w, 1e-6, residual=r), lambda: rms_norm_ref(x, w, 1e-6, residual=r)

    def silu() -> tuple[Callable[[], Any], Callable[[], Any]]:
        x = torch.randn(tokens, 2 * INTER, device=DEV, dtype=BF16)
        return lambda: silu_and_mul_triton(x), lambda: silu_and_mul_ref(x)

    return [
        ("rms_norm+residual", 4 * x_bytes + HIDDEN * 2, norm),
        ("silu_and_mul", tokens * INTER * 6, silu),
    ]


def bench_fused(tokens: int, replays: int) -> list[Result]:
    out = []
    for name, nbytes, maker in fused_cases(tokens):
        pairs = [maker() for _ in range(num_sets(nbytes))]
        for impl, idx in (("triton", 0), ("torch-ref", 1)):
            # the reference KV store indexes with a boolean mask (a host sync): not capturable
            capturable = not (impl == "torch-ref" and name == "store_kv_cache")
            us, eager = measure([p[idx] for p in pairs], replays, graph=capturable)
            note = "" if capturable else "eager only (host sync)"
            out.append(Result("fused", f"{name} T{tokens}", impl, us, eager, nbytes, note=note))
    return out


# ------------------------------------------------------------------------------------------------ report


def table(results: list[Result], bw: float) -> str:
    rows = [
        "| case | impl | µs (graph) | µs (eager) | TB/s | % of 4.25 TB/s | % of measured copy | TFLOP/s "
        "| ok | note |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rate = r.bytes / (r.us * 1e-6)
        tflops = f"{r.flops / (r.us * 1e-6) / 1e12:.0f}" if r.flops else ""
        eager = f"{r.eager_us:.1f}" if r.eager_us is not None else ""
        ok = "" if r.ok is None else str(r.ok)
        pct = f"{100 * rate / COPY_BW:.0f}% | {100 * rate / bw:.0f}%"
        cells = [r.name, r.impl, f"{r.us:.1f}", eager, f"{rate / 1e12:.2f}", pct, tflops, ok, r.note]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def commit() -> str | None:
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        return done.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description="Triton kernel benchmarks (H200)")
    parser.add_argument("--out", required=True, help="JSON file for all numbers")
    parser.add_argument("--sweep", action="store_true", help="also sweep decode tile/warps/stages/splits")
    parser.add_argument("--replays", type=int, default=30)
    parser.add_argument("--kv8-only", action="store_true", help="only the 8-bit KV-cache decode cases")
    args = parser.parse_args()
    torch.manual_seed(0)
    bw = copy_bandwidth()
    main_results: list[Result] = []
    kv8_results, kv8_lines = bench_kv8(args.replays)
    if args.kv8_only:
        sweep = sweep_kv8(max(10, args.replays // 2)) if args.sweep else []
        report = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "device": torch.cuda.get_device_name()}
        report |= {"commit": commit(), "measured_copy_TBps": bw / 1e12}
        report["results"] = [asdict(r) | {"TBps": r.tbps} for r in kv8_results + sweep]
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        _print_sweep(sweep, bw)
        print(table(kv8_results, bw), "\n\n" + "\n".join(kv8_lines))
        return
    for batch, ctx in DECODE_CASES:
        main_results += [bench_decode(batch, ctx, args.replays), bench_sdpa(batch, ctx, 1, args.replays)]
    for batch, ctx, q_len in PREFILL_CASES:
        main_results.append(bench_prefill(batch, ctx, q_len, args.replays))
        if q_len == ctx:  # SDPA's is_causal is top-left aligned: comparable only when q_len == ctx
            main_results.append(bench_sdpa(batch, ctx, q_len, args.replays))
    for tokens in FUSED_TOKENS:
        main_results += bench_fused(tokens, args.replays)
    sweep = (
        sweep_decode(max(10, args.replays // 2)) + sweep_kv8(max(10, args.replays // 2)) if args.sweep else []
    )
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "commit": commit(),
        "measured_copy_TBps": bw / 1e12,
        "reference_copy_TBps": COPY_BW / 1e12,
        "calls_per_graph": CALLS_PER_GRAPH,
        "results": [asdict(r) | {"TBps": r.tbps} for r in main_results + kv8_results + sweep],
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    _print_sweep(sweep, bw)
    print(f"device {report['device']}, measured copy {bw / 1e12:.2f} TB/s, triton {report['triton']}\n")
    print(table(main_results, bw))
    print("\n8-bit KV cache decode:\n" + table(kv8_results, bw), "\n\n" + "\n".join(kv8_lines))


def _print_sweep(sweep: list[Result], bw: float) -> None:
    if sweep:  # the five fastest correct variants of each case
        ranked = sorted((r for r in sweep if r.ok), key=lambda r: (r.name, r.impl, r.us))
        key = [(r.name, r.impl) for r in ranked]
        best = [r for i, r in enumerate(ranked) if key[:i].count((r.name, r.impl)) < 5]
        print("decode sweep (fastest first):\n" + table(best, bw), "\n")


if __name__ == "__main__":
    main()
