"""Issue 16's attention rows in one GPU call: prefill 1 x 1024 and bf16 decode 32 x 512, 8 x 4k, 16 x 8k
(and 64 x 4k, to keep), each variant beside torch SDPA on contiguous K/V and the current default.

    source benchmarks/gpu_env.sh && python benchmarks/sweep_attention2.py [--parts prefill,decode]

Prefill variants are PrefillConfig options (tiles, warps, stages, GQA packing, the scale folded into q)
and step_kv (K/V read as the step's contiguous projection rows instead of gathered pages). Decode
variants are forced DecodePlans (split count, partition, stages) x DecodeConfig tiles/warps. A variant
that fails to compile or launch prints its error and the sweep goes on; past --budget seconds the
remaining variants are skipped (rows print as they finish). --repeat times each row that many times.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from bench_kernels import (  # benchmarks/ is on sys.path when this file runs as a script
    COPY_BW,
    KVH,
    PAGE,
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
from kvpilot.runtime.kernels.triton_utils import num_sms
from sweep_attention import sdpa_us

SCALE = 128**-0.5
DECODE_SHAPES = ((32, 512), (8, 4096), (16, 8192), (64, 4096))


@dataclass(frozen=True)
class PrefillVariant:
    config: PrefillConfig
    contiguous: bool = False  # step_kv: K/V rows of the step instead of pages


def prefill_variants() -> dict[str, PrefillVariant]:
    d = PrefillConfig()
    v = PrefillVariant
    return {
        "default": v(d),
        "bm64 bn64 w8 s2": v(replace(d, num_warps=8)),
        "bm128 bn64 w8 s3": v(replace(d, block_m=128, num_warps=8, num_stages=3)),
        "fold_scale bm64 bn64 w4 s2": v(replace(d, fold_scale=True)),
        "no GQA pack bm64 bn64 w4 s2": v(replace(d, gqa_pack=False)),
        "ahead bm64 bn64 w4 s3": v(replace(d, num_stages=3, pages_ahead=True)),
        "ahead bm64 bn32 w4 s3": v(replace(d, block_n=32, num_stages=3, pages_ahead=True)),
        "ahead bm64 bn32 w4 s4": v(replace(d, block_n=32, num_stages=4, pages_ahead=True)),
        "ahead bm128 bn64 w8 s3": v(replace(d, block_m=128, num_warps=8, num_stages=3, pages_ahead=True)),
        "ahead+fold bm64 bn32 w4 s3": v(
            replace(d, block_n=32, num_stages=3, pages_ahead=True, fold_scale=True)
        ),
        "contig bm64 bn64 w4 s2": v(d, True),
        "contig bm64 bn32 w4 s3": v(replace(d, block_n=32, num_stages=3), True),
        "contig bm64 bn64 w4 s3": v(replace(d, num_stages=3), True),
        "contig bm128 bn64 w8 s3": v(replace(d, block_m=128, num_warps=8, num_stages=3), True),
        "contig+fold bm128 bn64 w8 s3": v(
            replace(d, block_m=128, num_warps=8, num_stages=3, fold_scale=True), True
        ),
    }


def decode_variants(batch: int, ctx: int) -> dict[str, tuple[DecodeConfig, DecodePlan | None]]:
    """Forced plans for the shape (splits, block_n, warps, stages); the default plan first."""
    d = DecodeConfig()
    out: dict[str, tuple[DecodeConfig, DecodePlan | None]] = {"default": (d, None)}
    kind = "short" if ctx <= 1024 else "long" if batch * KVH <= 128 else "big"
    if kind == "short":  # short contexts: latency-bound, few tiles per program
        grid = (
            (1, 64, 4, 2), (1, 128, 8, 2), (2, 64, 4, 2), (4, 64, 4, 2), (4, 128, 8, 2), (8, 64, 4, 2),
            (8, 32, 2, 2),
        )  # fmt: skip
    elif kind == "long":  # long contexts, few (seq, head) pairs: partition length and pipeline depth
        grid = (
            (4, 64, 4, 6), (6, 64, 4, 5), (8, 64, 4, 5), (16, 64, 4, 5), (8, 64, 4, 2), (5, 64, 4, 5),
        )  # fmt: skip
    else:  # the big batch: keep its single pass (just the default and one deeper pipeline)
        grid = ((1, 64, 4, 5),)
    ahead = {  # pages_ahead: the compiler double-buffers K/V from 3 stages (compile_check)
        "short": ((1, 64, 4, 3), (2, 64, 4, 3), (3, 64, 4, 3), (4, 64, 4, 3), (4, 32, 4, 3), (8, 32, 4, 3),
                  (1, 32, 4, 3)),
        "long": ((4, 64, 4, 3), (4, 64, 4, 4), (8, 64, 4, 3), (8, 64, 4, 4), (6, 64, 4, 3), (5, 64, 4, 4),
                 (16, 64, 4, 3), (8, 32, 4, 3)),
        "big": ((1, 64, 4, 3),),
    }[kind]  # fmt: skip
    for (splits, bn, warps, stages), pages_ahead in [(g, False) for g in grid] + [(g, True) for g in ahead]:
        part = _cdiv(_cdiv(ctx, splits), bn) * bn
        if splits > 1 and part * (splits - 1) >= ctx:
            continue  # fewer real partitions than splits: the same as a smaller split count
        cfg = replace(d, block_n=bn, num_warps=warps, num_stages=stages, pages_ahead=pages_ahead)
        name = f"{'ahead ' if pages_ahead else ''}splits {splits} bn{bn} w{warps} s{stages}"
        out[name] = (cfg, DecodePlan(splits, part, stages))
    return out


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Sweep:
    def __init__(self, replays: int, repeat: int, budget: float) -> None:
        self.replays, self.repeat, self.budget = replays, repeat, budget
        self.start = time.time()
        self.base: dict[str, float] = {}  # shape -> default µs

    def over_budget(self) -> bool:
        return time.time() - self.start > self.budget

    def time(self, calls: list[Callable[[], object]]) -> list[float]:
        return [measure(calls, self.replays)[0] for _ in range(self.repeat)]

    def emit(self, shape: str, name: str, us: list[float], rate: str, err: float, note: str = "") -> None:
        base = self.base.setdefault(shape, min(us)) if name == "default" else self.base.get(shape)
        rel = f"{base / min(us):.2f}x" if base else ""
        times = "/".join(f"{u:.1f}" for u in us)
        print(f"| {shape} | {name} | {times} | {rate} | {rel} | {err:.1e} | {note} | "
              f"[{time.time() - self.start:.0f}s]", flush=True)  # fmt: skip

    def prefill(self) -> None:
        ctx = q_len = 1024
        shape, flops = "prefill 1x1024", attn_flops(1, ctx, q_len)
        sets = [paged_batch(1, ctx, q_len) for _ in range(num_sets(attn_bytes(1, ctx, q_len)))]
        for b in sets:  # the step's K/V rows: the pages in table order, [ctx, kv_heads, head_dim]
            b["kr"], b["vr"] = (b[x][b["bt"][0].long()].reshape(ctx, KVH, -1) for x in ("k", "v"))
        ref = reference(sets[0], SCALE).float()

        def tflops(us: list[float]) -> str:
            return f"{flops / (min(us) * 1e-6) / 1e12:.0f} TFLOP/s"

        sdpa = [sdpa_us(ctx, q_len, True, self.replays) for _ in range(self.repeat)]
        self.emit(shape, "torch SDPA causal (contiguous)", sdpa, tflops(sdpa), 0.0)
        for name, var in prefill_variants().items():
            if self.over_budget():
                print(f"| {shape} | {name} | skipped (budget) |")
                continue

            def call(x: dict, var: PrefillVariant = var) -> Callable[[], torch.Tensor]:
                args = (x["q"], x["k"], x["v"], x["cu"], x["ctx"], x["bt"], SCALE)
                step_kv = (x["kr"], x["vr"]) if var.contiguous else None
                return lambda: paged_prefill_attention_triton(
                    *args, max_q_len=q_len, config=var.config, step_kv=step_kv
                )

            try:
                err = float((call(sets[0])().float() - ref).abs().max())
                us = self.time([call(b) for b in sets])
            except Exception as e:  # a variant that does not compile: report, go on
                print(f"| {shape} | {name} | failed: {str(e)[:100]} |", flush=True)
                continue
            self.emit(shape, name, us, tflops(us), err)

    def decode(self) -> None:
        sms = num_sms(torch.device("cuda"))
        for batch, ctx in DECODE_SHAPES:
            shape, nbytes = f"decode {batch}x{ctx}", attn_bytes(batch, ctx, 1)
            sets = [paged_batch(batch, ctx, 1) for _ in range(num_sets(nbytes))]
            ref = reference(sets[0], SCALE).float()

            def pct(us: list[float], nbytes: float = nbytes) -> str:
                return f"{100 * nbytes / (min(us) * 1e-6) / COPY_BW:.1f}%"

            sdpa = [bench_sdpa(batch, ctx, 1, self.replays).us for _ in range(self.repeat)]
            self.emit(shape, "torch SDPA (contiguous)", sdpa, pct(sdpa), 0.0)
            for name, (cfg, plan) in decode_variants(batch, ctx).items():
                if self.over_budget():
                    print(f"| {shape} | {name} | skipped (budget) |")
                    continue

                def call(b: dict, cfg: DecodeConfig = cfg, plan: DecodePlan | None = plan) -> Callable:
                    return lambda: paged_decode_attention_triton(
                        b["q"], b["k"], b["v"], b["ctx"], b["bt"], SCALE, config=cfg, plan=plan
                    )

                try:
                    err = float((call(sets[0])().float() - ref).abs().max())
                    us = self.time([call(b) for b in sets])
                except Exception as e:
                    print(f"| {shape} | {name} | failed: {str(e)[:100]} |", flush=True)
                    continue
                chosen = plan or plan_decode(batch, KVH, ctx // PAGE * PAGE, sms, cfg)
                note = f"splits={chosen.num_splits} part={chosen.partition_size} s={chosen.num_stages}"
                self.emit(shape, name, us, pct(us), err, note)
            del sets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="prefill,decode")
    parser.add_argument("--replays", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=1, help="timings per row (the spread)")
    parser.add_argument("--budget", type=float, default=75.0, help="seconds before skipping variants")
    args = parser.parse_args()
    torch.manual_seed(0)
    sweep = Sweep(args.replays, args.repeat, args.budget)
    print(f"{torch.cuda.get_device_name()}, {num_sms(torch.device('cuda'))} SMs; % of {COPY_BW / 1e12} TB/s")
    print("| shape | variant | µs (each repeat) | rate | vs default | max_err | plan |")
    print("|---|---|---|---|---|---|---|")
    for part in args.parts.split(","):
        getattr(sweep, part)()
    print(f"done in {time.time() - sweep.start:.0f}s")


if __name__ == "__main__":
    main()
