"""Does this torch build's torch._scaled_mm take DeepSeek-style block scales (activations per token and 128
inputs, weights per 128 x 128 block) on this GPU, and how fast is it against the weight-only Triton GEMM
(kernels/fp8_block_gemm_triton.py) and bf16 cuBLAS at prefill sizes? A probe: prints one row per (layer,
M), or the error _scaled_mm raised.

    source benchmarks/gpu_env.sh && cd benchmarks && python probe_fp8_block_scaled_mm.py
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from bench_w4a16 import LAYERS, copies, graph_us
from kvpilot.runtime.kernels.fp8_block_gemm_triton import fp8_block_gemm
from kvpilot.runtime.kernels.quant_reference import FP8_MAX, dequantize_fp8_blocks_ref
from kvpilot.runtime.quant.fp8_block import quantize_fp8_blocks

GROUP = 128


def quantize_groups(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (fp8 [M, K], float32 scales [M, K / 128] with strides (1, M): the layout cuBLASLt's
    1 x 128 block scaling asks of the first operand)."""
    m, k = x.shape
    groups = x.float().view(m, k // GROUP, GROUP)
    scale = (groups.abs().amax(-1) / FP8_MAX).clamp(min=1e-12)
    q = (groups / scale[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(m, k)
    column_major = torch.empty(k // GROUP, m, device=x.device).t()
    column_major.copy_(scale)
    return q, column_major


def probe_row(w: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, m: int) -> str:
    """bf16, the Triton GEMM and block-scaled _scaled_mm at m tokens for one layer's weight."""
    k = w.shape[1]
    x = (0.1 * torch.randn(m, k, device="cuda")).bfloat16()
    bf16 = graph_us(lambda wt: F.linear(x, wt), copies((w.bfloat16(),)))
    triton = graph_us(lambda wq, ws: fp8_block_gemm(x, wq, ws, (GROUP, GROUP)), copies((q, scale)))
    xq, sx = quantize_groups(x)

    def scaled_mm(wq: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(xq, wq.t(), scale_a=sx, scale_b=ws.t(), out_dtype=torch.bfloat16)

    try:
        y = scaled_mm(q, scale)
        w_deq = dequantize_fp8_blocks_ref(q, scale, (GROUP, GROUP))
        want = (xq.float() * sx.repeat_interleave(GROUP, dim=1)) @ w_deq.t()
        err = float((y.float() - want).norm() / want.norm())
        mm = graph_us(scaled_mm, copies((q, scale)))
        cell = f"{mm:.1f} ({bf16 / mm:.2f}×, {err:.0e})"
    except (RuntimeError, ValueError, TypeError) as exc:
        cell = f"refused: {str(exc).splitlines()[0][:120]}"
    return f"{bf16:.1f} | {triton:.1f} ({bf16 / triton:.2f}×) | {cell}"


def main() -> int:
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    print("| layer | M | bf16 µs | Triton W8A16 µs (×bf16) | _scaled_mm block W8A8 µs (×bf16, err) |")
    print("|---|---|---|---|---|")
    for name, (n, k) in LAYERS.items():
        w = 0.02 * torch.randn(n, k, device="cuda")
        q, scale = quantize_fp8_blocks(w, GROUP, GROUP)  # scale [N / 128, K / 128]
        for m in (64, 256, 1024, 4096):
            print(f"| {name} | {m} | {probe_row(w, q, scale, m)} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
