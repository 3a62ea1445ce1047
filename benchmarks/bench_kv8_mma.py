"""The mma.sync decode kernel for 8-bit pages (kv8_decode.cu, DecodeConfig.mma) beside the bf16 kernel and
the 8-bit Triton default, same run (issue 13's 64 x 4k row first).

    source benchmarks/gpu_env.sh && python benchmarks/bench_kv8_mma.py [--variants w4 w2 ...] [--quick]

Qwen3-8B heads (32 q / 8 KV, head_dim 128, page 16), pages shuffled over the pool; CUDA-graph medians; %BW
counts the bytes actually read (1-byte values + fp32 per-token-head scales + q + out) against 4.25 TB/s.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch
from bench_kernels import KV8_DTYPES, attn_bytes, bench_decode
from kvpilot.runtime.kernels.decode_plan import MmaPath, default_decode_config
from kvpilot.runtime.kernels.kv8_decode_cuda import CudaDecodeSpec, compiled
from kvpilot.runtime.kernels.nvrtc import num_registers

FLOOR_BW = 4.25e12
VARIANTS = {
    "w4": MmaPath(warps=4),
    "w4np": MmaPath(warps=4, prefetch=False),
    "w2": MmaPath(warps=2),
    "w2np": MmaPath(warps=2, prefetch=False),
    "w1np": MmaPath(warps=1, prefetch=False),
    "w8np": MmaPath(warps=8, prefetch=False),
    "w4np-mb4": MmaPath(warps=4, prefetch=False, min_blocks=4),
    "w8np-mb2": MmaPath(warps=8, prefetch=False, min_blocks=2),
}
CASES = ((64, 4096), (256, 1024), (16, 8192), (32, 512), (1, 4096))


def _regs(kv: str, mma: MmaPath) -> int:
    spec = CudaDecodeSpec(128, 4, 8, 16, int8=kv == "int8", bf16=True, split=False, warps=mma.warps,
                          min_blocks=mma.min_blocks, prefetch=mma.prefetch)  # fmt: skip
    return num_registers(compiled(spec))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--variants", nargs="*", default=[])
    parser.add_argument("--cases", nargs="*", default=[f"{b}x{c}" for b, c in CASES])
    parser.add_argument("--replays", type=int, default=20)
    args = parser.parse_args()
    rows = []
    for case in args.cases:
        batch, ctx = (int(x) for x in case.split("x"))
        base = bench_decode(batch, ctx, args.replays, kv="bf16")
        rows.append((case, "bf16 triton", base.us, 1.0, base.tbps, base.ok, ""))
        for kv in ("fp8", "int8"):
            cfg = default_decode_config(KV8_DTYPES[kv])
            nbytes = attn_bytes(batch, ctx, 1, KV8_DTYPES[kv])
            r = bench_decode(batch, ctx, args.replays, config=replace(cfg, mma=None), kv=kv)
            rows.append((case, f"{kv} triton", r.us, base.us / r.us, nbytes / r.us / 1e6, r.ok, r.note))
            r = bench_decode(batch, ctx, args.replays, config=cfg, kv=kv)
            rows.append((case, f"{kv} default (mma)", r.us, base.us / r.us, nbytes / r.us / 1e6, r.ok, ""))
            for name in args.variants:
                mma = VARIANTS[name]
                r = bench_decode(batch, ctx, args.replays, config=replace(cfg, mma=mma), kv=kv)
                regs = f"{_regs(kv, mma)} regs"
                rows.append((case, f"{kv} mma {name}", r.us, base.us / r.us, nbytes / r.us / 1e6, r.ok, regs))
            print("\n".join(_fmt(row) for row in rows[-len(args.variants) - 2 :]), flush=True)
    print("\n| case | kernel | µs | speed-up vs bf16 | % of 4.25 TB/s | ok | note |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(_fmt(row) for row in rows))


def _fmt(row: tuple) -> str:
    case, name, us, speedup, tbps, ok, note = row
    pct = 100 * tbps * 1e12 / FLOOR_BW
    return f"| {case} | {name} | {us:.1f} | {speedup:.2f}x | {pct:.0f}% | {ok} | {note} |"


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
