"""One decode token's GEMMs of Qwen3-8B at batch 1: 36 layers of (RMSNorm + residual -> QKV, a stand-in
for attention, O, RMSNorm + residual -> gate/up, SiLU-and-mul -> down) in one CUDA graph, with the real
data flow between them, as the engine replays them. Compares:

  unfused     rms_norm_triton / silu_and_mul_triton + cuBLAS (F.linear), as before the fused GEMVs
  model       the "triton" kernel set's dispatch (kernels/gemv_dispatch.py): three GEMVs with the norm /
              activation fused, a GEMV for O, launched with programmatic dependent launch (USE_PDL)
  no-pdl      the same without programmatic dependent launch (GemvBf16Config.pdl = False)
Measured (H200, 2026-12-01, 13.89 GB of weights, floor 3.269 ms): unfused 4.056 ms/token, fused GEMVs
3.643 ms without PDL, 3.585 ms with it.

    source benchmarks/gpu_env.sh && python benchmarks/bench_gemv_chain.py

The stand-in for attention is one copy kernel (q out of qkv), launched normally: it ends any PDL overlap
as the real attention kernels would. Prints ms per token of the chain, its weight bytes over the time,
and each variant's output error against the unfused chain after the graph replays (PDL must not race).
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import time
from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F
from kvpilot.runtime.kernels.activation_triton import silu_and_mul_triton
from kvpilot.runtime.kernels.gemv_dispatch import dispatch_config
from kvpilot.runtime.kernels.gemv_triton import GemvBf16Config, gemv_bf16, norm_gemv_bf16, silu_gemv_bf16
from kvpilot.runtime.kernels.norm_triton import rms_norm_triton

LAYERS, HIDDEN, QKV, INTER, Q = 36, 4096, 6144, 12288, 4096
EPS = 1e-6
BF16 = torch.bfloat16
Layer = dict[str, torch.Tensor]
LayerFn = Callable[[torch.Tensor, torch.Tensor, Layer], tuple[torch.Tensor, torch.Tensor]]


def make_layers(n: int) -> list[Layer]:
    def w(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, device="cuda", dtype=BF16) * cols**-0.5

    return [
        {
            "qkv": w(QKV, HIDDEN),
            "o": w(HIDDEN, Q),
            "gate_up": w(2 * INTER, HIDDEN),
            "down": w(HIDDEN, INTER),
            "nw1": 1 + 0.1 * torch.randn(HIDDEN, device="cuda", dtype=BF16),
            "nw2": 1 + 0.1 * torch.randn(HIDDEN, device="cuda", dtype=BF16),
        }
        for _ in range(n)
    ]


def unfused(h: torch.Tensor, r: torch.Tensor, p: Layer) -> tuple[torch.Tensor, torch.Tensor]:
    x, r = rms_norm_triton(h, p["nw1"], EPS, r)
    a = F.linear(x, p["qkv"])[:, :Q].contiguous()  # the attention stand-in
    x, r = rms_norm_triton(F.linear(a, p["o"]), p["nw2"], EPS, r)
    return F.linear(silu_and_mul_triton(F.linear(x, p["gate_up"])), p["down"]), r


def fused(pdl: bool | None) -> LayerFn:
    def layer(h: torch.Tensor, r: torch.Tensor, p: Layer) -> tuple[torch.Tensor, torch.Tensor]:
        def cfg(kind: str, w: torch.Tensor) -> GemvBf16Config:
            cfg = dispatch_config(kind, 1, w)
            return cfg if pdl is None else replace(cfg, pdl=pdl)

        qkv, r = norm_gemv_bf16(h, r, p["nw1"], EPS, p["qkv"], cfg("norm", p["qkv"]))
        o = gemv_bf16(qkv[:, :Q].contiguous(), p["o"], cfg("plain", p["o"]))
        gu, r = norm_gemv_bf16(o, r, p["nw2"], EPS, p["gate_up"], cfg("norm", p["gate_up"]))
        return silu_gemv_bf16(gu, p["down"], cfg("silu", p["down"])), r

    return layer


VARIANTS = {"unfused": unfused, "model": fused(None), "no-pdl": fused(False)}


def forward(layer_fn: LayerFn, layers: list[Layer], h: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    for p in layers:
        h, r = layer_fn(h, r, p)
    return h + r


def _warm(name: str) -> str:
    """Worker: run one layer of a variant so that Triton compiles into the on-disk cache."""
    torch.manual_seed(0)
    layers = make_layers(1)
    h, r = torch.randn(2, 1, HIDDEN, device="cuda", dtype=BF16)
    try:
        forward(VARIANTS[name], layers, h, r)
        torch.cuda.synchronize()
        return f"{name} ok"
    except Exception as e:  # reported again by the timing process
        return f"{name} failed: {e!r}"[:200]


def time_graph(fn: Callable[[], torch.Tensor], replays: int = 7) -> tuple[float, torch.Tensor]:
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), out


def main() -> int:
    t0 = time.monotonic()
    with mp.get_context("spawn").Pool(len(VARIANTS)) as pool:
        print("# warm-up:", "; ".join(pool.map(_warm, list(VARIANTS))), f"({time.monotonic() - t0:.1f}s)")
    torch.manual_seed(0)
    layers = make_layers(LAYERS)
    nbytes = sum(p[k].numel() * 2 for p in layers for k in ("qkv", "o", "gate_up", "down"))
    h, r = torch.randn(2, 1, HIDDEN, device="cuda", dtype=BF16)
    ref = None
    for name, fn in VARIANTS.items():
        try:
            ms, out = time_graph(lambda fn=fn: forward(fn, layers, h, r))
        except Exception as e:
            print(f"{name:10} failed: {e!r}"[:300], flush=True)
            continue
        ref = out.clone() if ref is None else ref
        err = float((out.float() - ref.float()).norm() / ref.float().norm())
        tbps = nbytes / (ms * 1e-3) / 1e12
        print(
            f"{name:10} {ms:.3f} ms/token ({LAYERS} layers' GEMMs) {tbps:.2f} TB/s | err vs unfused {err:.1e}"
        )
    floor_ms = nbytes / 4.25e12 * 1e3
    print(
        f"# weights {nbytes / 1e9:.2f} GB, floor {floor_ms:.3f} ms at 4.25 TB/s; {time.monotonic() - t0:.1f}s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
