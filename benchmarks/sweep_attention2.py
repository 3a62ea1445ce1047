"""Issue 16's attention rows in one GPU call: prefill 1 x 1024 and bf16 decode 32 x 512, 8 x 4k, 16 x 8k
(and 64 x 4k, to keep), each variant beside torch SDPA on contiguous K/V, the default and the old default.

    source benchmarks/gpu_env.sh && python benchmarks/sweep_attention2.py [--parts prefill,decode]

Prefill variants are PrefillConfig options (tiles, warps, stages, heads_first program order, pages_ahead)
and step_kv (K/V read as the step's contiguous projection rows instead of gathered pages); besides 1 x 1024
(Qwen3-8B heads) the default and old default run on 512 new tokens over a 4k context and on W1's mixed
step (Qwen3-0.6B heads). Decode variants are forced DecodePlans (splits, stages, pages_ahead) x tiles and
warps, plus the plan on shapes around the targets and on an 8k-wide block table (a CUDA graph's).
Every row is timed --repeat times (the spread); past --budget seconds the remaining rows are skipped.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from bench_kernels import (  # benchmarks/ is on sys.path when this file runs as a script
    BF16,
    COPY_BW,
    KVH,
    PAGE,
    D,
    H,
    attn_bytes,
    attn_flops,
    bench_sdpa,
    measure,
    num_sets,
    paged_batch,
    reference,
)
from kvpilot.runtime.kernels.decode_attention_triton import (
    DecodeConfig,
    DecodePlan,
    paged_decode_attention_triton,
    plan_decode,
)
from kvpilot.runtime.kernels.prefill_attention_triton import PrefillConfig, paged_prefill_attention_triton
from kvpilot.runtime.kernels.qkv_prepare_triton import qkv_prepare_triton
from kvpilot.runtime.kernels.triton_utils import num_sms
from kvpilot.runtime.layers.rotary import rope_cos_sin_cache
from sweep_attention import W1_HEADS, sdpa_us, varlen_batch, w1_step

SCALE = 128**-0.5
OLD_PREFILL = PrefillConfig(heads_first=False, pages_ahead=False, num_stages=2)  # before issue 16's work
OLD_DECODE = DecodeConfig(pages_ahead=False)  # the plans before pages_ahead
# (batch, context): the rows, then shapes that check the plan around them
TARGETS = ((32, 512), (8, 4096), (16, 8192), (64, 4096))
PLAN_CHECKS = ((24, 4096), (17, 4096), (4, 8192), (16, 512), (1, 4096), (32, 8192))


@dataclass(frozen=True)
class PrefillVariant:
    config: PrefillConfig
    contiguous: bool = False  # step_kv: K/V rows of the step instead of pages


def prefill_variants(full: bool, sweep: bool) -> dict[str, PrefillVariant]:
    """The defaults (paged, and the step's K/V rows that prefix-free steps read) and the old default; with
    sweep (1 x 1024), the alternatives measured for issue 16."""
    d, v = PrefillConfig(), PrefillVariant
    out = {"default": v(d), "old default": v(OLD_PREFILL)}
    if full:
        out["default, step_kv (prefix-free steps)"] = v(d, True)
    if not (full and sweep):
        return out
    hf = replace(OLD_PREFILL, heads_first=True)
    ahead = replace(OLD_PREFILL, pages_ahead=True, num_stages=3)
    return out | {
        "heads_first bn64 s2": v(hf),
        "pages_ahead bn64 s3": v(ahead),
        "hf+ahead bn64 s4": v(replace(d, num_stages=4)),
        "hf+ahead bn32 s3": v(replace(d, block_n=32)),
        "hf+ahead bn32 s4": v(replace(d, block_n=32, num_stages=4)),
        "hf+ahead bm128 bn64 w8 s3": v(replace(d, block_m=128, num_warps=8)),
        "hf+ahead bm32 bn64 w4 s3": v(replace(d, block_m=32)),
        "hf+contig bn64 s3 (no gather)": v(replace(hf, num_stages=3), True),
        "hf+contig bn64 s2 (no gather)": v(hf, True),
    }


def decode_variants(batch: int, ctx: int, sweep: bool) -> dict[str, tuple[DecodeConfig, DecodePlan | None]]:
    """The default and old plans; with sweep, for the issue's rows, forced plans (splits, bn, warps,
    stages, ahead)."""
    out: dict[str, tuple[DecodeConfig, DecodePlan | None]] = {
        "default": (DecodeConfig(), None),
        "old default": (OLD_DECODE, None),
    }
    if not sweep:
        return out
    grid = {
        (32, 512): ((1, 64, 4, 4), (1, 128, 8, 3), (1, 64, 8, 3), (1, 32, 4, 4), (2, 64, 4, 3)),
        (8, 4096): ((2, 64, 4, 3), (3, 64, 4, 3), (4, 64, 4, 4), (4, 32, 4, 3), (4, 32, 4, 4),
                    (4, 128, 8, 3), (4, 64, 8, 3), (5, 64, 4, 3)),
        (16, 8192): ((3, 64, 4, 3), (4, 64, 4, 4), (6, 64, 4, 3), (8, 32, 4, 3), (2, 64, 4, 4),
                     (2, 32, 4, 3), (4, 32, 4, 4)),
    }.get((batch, ctx), ())  # fmt: skip
    for splits, bn, warps, stages in grid:
        part = _cdiv(_cdiv(ctx, splits), bn) * bn
        cfg = replace(DecodeConfig(), block_n=bn, num_warps=warps, num_stages=stages)
        out[f"ahead splits {splits} bn{bn} w{warps} s{stages}"] = (
            cfg,
            DecodePlan(splits, part, stages, pages_ahead=True),
        )
    return out


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Sweep:
    def __init__(self, replays: int, repeat: int, budget: float, sweep: bool) -> None:
        self.replays, self.repeat, self.budget, self.sweep = replays, repeat, budget, sweep
        self.start = time.time()
        self.base: dict[str, tuple[float, float]] = {}  # shape -> (default, old default) µs

    def time(self, calls: list[Callable[[], object]]) -> list[float]:
        return [measure(calls, self.replays)[0] for _ in range(self.repeat)]

    def emit(self, shape: str, name: str, us: list[float], rate: str, err: float, note: str = "") -> None:
        new, old = self.base.setdefault(shape, (0.0, 0.0))
        if name in ("default", "old default"):
            new, old = (min(us), old) if name == "default" else (new, min(us))
            self.base[shape] = (new, old)
        rel = " / ".join(f"{b / min(us):.2f}x" if b else "-" for b in (new, old))
        times = "/".join(f"{u:.1f}" for u in us)
        print(f"| {shape} | {name} | {times} | {rate} | {rel} | {err:.0e} | {note} |", flush=True)

    def run(self, shape: str, name: str, calls: list[Callable], ref: torch.Tensor, rate: Callable,
            note: str = "") -> None:  # fmt: skip
        if time.time() - self.start > self.budget:
            print(f"| {shape} | {name} | skipped (budget) |")
            return
        try:
            err = float((calls[0]().float() - ref).abs().max())
            us = self.time(calls)
        except Exception as e:  # a variant that does not compile or launch: report, go on
            print(f"| {shape} | {name} | failed: {str(e)[:100]} |", flush=True)
            return
        self.emit(shape, name, us, rate(us), err, note)

    def prefill(self) -> None:
        ctx_lens, q_lens = w1_step()
        w1 = varlen_batch(ctx_lens, q_lens, *W1_HEADS)
        keys = sum(sum(c - q + i + 1 for i in range(q)) for c, q in zip(ctx_lens, q_lens, strict=True))
        cases = [("prefill 1x1024", 1024, 1024, True), ("prefill 512 on 4k", 4096, 512, False),
                 ("prefill W1 mixed", 0, max(q_lens), False)]  # fmt: skip
        for shape, ctx, q_len, full in cases:
            if ctx:
                sets = [paged_batch(1, ctx, q_len) for _ in range(num_sets(attn_bytes(1, ctx, q_len)))]
                flops = attn_flops(1, ctx, q_len)
            else:
                sets, flops = [w1], 4.0 * W1_HEADS[0] * 128 * keys
            for b in sets if full else ():  # the step's K/V rows: its pages in table order, [ctx, KVH, D]
                b["kr"], b["vr"] = (b[x][b["bt"][0].long()].reshape(-1, KVH, 128)[:ctx] for x in ("k", "v"))

            def tflops(us: list[float], flops: float = flops) -> str:
                return f"{flops / (min(us) * 1e-6) / 1e12:.0f} TFLOP/s"

            if full:
                sdpa = [sdpa_us(ctx, q_len, True, self.replays) for _ in range(self.repeat)]
                self.emit(shape, "torch SDPA causal (contiguous)", sdpa, tflops(sdpa), 0.0)
            ref = reference(sets[0], SCALE).float()
            for name, var in prefill_variants(full, self.sweep).items():

                def call(x: dict, var: PrefillVariant = var, n: int = q_len) -> Callable[[], torch.Tensor]:
                    args = (x["q"], x["k"], x["v"], x["cu"], x["ctx"], x["bt"], SCALE)
                    kv = (x["kr"], x["vr"]) if var.contiguous else None
                    return lambda: paged_prefill_attention_triton(
                        *args, max_q_len=n, config=var.config, step_kv=kv
                    )

                self.run(shape, name, [call(b) for b in sets], ref, tflops)
            del sets

    def decode(self) -> None:
        sms = num_sms(torch.device("cuda"))
        for batch, ctx in TARGETS + (PLAN_CHECKS if self.sweep else ()):
            shape, nbytes = f"decode {batch}x{ctx}", attn_bytes(batch, ctx, 1)
            sets = [paged_batch(batch, ctx, 1) for _ in range(num_sets(nbytes))]
            ref = reference(sets[0], SCALE).float()

            def pct(us: list[float], nbytes: float = nbytes) -> str:
                return f"{100 * nbytes / (min(us) * 1e-6) / COPY_BW:.1f}%"

            if (batch, ctx) in TARGETS:
                sdpa = [bench_sdpa(batch, ctx, 1, self.replays).us for _ in range(self.repeat)]
                self.emit(shape, "torch SDPA (contiguous)", sdpa, pct(sdpa), 0.0)
            variants = decode_variants(batch, ctx, self.sweep) if (batch, ctx) in TARGETS else {
                "default": (DecodeConfig(), None), "old default": (OLD_DECODE, None)}  # fmt: skip
            tables = [("", sets)]
            if self.sweep and (batch, ctx) in ((32, 512), (8, 4096)):  # a CUDA graph's 8k-wide table
                zeros = sets[0]["bt"].new_zeros(batch, (8192 - ctx) // PAGE)
                tables.append((", 8k-wide table", [dict(b, bt=torch.cat([b["bt"], zeros], 1)) for b in sets]))
            for suffix, bsets in tables:
                for name, (cfg, plan) in variants.items():
                    if suffix and plan is not None:
                        continue

                    def call(b: dict, cfg: DecodeConfig = cfg, plan: DecodePlan | None = plan) -> Callable:
                        return lambda: paged_decode_attention_triton(
                            b["q"], b["k"], b["v"], b["ctx"], b["bt"], SCALE, config=cfg, plan=plan
                        )

                    width = bsets[0]["bt"].shape[1] * PAGE
                    p = plan or plan_decode(batch, KVH, width, sms, cfg)
                    note = f"{p.num_splits}x{p.partition_size} s{p.num_stages} ahead={p.pages_ahead}"
                    self.run(shape, name + suffix, [call(b) for b in bsets], ref, pct, note)
            del sets, tables


def qkv_part(sweep: Sweep) -> None:
    """qkv_prepare over a 1024-token prompt (Qwen3-8B heads, q/k norm): what k_to_qkv (the step's k rows
    for step_kv) adds to the step."""
    t, rows = 1024, (H + 2 * KVH) * D
    qkv = torch.randn(t, rows, device="cuda", dtype=BF16)
    pos = torch.arange(t, device="cuda")
    cos_sin = rope_cos_sin_cache(D, 4096, 1_000_000.0, None, "cuda")
    k, v = (torch.zeros(t // PAGE, PAGE, KVH, D, device="cuda", dtype=BF16) for _ in range(2))
    slots, w = torch.arange(t, device="cuda"), torch.ones(D, device="cuda", dtype=BF16)
    nbytes = t * (rows + H * D + 2 * KVH * D) * 2  # qkv read, q and the cache's k and v written
    for flag in (False, True):
        call = lambda f=flag: qkv_prepare_triton(qkv, pos, cos_sin, k, v, slots, w, w, 1e-6, k_to_qkv=f)  # noqa: E731
        us = sweep.time([call])
        rate = f"{100 * nbytes / (min(us) * 1e-6) / COPY_BW:.1f}%"
        sweep.emit("qkv_prepare 1024 tokens", f"k_to_qkv={flag}", us, rate, 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="prefill,decode,qkv")
    parser.add_argument("--replays", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3, help="timings per row (the spread)")
    parser.add_argument("--budget", type=float, default=75.0, help="seconds before skipping rows")
    parser.add_argument("--sweep", action="store_true", help="the alternatives too, not just the defaults")
    args = parser.parse_args()
    torch.manual_seed(0)
    sweep = Sweep(args.replays, args.repeat, args.budget, args.sweep)
    print(f"{torch.cuda.get_device_name()}, {num_sms(torch.device('cuda'))} SMs; % of {COPY_BW / 1e12} TB/s")
    print("| shape | variant | µs (each repeat) | rate | vs default / old | max_err | plan |")
    print("|---|---|---|---|---|---|---|")
    for part in args.parts.split(","):
        qkv_part(sweep) if part == "qkv" else getattr(sweep, part)()
    print(f"done in {time.time() - sweep.start:.0f}s")


if __name__ == "__main__":
    main()
