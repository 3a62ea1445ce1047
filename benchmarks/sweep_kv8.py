"""Sweep the 8-bit KV decode attention paths on the GPU in one short call (issue 13), one row each.

    source benchmarks/gpu_env.sh && python benchmarks/sweep_kv8.py [--budget 80]

Qwen3-8B heads (32 q / 8 KV, head_dim 128, page 16), equal contexts, pages shuffled over the pool. Each
8-bit row sits beside the bf16 kernel of the same shape in the same run: µs (CUDA-graph median), speed-up
over bf16, % of 4.25 TB/s counted on the bytes actually read (1-byte values + the fp32 per-token-head
scales + q + out), max_err = max |out - reference on the dequantized cache| (the precision a path costs
beyond the cache's own). Rows print as they finish; variants stop when the time budget runs out.

The fastest exact and fastest overall 8-bit variants and the default are timed twice more at 64x4k
(rows "(repeat)") for the spread. Diagnostics (the kv8 kernel's bench-only Kv8Path.diag, outputs
meaningless): "load" reads the tiles and scales and folds them with xor/add (the memory-only time of
this access pattern), "convert" also widens them to fp16 (no dots); the full kernel adds the dots and
the softmax.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch
from bench_kernels import (
    COPY_BW,
    KV8_DTYPES,
    KVH,
    attn_bytes,
    copy_bandwidth,
    num_sets,
    paged_batch,
    reference,
    time_graph,
)
from kvpilot.runtime.kernels.decode_attention_triton import (
    DecodeConfig,
    DecodePlan,
    default_decode_config,
    paged_decode_attention_triton,
    plan_decode,
)
from kvpilot.runtime.kernels.kv8_path import Kv8Path
from kvpilot.runtime.kernels.triton_utils import num_sms

SCALE = 128**-0.5
Variant = tuple[DecodeConfig | None, DecodePlan | None]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _split(ctx: int, splits: int, bn: int) -> DecodePlan:
    return DecodePlan(splits, _cdiv(_cdiv(ctx, splits), bn) * bn)


def variants(ctx: int, breadth: bool) -> dict[str, Variant]:
    """The 8-bit rows of one shape: the legacy kernel, the diagnostics, the kv8 kernel's paths.

    Round 1 (commit 81c6e1a) found the kv8 kernel's loads not overlapped with its dots below 5 stages
    (Triton waits for a tile's copies at the top of the iteration after issuing them at the end of the
    previous one); these rows are its 5-stage configurations."""
    legacy = replace(default_decode_config(torch.int8), kv8=None, block_n=128, num_stages=2)
    s5 = replace(legacy, block_n=64, num_stages=5)

    def kv8(bn: int = 64, warps: int = 4, stages: int = 5, **path: object) -> DecodeConfig:
        return replace(s5, block_n=bn, num_warps=warps, num_stages=stages, kv8=Kv8Path(**path))  # type: ignore[arg-type]

    out: dict[str, Variant] = {"legacy kernel bn128 w4 s2 (shipped before)": (legacy, None)}
    out["default"] = (None, None)
    if breadth:
        out["swap native bn64 s5"] = (kv8(swap=True, qk="native"), None)
        out["m16 widen bn64 s5"] = (kv8(), None)
        return out
    rows = {  # in order of priority (a spent time budget cuts the tail); cvt "auto": bias int8, ptx e4m3
        "diag load bn64 s5": kv8(diag="load"),
        "swap widen bn64 s5": kv8(swap=True),
        "swap native bn64 s5": kv8(swap=True, qk="native"),
        "m16 widen bn64 s5": kv8(),
        "m16 native bn64 s5": kv8(qk="native"),
        "m16 widen bn32 s5": kv8(bn=32),
        "m16 native bn32 s5": kv8(bn=32, qk="native"),
        "swap widen bn128 s5": kv8(bn=128, swap=True),
        "swap native bn128 s5": kv8(bn=128, swap=True, qk="native"),
        "swap native bn128 w8 s5": kv8(bn=128, warps=8, swap=True, qk="native"),
        "diag convert bn64 s5": kv8(diag="convert"),
        "swap widen ptx bn64 s5": kv8(swap=True, cvt="ptx"),
        "swap widen bias bn64 s5": kv8(swap=True, cvt="bias"),
        "swap native bn64 s4 (no overlap)": kv8(stages=4, swap=True, qk="native"),
    }
    out |= {name: (cfg, None) for name, cfg in rows.items()}
    for splits in (2, 3):
        out[f"swap widen bn64 s5, {splits} splits"] = (kv8(swap=True), _split(ctx, splits, 64))
        out[f"swap native bn64 s5, {splits} splits"] = (kv8(swap=True, qk="native"), _split(ctx, splits, 64))
        out[f"m16 widen bn64 s5, {splits} splits"] = (kv8(), _split(ctx, splits, 64))
    return out


def call(b: dict[str, torch.Tensor], cfg: DecodeConfig | None, plan: DecodePlan | None):
    return lambda: paged_decode_attention_triton(
        b["q"], b["k"], b["v"], b["ctx"], b["bt"], SCALE, config=cfg, plan=plan, k_scale=b.get("ks"),
        v_scale=b.get("vs"),
    )  # fmt: skip


def run_shape(batch: int, ctx: int, breadth: bool, replays: int, deadline: float, repeats: int = 0) -> None:
    """bf16, then each variant for fp8 and int8 in turn (so a spent budget cuts both alike); then the
    fastest exact (qk widen) and the fastest variant per 8-bit type again, `repeats` times (the spread)."""
    shape = f"{batch}x{ctx}"
    sets = [paged_batch(batch, ctx, 1) for _ in range(num_sets(attn_bytes(batch, ctx, 1)))]
    bf16_us = time_graph([call(b, None, None) for b in sets], replays)
    err = (call(sets[0], None, None)().float() - reference(sets[0], SCALE).float()).abs().max()
    row(shape, "bf16", "default", bf16_us, bf16_us, attn_bytes(batch, ctx, 1), float(err), "")
    del sets
    sms = num_sms(torch.device("cuda"))
    data = {}
    for kv, dtype in KV8_DTYPES.items():
        nbytes = attn_bytes(batch, ctx, 1, dtype)
        sets = [paged_batch(batch, ctx, 1, dtype) for _ in range(num_sets(nbytes))]
        data[kv] = (sets, reference(sets[0], SCALE).float(), nbytes)
    table = variants(ctx, breadth)
    done: dict[str, list[tuple[float, str]]] = {kv: [] for kv in data}
    for name, (cfg, plan) in table.items():
        if time.time() > deadline:
            print(f"| {shape} | | (time budget spent: the remaining variants are skipped) |")
            break
        for kv, (sets, ref, nbytes) in data.items():
            chosen = plan or plan_decode(batch, KVH, ctx, sms, cfg or default_decode_config(KV8_DTYPES[kv]))
            try:
                err = float((call(sets[0], cfg, plan)().float() - ref).abs().max())
                us = time_graph([call(b, cfg, plan) for b in sets], replays)
            except Exception as e:  # a variant that does not compile (e.g. shared memory): report, go on
                row(
                    shape,
                    kv,
                    name,
                    float("nan"),
                    bf16_us,
                    nbytes,
                    float("nan"),
                    str(e)[-60:].replace("\n", " "),
                )
                continue
            row(shape, kv, name, us, bf16_us, nbytes, err, f"splits {chosen.num_splits}")
            if not name.startswith(("diag", "legacy")):
                done[kv].append((us, name))
    for kv, (sets, _, nbytes) in data.items():
        exact = [r for r in done[kv] if "native" not in r[1]]
        picks = {name for _, name in sorted(exact)[:1] + sorted(done[kv])[:1] + [(0.0, "default")]}
        for name in sorted(picks) * repeats:
            cfg, plan = table[name]
            us = time_graph([call(b, cfg, plan) for b in sets], replays)
            row(shape, kv, f"{name} (repeat)", us, bf16_us, nbytes, float("nan"), "")


def row(
    shape: str, kv: str, name: str, us: float, bf16_us: float, nbytes: float, err: float, note: str
) -> None:
    pct = 100 * nbytes / (us * 1e-6) / COPY_BW
    print(
        f"| {shape} | {kv} | {name} | {us:.1f} | {bf16_us / us:.2f}x | {pct:.0f}% | {err:.1e} | {note} |",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=70.0, help="seconds before variants are skipped")
    parser.add_argument("--replays", type=int, default=5)
    args = parser.parse_args()
    start = time.time()
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}; copy bandwidth now {copy_bandwidth() / 1e12:.2f} TB/s")
    print("| shape | kv | variant | µs | vs bf16 | % of 4.25 TB/s | max_err | note |")
    print("|---|---|---|---|---|---|---|---|")
    deadline = start + args.budget
    run_shape(64, 4096, False, args.replays, deadline - 20, repeats=2)  # the target; time left for breadth
    for batch, ctx in ((16, 8192), (32, 512)):
        run_shape(batch, ctx, True, args.replays, deadline)
    print(f"total {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
