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


def _kv8(bn: int = 128, warps: int = 4, stages: int = 2, **path: object) -> DecodeConfig:
    # 8-bit plans (short splits), every plan at this tile shape
    base = replace(default_decode_config(torch.float8_e4m3fn), kv8=None, single_pass=None)
    return replace(base, block_n=bn, num_warps=warps, num_stages=stages, kv8=Kv8Path(**path))  # type: ignore[arg-type]


LEGACY = replace(
    default_decode_config(torch.float8_e4m3fn), kv8=None, block_n=128, num_stages=2, single_pass=None
)


def round1(ctx: int) -> dict[str, Variant]:
    """Commit 81c6e1a: diagnostics, the widenings, native QK, swapped dots, tiles, splits (2 stages)."""
    rows = {
        "diag load": _kv8(diag="load"),
        "diag convert ptx": _kv8(diag="convert", cvt="ptx"),
        "ptx": _kv8(cvt="ptx"),
        "bias native swap": _kv8(cvt="bias", qk="native", swap=True),
        "ptx swap": _kv8(cvt="ptx", swap=True),
        "bias swap": _kv8(cvt="bias", swap=True),
        "ptx native swap": _kv8(cvt="ptx", qk="native", swap=True),
        "bias": _kv8(cvt="bias"),
        "cast": _kv8(cvt="cast"),
        "ptx native": _kv8(cvt="ptx", qk="native"),
        "diag convert bias": _kv8(diag="convert", cvt="bias"),
    }
    out = {f"{name} bn128 w4 s2": (cfg, None) for name, cfg in rows.items()}
    for splits in (2, 4):
        out[f"bias native swap, {splits} splits"] = (rows["bias native swap"], _split(ctx, splits, 128))
    for bn, warps, stages in ((64, 4, 2), (128, 4, 3), (128, 8, 2), (256, 4, 2), (128, 4, 4)):
        cfg = _kv8(bn, warps, stages, cvt="bias", qk="native", swap=True)
        out[f"bias native swap bn{bn} w{warps} s{stages}"] = (cfg, None)
    return out


def round2(ctx: int) -> dict[str, Variant]:
    """Commit d719aff: 5 stages (where Triton first keeps a tile's copies in flight during the dots)."""
    rows = {
        "diag load bn64 s5": _kv8(64, 4, 5, diag="load"),
        "swap widen bn64 s5": _kv8(64, 4, 5, swap=True),
        "swap native bn64 s5": _kv8(64, 4, 5, swap=True, qk="native"),
        "m16 widen bn64 s5": _kv8(64, 4, 5),
        "m16 native bn64 s5": _kv8(64, 4, 5, qk="native"),
        "m16 native bn32 s5": _kv8(32, 4, 5, qk="native"),
        "swap widen bn128 s5": _kv8(128, 4, 5, swap=True),
        "swap native bn128 s5": _kv8(128, 4, 5, swap=True, qk="native"),
        "diag convert bn64 s5": _kv8(64, 4, 5, diag="convert"),
        "swap native bn64 s4": _kv8(64, 4, 4, swap=True, qk="native"),
    }
    out = {name: (cfg, None) for name, cfg in rows.items()}
    out["swap native bn64 s5, 2 splits"] = (rows["swap native bn64 s5"], _split(ctx, 2, 64))
    return out


def final(ctx: int) -> dict[str, Variant]:
    """The defaults against the kernel they replace and the fastest native e4m3 path (not shipped)."""
    return {
        "default": (None, None),
        "int8 default path: m16 native ptx bn128 s2": (_kv8(cvt="ptx", qk="native"), None),
        "bias native swap bn128 s3": (_kv8(stages=3, cvt="bias", qk="native", swap=True), None),
    }


def w2(ctx: int) -> dict[str, Variant]:
    """W2's decode shapes (256 sequences of 100-1,280 positions, single pass): the exact e4m3 paths (the
    fp8 cache's W2 row was 0.99x bf16) and the tile shapes of the shared kernel."""
    shared = replace(default_decode_config(torch.float8_e4m3fn), kv8=None, single_pass=None)
    out: dict[str, Variant] = {
        f"shared bn{bn} w{w} s{st}": (replace(shared, block_n=bn, num_warps=w, num_stages=st), None)
        for bn, w, st in ((64, 4, 2), (64, 4, 3), (128, 4, 3), (128, 8, 2), (64, 2, 2), (32, 4, 3))
    }
    for cvt in ("ptx", "bias"):
        out[f"kv8 {cvt} bn128 s2"] = (_kv8(cvt=cvt), None)
        out[f"kv8 {cvt} bn64 s3"] = (_kv8(64, 4, 3, cvt=cvt), None)
        out[f"kv8 {cvt} prefetch bn64 s1"] = (_kv8(64, 4, 1, cvt=cvt, prefetch=True), None)
    return out


def warps(ctx: int) -> dict[str, Variant]:
    """The fastest W2 shape of the w2 set (the shared kernel, 64 positions per tile, 2 warps: 1.08-1.09x
    bf16 for e4m3 at 256 x 512/1024 where the default was 0.97-0.99x) and its neighbours, across plans."""
    shared = replace(default_decode_config(torch.float8_e4m3fn), kv8=None, single_pass=None)
    out: dict[str, Variant] = {
        f"shared bn{bn} w{w} s{st}": (replace(shared, block_n=bn, num_warps=w, num_stages=st), None)
        for bn, w, st in ((64, 2, 2), (64, 2, 3), (128, 2, 2), (32, 2, 2), (32, 1, 2), (64, 1, 2))
    }
    out["shared bn32 w1 s3"] = (replace(shared, block_n=32, num_warps=1, num_stages=3), None)
    out["kv8 ptx native bn64 w2 s2 (int8's path)"] = (_kv8(64, 2, 2, cvt="ptx", qk="native"), None)
    out["kv8 ptx native bn128 w2 s2 (int8's path)"] = (_kv8(128, 2, 2, cvt="ptx", qk="native"), None)
    return out


SETS = {"round1": round1, "round2": round2, "final": final, "w2": w2, "warps": warps}


def variants(ctx: int, breadth: bool, which: str = "final") -> dict[str, Variant]:
    """The 8-bit rows of one shape: the shared (legacy) kernel, the default, then the set's variants."""
    out: dict[str, Variant] = {"shared kernel bn128 w4 s2 (the 8-bit default before)": (LEGACY, None)}
    out["default"] = (None, None)
    table = final(ctx) if breadth else SETS[which](ctx)
    return out | {name: v for name, v in table.items() if not (breadth and "swap" in name)}


def call(b: dict[str, torch.Tensor], cfg: DecodeConfig | None, plan: DecodePlan | None):
    return lambda: paged_decode_attention_triton(
        b["q"], b["k"], b["v"], b["ctx"], b["bt"], SCALE, config=cfg, plan=plan, k_scale=b.get("ks"),
        v_scale=b.get("vs"),
    )  # fmt: skip


def run_shape(batch: int, ctx: int, which: str, replays: int, deadline: float, repeats: int = 0) -> None:
    """bf16, then each variant for fp8 and int8 in turn (so a spent budget cuts both alike); then every
    non-diagnostic variant again, `repeats` times (the spread)."""
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
    table = variants(ctx, which == "breadth", which)
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
                note = str(e)[-60:].replace("\n", " ")
                row(shape, kv, name, float("nan"), bf16_us, nbytes, float("nan"), note)
                continue
            row(shape, kv, name, us, bf16_us, nbytes, err, f"splits {chosen.num_splits}")
    for name in [n for n in table if not n.startswith("diag")] * repeats:
        cfg, plan = table[name]
        for kv, (sets, _, nbytes) in data.items():
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
    parser.add_argument("--set", default="final", choices=sorted(SETS), help="the 64x4k variants")
    parser.add_argument("--repeats", type=int, default=2, help="64x4k re-timings of every variant")
    parser.add_argument("--budget", type=float, default=70.0, help="seconds before variants are skipped")
    parser.add_argument("--replays", type=int, default=5)
    parser.add_argument("--shapes", default="", help="only these BATCHxCONTEXT shapes, defaults only")
    args = parser.parse_args()
    start = time.time()
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}; copy bandwidth now {copy_bandwidth() / 1e12:.2f} TB/s")
    print("| shape | kv | variant | µs | vs bf16 | % of 4.25 TB/s | max_err | note |")
    print("|---|---|---|---|---|---|---|---|")
    deadline = start + args.budget
    if args.shapes:
        for shape in args.shapes.split(","):
            batch, ctx = (int(x) for x in shape.split("x"))
            run_shape(batch, ctx, "breadth" if args.set == "final" else args.set, args.replays, deadline)
        return
    run_shape(
        64, 4096, args.set, args.replays, deadline - 20, args.repeats
    )  # the target; time left for breadth
    for batch, ctx in ((16, 8192), (32, 512)):
        run_shape(batch, ctx, "breadth", args.replays, deadline)
    print(f"total {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
