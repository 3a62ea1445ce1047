"""Sweep the attention kernels' launch variants on the GPU, one call, and print compact tables.

    source benchmarks/gpu_env.sh && python benchmarks/sweep_attention.py --out $OUT [--parts kv8,prefill]

- kv8: 8-bit KV decode (fp8 e4m3, int8) variants of DecodeConfig (v_widen tile/operand, qk_dot
  widen/native, block_n, warps, stages) on 64x4k, 16x8k, 8x4k, 32x512, 1x4k, each beside the bf16 kernel
  of the same shape in the same run; bytes counted as read (values + fp32 scales). max_err is the largest
  |out - reference on the dequantized cache| (the precision a variant costs beyond the cache's own).
- decode: bf16 small-batch decode (8x4k, 32x512, 16x8k, 1x4k, 64x4k): DecodeConfig tiles/stages and forced
  split counts vs the default plan, beside torch SDPA on contiguous K/V.
- prefill: PrefillConfig tiles/warps/stages on 1x1024 causal and 512 new tokens on a 4k context, beside
  torch SDPA (1x1024: causal; 512 on 4k: SDPA's is_causal is top-left aligned, so it runs non-causal
  there: ~12% more work than the paged kernel's, an upper bound).

Rows print as they finish (a killed run keeps what it measured); the full list goes to $OUT/sweep.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import torch
from bench_kernels import (  # benchmarks/ is on sys.path when this file runs as a script
    BF16,
    COPY_BW,
    KV8_DTYPES,
    KVH,
    PAGE,
    attn_bytes,
    attn_flops,
    bench_sdpa,
    commit,
    copy_bandwidth,
    measure,
    num_sets,
    paged_batch,
    reference,
)
from kvpilot.runtime.kernels.decode_attention_triton import (
    DecodeConfig,
    DecodePlan,
    default_decode_config,
    paged_decode_attention_triton,
    plan_decode,
)
from kvpilot.runtime.kernels.prefill_attention_triton import PrefillConfig, paged_prefill_attention_triton
from kvpilot.runtime.kernels.triton_utils import num_sms

SCALE = 128**-0.5
DEV = "cuda"
# the default (--quick) run fits a 3.5-minute device call with compilation: the issues' target shapes only
KV8_SHAPES = {"quick": ((64, 4096),), "full": ((64, 4096), (16, 8192), (8, 4096), (32, 512), (1, 4096))}
DECODE_SHAPES = {
    "quick": ((8, 4096), (32, 512)),
    "full": ((8, 4096), (32, 512), (16, 8192), (1, 4096), (64, 4096)),
}
PREFILL_SHAPES = {"quick": ((1024, 1024),), "full": ((1024, 1024), (4096, 512))}  # (context, new), batch 1
# W1's mixed step (Qwen3-0.6B heads: 16 q, 8 KV): 8 prompt chunks (context = chunk) + 128 decode rows
W1_CHUNKS = (1024, 1000, 980, 950, 900, 870, 1024, 1010)
W1_HEADS = (16, 8)


@dataclass
class Row:
    part: str
    shape: str
    kv: str
    variant: str
    us: float
    bytes: float
    flops: float = 0.0
    max_err: float = 0.0
    note: str = ""

    def pct_bw(self) -> float:
        return 100 * self.bytes / (self.us * 1e-6) / COPY_BW


def kv8_variants(mode: str) -> dict[str, DecodeConfig]:
    d = default_decode_config(torch.int8)  # the 8-bit default (the same for e4m3)
    # num_stages: the K/V loads hang off a block-table load, so Triton double-buffers K/V only from
    # num_stages=5 (compile_check: shared memory grows there, not at 3 or 4); below that a program's next
    # tile is fetched after its current one is computed and only co-resident programs hide the latency.
    out = {
        "default: operand bn128 w4 s2": d,
        "tile bn128 w4 s2": replace(d, v_widen="tile"),
        "tile bn64 w4 s5": replace(d, v_widen="tile", block_n=64, num_stages=5),
        "tile+qk8 bn128 w4 s2": replace(d, v_widen="tile", qk_dot="native"),
        "operand+qk8 bn128 w4 s2": replace(d, qk_dot="native"),
        "tile+qk8 bn64 w4 s5": replace(d, v_widen="tile", qk_dot="native", block_n=64, num_stages=5),
    }
    if mode == "full":
        out |= {
            "tile bn128 w8 s2": replace(d, v_widen="tile", num_warps=8),
            "tile bn128 w4 s5": replace(d, v_widen="tile", num_stages=5),
            "tile bn64 w4 s2": replace(d, v_widen="tile", block_n=64),
            "operand bn64 w4 s2": replace(d, block_n=64),
            "tile+qk8 bn64 w4 s2": replace(d, v_widen="tile", qk_dot="native", block_n=64),
        }
    return out


def decode_call(b: dict[str, torch.Tensor], cfg: DecodeConfig | None, plan: DecodePlan | None) -> Callable:
    return lambda: paged_decode_attention_triton(
        b["q"], b["k"], b["v"], b["ctx"], b["bt"], SCALE, config=cfg, plan=plan, k_scale=b.get("ks"),
        v_scale=b.get("vs"),
    )  # fmt: skip


def time_decode(
    sets: list[dict[str, torch.Tensor]],
    cfg: DecodeConfig | None,
    plan: DecodePlan | None,
    replays: int,
    ref: torch.Tensor,  # reference output of sets[0]
) -> tuple[float, float]:
    """(graph µs per call, max |error| vs the reference on the first set)."""
    err = (decode_call(sets[0], cfg, plan)().float() - ref).abs().max()
    us, _ = measure([decode_call(b, cfg, plan) for b in sets], replays)
    return us, float(err)


def sweep_kv8(mode: str, replays: int, emit: Callable[[Row], None]) -> None:
    for batch, ctx in KV8_SHAPES[mode]:
        shape = f"{batch}x{ctx}"
        base = [paged_batch(batch, ctx, 1) for _ in range(num_sets(attn_bytes(batch, ctx, 1)))]
        us, err = time_decode(base, None, None, replays, reference(base[0], SCALE).float())
        emit(Row("kv8", shape, "bf16", "default", us, attn_bytes(batch, ctx, 1), max_err=err))
        del base
        for kv, dtype in KV8_DTYPES.items():
            nbytes = attn_bytes(batch, ctx, 1, dtype)
            sets = [paged_batch(batch, ctx, 1, dtype) for _ in range(num_sets(nbytes))]
            ref = reference(sets[0], SCALE).float()
            for name, cfg in kv8_variants(mode).items():
                if kv == "fp8" and "qk8" in name and mode == "quick":
                    continue  # e4m3 x e4m3 at M = 16 is a widening + fp16 dot in Triton: only q's rounding
                us, err = time_decode(sets, cfg, None, replays, ref)
                emit(Row("kv8", shape, kv, name, us, nbytes, max_err=err))
            del sets


def decode_variants(mode: str, ctx: int) -> dict[str, tuple[DecodeConfig, DecodePlan | None]]:
    d = DecodeConfig()
    out: dict[str, tuple[DecodeConfig, DecodePlan | None]] = {"default plan": (d, None)}
    configs = (
        ((64, 4, 5), (32, 4, 5)) if mode == "quick" else ((64, 4, 5), (32, 4, 5), (32, 4, 2), (128, 8, 2))
    )
    for bn, warps, stages in configs:
        out[f"bn{bn} w{warps} s{stages} plan"] = (DecodeConfig(bn, warps, stages), None)
    out["default split_waves 8"] = (replace(d, split_waves=8.0), None)
    out["short plans only (before)"] = (replace(d, long_split_waves=0.0), None)
    for splits in (4, 16, 32) if mode == "quick" else (1, 2, 4, 8, 16, 32):
        if splits * 64 <= ctx:
            for stages in (2, 5):
                plan = DecodePlan(splits, _cdiv(_cdiv(ctx, splits), 64) * 64)
                out[f"splits {splits} s{stages}"] = (replace(d, num_stages=stages), plan)
    return out


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def sdpa_us(ctx: int, q_len: int, causal: bool, replays: int) -> float:
    """torch SDPA on contiguous [1, heads, seq, dim] K/V (GQA without repeats), graph-timed."""

    def make() -> tuple[torch.Tensor, ...]:
        q = torch.randn(1, q_len, 32, 128, device=DEV, dtype=BF16).transpose(1, 2)
        k, v = (torch.randn(1, ctx, KVH, 128, device=DEV, dtype=BF16).transpose(1, 2) for _ in range(2))
        return q, k, v

    sets = [make() for _ in range(num_sets(attn_bytes(1, ctx, q_len)))]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    calls = [lambda s=s: sdpa(*s, is_causal=causal, enable_gqa=True) for s in sets]
    return measure(calls, replays)[0]


def sweep_decode(mode: str, replays: int, emit: Callable[[Row], None]) -> None:
    sms = num_sms(torch.device("cuda"))
    for batch, ctx in DECODE_SHAPES[mode]:
        shape = f"{batch}x{ctx}"
        nbytes = attn_bytes(batch, ctx, 1)
        sets = [paged_batch(batch, ctx, 1) for _ in range(num_sets(nbytes))]
        sdpa = bench_sdpa(batch, ctx, 1, replays)
        emit(Row("decode", shape, "bf16", "torch SDPA (contiguous)", sdpa.us, nbytes))
        ref = reference(sets[0], SCALE).float()
        for name, (cfg, plan) in decode_variants(mode, ctx).items():
            us, err = time_decode(sets, cfg, plan, replays, ref)
            chosen = plan or plan_decode(batch, KVH, ctx, sms, cfg)
            note = f"splits={chosen.num_splits} part={chosen.partition_size}"
            emit(Row("decode", shape, "bf16", name, us, nbytes, max_err=err, note=note))
        if mode == "full":  # a CUDA graph captured for an 8k-wide block table replaying a short context
            wide = [dict(b, bt=torch.cat([b["bt"], b["bt"].new_zeros(batch, 8192 // PAGE)], 1)) for b in sets]
            for name, cfg in (("wide table, adaptive", DecodeConfig()),
                              ("wide table, fixed", DecodeConfig(adaptive_partitions=False))):  # fmt: skip
                us, err = time_decode(wide, cfg, None, replays, ref)
                plan = plan_decode(batch, KVH, wide[0]["bt"].shape[1] * PAGE, sms, cfg)
                note = f"splits={plan.num_splits} part={plan.partition_size}"
                emit(Row("decode", shape, "bf16", name, us, nbytes, max_err=err, note=note))
            del wide
        del sets


def prefill_variants(mode: str) -> dict[str, PrefillConfig]:
    out = {
        "default": PrefillConfig(),
        "old: bm128 bn64 w8 s2 per-sequence grid": PrefillConfig(128, 64, 8, 2, flat_grid=False),
        "per-sequence grid": PrefillConfig(flat_grid=False),
        "flat grid": PrefillConfig(flat_grid=True),
    }
    quick = ((128, 64, 8, 5), (128, 128, 8, 2), (64, 32, 4, 2))
    more = (
        (64, 64, 4, 5), (64, 32, 4, 5), (64, 128, 4, 2), (128, 32, 8, 2), (128, 32, 8, 5), (256, 64, 8, 2),
        (32, 64, 4, 2), (32, 64, 4, 5),
    )  # fmt: skip
    for bm, bn, warps, stages in quick + (more if mode == "full" else ()):
        out[f"bm{bm} bn{bn} w{warps} s{stages}"] = PrefillConfig(bm, bn, warps, stages)
    return out


def varlen_batch(
    ctx_lens: list[int], q_lens: list[int], heads: int, kv_heads: int
) -> dict[str, torch.Tensor]:
    """A mixed step's attention inputs: per-sequence contexts and new tokens, pages shuffled over the pool."""
    per_seq = [_cdiv(c, PAGE) for c in ctx_lens]
    perm = torch.randperm(sum(per_seq), device=DEV).to(torch.int32)
    bt = torch.zeros(len(ctx_lens), max(per_seq), dtype=torch.int32, device=DEV)
    used = 0
    for i, n in enumerate(per_seq):
        bt[i, :n] = perm[used : used + n]
        used += n
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device=DEV)
    return {
        "q": torch.randn(sum(q_lens), heads, 128, device=DEV, dtype=BF16),
        "k": torch.randn(sum(per_seq), PAGE, kv_heads, 128, device=DEV, dtype=BF16),
        "v": torch.randn(sum(per_seq), PAGE, kv_heads, 128, device=DEV, dtype=BF16),
        "cu": cu,
        "ctx": torch.tensor(ctx_lens, dtype=torch.int32, device=DEV),
        "bt": bt,
    }


def w1_step() -> tuple[list[int], list[int]]:
    """(context lens, new tokens) of a W1-like mixed step: prompt chunks, then 128 decode rows."""
    gen = torch.Generator().manual_seed(1)
    decode_ctx = torch.randint(150, 1500, (128,), generator=gen).tolist()
    return [*W1_CHUNKS, *decode_ctx], [*W1_CHUNKS, *([1] * 128)]


def prefill_cases(mode: str) -> list[tuple[str, dict[str, torch.Tensor], float, float]]:
    """(name, inputs, bytes, flops): 1 x q_len on ctx at Qwen3-8B heads, and W1's mixed step."""
    cases = []
    for ctx, q_len in PREFILL_SHAPES[mode]:
        b = paged_batch(1, ctx, q_len)
        cases.append((f"1x{q_len} on {ctx}", b, attn_bytes(1, ctx, q_len), attn_flops(1, ctx, q_len)))
    ctx_lens, q_lens = w1_step()
    heads, kv_heads = W1_HEADS
    keys = sum(sum(c - q + i + 1 for i in range(q)) for c, q in zip(ctx_lens, q_lens, strict=True))
    nbytes = sum(ctx_lens) * kv_heads * 128 * 4 + sum(q_lens) * heads * 128 * 4
    cases.append(("W1 mixed: 8 chunks + 128 decodes", varlen_batch(ctx_lens, q_lens, heads, kv_heads),
                  nbytes, 4.0 * heads * 128 * keys))  # fmt: skip
    return cases


def sweep_prefill(mode: str, replays: int, emit: Callable[[Row], None]) -> None:
    for shape, b, nbytes, flops in prefill_cases(mode):
        q_len = int((b["cu"][1:] - b["cu"][:-1]).max())
        if b["q"].shape[1] == 32:  # SDPA beside the Qwen3-8B shapes (causal only when q_len == ctx)
            ctx = int(b["ctx"][0])
            label = "torch SDPA causal" if q_len == ctx else "torch SDPA non-causal (upper bound)"
            emit(
                Row(
                    "prefill", shape, "bf16", label, sdpa_us(ctx, q_len, q_len == ctx, replays), nbytes, flops
                )
            )
        ref = reference(b, SCALE).float()
        for name, cfg in prefill_variants(mode).items():

            def call(cfg: PrefillConfig = cfg, n: int = q_len, x: dict = b) -> torch.Tensor:
                args = (x["q"], x["k"], x["v"], x["cu"], x["ctx"], x["bt"], SCALE)
                return paged_prefill_attention_triton(*args, max_q_len=n, config=cfg)

            try:
                err = float((call().float() - ref).abs().max())
                us, _ = measure([call], replays)
            except Exception as e:  # e.g. out of shared memory for a large tile: report, go on
                emit(Row("prefill", shape, "bf16", name, float("nan"), nbytes, flops, note=str(e)[:80]))
                continue
            emit(Row("prefill", shape, "bf16", name, us, nbytes, flops, max_err=err))


def fmt(r: Row) -> str:
    rate = f"{r.pct_bw():.0f}%" if r.part != "prefill" else f"{r.flops / (r.us * 1e-6) / 1e12:.0f} TFLOP/s"
    return (
        f"| {r.part} | {r.shape} | {r.kv} | {r.variant} | {r.us:.1f} | {rate} | {r.max_err:.2e} | {r.note} |"
    )


HEADER = (
    "| part | shape | kv | variant | µs | % of 4.25 TB/s or TFLOP/s | max_err | note |\n"
    "|---|---|---|---|---|---|---|---|"
)


def best_table(rows: list[Row]) -> str:
    """Per (part, shape, kv): the reference rows (default/SDPA/old) and the fastest variant."""
    lines = [HEADER]
    groups: dict[tuple[str, str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.part, r.shape, r.kv), []).append(r)
    for group in groups.values():
        fixed = [r for r in group if r.variant.startswith(("default", "torch", "old"))]
        fastest = sorted((r for r in group if r not in fixed and r.us == r.us), key=lambda r: r.us)[:1]
        lines += [fmt(r) for r in fixed + fastest]
    return "\n".join(lines)


def kv8_speedups(rows: list[Row]) -> str:
    """Per 8-bit shape and dtype: the default (operand bn128 w4 s2) and the fastest variant,
    as speed-up over the bf16 kernel of the same run and % of 4.25 TB/s on the bytes read."""
    lines = []
    base = {r.shape: r.us for r in rows if r.part == "kv8" and r.kv == "bf16"}
    for shape in base:
        for kv in KV8_DTYPES:
            group = [r for r in rows if r.part == "kv8" and r.shape == shape and r.kv == kv and r.us == r.us]
            if not group:
                continue
            picks = {"default": group[0], "best": min(group, key=lambda r: r.us)}
            cells = [
                f"{k} {r.us:.1f} µs = {base[shape] / r.us:.2f}x, {r.pct_bw():.0f}% ({r.variant})"
                for k, r in picks.items()
            ]
            lines.append(f"{shape} {kv} vs bf16 {base[shape]:.1f} µs: " + "; ".join(cells))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--parts", default="kv8,prefill,decode")
    parser.add_argument("--full", action="store_true", help="all shapes and variants (~10 min)")
    parser.add_argument("--replays", type=int, default=10)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    torch.manual_seed(0)
    rows: list[Row] = []
    start = time.time()

    def emit(r: Row) -> None:
        rows.append(r)
        print(fmt(r), f"[{time.time() - start:.0f}s]", flush=True)
        with open(os.path.join(args.out, "sweep.json"), "w") as f:
            json.dump({"commit": commit(), "rows": [asdict(x) for x in rows]}, f, indent=1)

    print(f"copy bandwidth {copy_bandwidth() / 1e12:.2f} TB/s; {torch.cuda.get_device_name()}\n{HEADER}")
    parts = {"kv8": sweep_kv8, "decode": sweep_decode, "prefill": sweep_prefill}
    for part in args.parts.split(","):
        parts[part]("full" if args.full else "quick", args.replays, emit)
    print("\nsummary (reference rows + the fastest variant per case):\n" + best_table(rows))
    if "kv8" in args.parts:
        print("\n8-bit decode speed-ups:\n" + kv8_speedups(rows))


if __name__ == "__main__":
    main()
