"""What the offsets of a GGUF Q4_1 / Q4_K grid kept under int4 cost on the GPU (quant/gguf_grid.py): the
integer GEMM as dispatched (group 32, whole zeros) alone, followed by add_offsets (x's group sums times
the offsets: torch, a sum and an addmm), by add_offsets_triton (one launch after the GEMM), and with the
offsets passed to the dispatch (what the engine runs: inside w4a16_gemm.cu where that takes the shape,
else add_offsets_triton), against bf16 cuBLAS, at SmolLM2-135M's layer shapes and Qwen3-8B's.

    source benchmarks/gpu_env.sh && cd benchmarks && python bench_gguf_grid.py

Times are CUDA-graph replays over weight copies past the L2 (bench_w4a16.graph_us / copies).
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from bench_w4a16 import copies, graph_us
from kvpilot.runtime.fixtures.gguf_grids import q4_1
from kvpilot.runtime.kernels.group_offsets_triton import add_offsets_triton
from kvpilot.runtime.kernels.split_k_triton import split_counters
from kvpilot.runtime.kernels.w4a16_triton import int_gemm
from kvpilot.runtime.quant.gguf_grid import recover_gguf_grid
from kvpilot.runtime.quant.int_weight import add_offsets, dense_weight

LAYERS = {
    "smollm2 qkv": (960, 576),
    "smollm2 o": (576, 576),
    "smollm2 gate_up": (3072, 576),
    "smollm2 down": (576, 1536),
    "qwen3-8b qkv": (6144, 4096),
    "qwen3-8b o": (4096, 4096),
    "qwen3-8b gate_up": (24576, 4096),
    "qwen3-8b down": (4096, 12288),
}
MS = (1, 16, 64)


def run(
    x: torch.Tensor,
    q: torch.Tensor,
    s: torch.Tensor,
    z: torch.Tensor,
    o: torch.Tensor | None,
    counters: torch.Tensor,
    fused: bool = True,
) -> torch.Tensor:
    """The int4 GEMM as IntWeightMethod dispatches it on a GPU, then the offsets when given (fused: the
    one-launch Triton kernel, else the torch reference)."""
    y = int_gemm(x, q, s, z, 4, None, counters)
    if o is None:
        return y
    return add_offsets_triton(y, x, o) if fused else add_offsets(y, x, o)


def bench_layer(name: str, n: int, k: int) -> None:
    grid = recover_gguf_grid(q4_1(n, k, seed=1).cuda(), 4, torch.bfloat16)
    assert grid is not None and grid.offsets is not None
    dense = dense_weight(grid).t().contiguous()  # [N, K] bf16
    counters = split_counters(n, torch.device("cuda"))
    w4 = copies((grid.qweight, grid.scales, grid.zeros, grid.offsets))
    w16 = copies((dense,))
    for m in MS:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        got, want = run(x, *w4[0], counters).float(), (x @ dense.t()).float()
        err = float((got - want).abs().amax() / want.abs().amax())
        t16 = graph_us(partial(F.linear, x), w16)
        t_plain = graph_us(lambda q, s, z, o: run(x, q, s, z, None, counters), w4)  # noqa: B023 (called now)
        t_off = graph_us(lambda q, s, z, o: run(x, q, s, z, o, counters, False), w4)  # noqa: B023
        t_one = graph_us(lambda q, s, z, o: run(x, q, s, z, o, counters), w4)  # noqa: B023
        t_in = graph_us(lambda q, s, z, o: int_gemm(x, q, s, z, 4, None, counters, offsets=o), w4)  # noqa: B023
        got = int_gemm(x, *w4[0][:3], 4, None, counters, offsets=w4[0][3]).float()
        err_in = float((got - want).abs().amax() / want.abs().amax())
        print(
            f"| {name} | {m} | {t16:.1f} | {t_plain:.1f} ({t16 / t_plain:.2f}×) | {t_off:.1f} "
            f"(+{t_off - t_plain:.1f}) | {t_one:.1f} (+{t_one - t_plain:.1f}, {t16 / t_one:.2f}×) "
            f"| {t_in:.1f} (+{t_in - t_plain:.1f}, {t16 / t_in:.2f}×) | {err:.1e} / {err_in:.1e} |"
        )


def main() -> None:
    print(torch.cuda.get_device_name())
    print(
        "| layer | M | bf16 µs | int4 g32, whole zeros | + add_offsets (torch) | + add_offsets_triton "
        "| offsets in the dispatch | err (Triton after / dispatch) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, (n, k) in LAYERS.items():
        bench_layer(name, n, k)


if __name__ == "__main__":
    main()
