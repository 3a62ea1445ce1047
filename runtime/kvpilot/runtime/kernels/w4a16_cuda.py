"""Host side of w4a16_gemv.cu: the int4 weight-only GEMM for 1-16 tokens on mma.sync (CUDA sm_80+, bf16).

Compiled at run time by NVRTC (torch's `compile_kernel`), once per W4Spec (memoized), and launched on the
current stream (CUDA-graph capturable once compiled: the model's warm-up compiles it). The weight stays in
the canonical layout of quant_reference.py, so every int4 format the loader reads (AWQ, GPTQ, load-time
int4) runs here unchanged; the Triton kernels remain the CPU path and the fallback for what this one does
not take (see unsupported).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SOURCE = Path(__file__).with_name("w4a16_gemv.cu")
COLS = 64  # output columns per CTA
TILE = 128  # K rows per tile (quant_reference.pack_tile of every real layer)
MAX_M = 16
WARPS_PER_SM = 16  # the target: a CTA's warps split K until the GPU holds ~16 warps per SM


@dataclass(frozen=True)
class W4Spec:
    """The compile-time constants of one w4a16_gemv.cu build."""

    warps: int
    token_tiles: int  # 8 tokens each
    tiles_per_group: int

    def macros(self) -> dict[str, int]:
        return {"WARPS": self.warps, "NT": self.token_tiles, "TILES_PER_GROUP": self.tiles_per_group}


def unsupported(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bits: int) -> str | None:
    """Why this kernel cannot run x [M, K] @ W^T (None: it can)."""
    if x.device.type != "cuda" or torch.version.cuda is None:
        return "needs a CUDA device"
    if torch.cuda.get_device_capability(x.device) < (8, 0):
        return "needs sm_80+ (bf16 mma)"
    if bits != 4 or x.dtype != torch.bfloat16 or scales.dtype != torch.bfloat16:
        return f"{bits}-bit weights with {x.dtype} activations (int4 with bf16 only)"
    m, k = x.shape
    n = qweight.shape[1]
    group = k // scales.shape[0]
    if not 1 <= m <= MAX_M or k % TILE or n % COLS or group % TILE:
        return (
            f"M={m} (1..{MAX_M}), K={k} (a multiple of {TILE}), N={n} (of {COLS}), group {group} (of {TILE})"
        )
    if x.stride(1) != 1 or not (qweight.is_contiguous() and scales.is_contiguous()):
        return "x rows and the weight tensors must be contiguous"
    return None


def spec_for(m: int, n: int, k: int, group: int, sms: int) -> W4Spec:
    """Warps per CTA: enough that the N / 64 CTAs hold ~WARPS_PER_SM warps per SM (a power of two, 2..16,
    at most one per K tile); 16 tokens keep at most 8 (the shared partial sums stay within 32 KB)."""
    token_tiles = 1 if m <= 8 else 2
    ctas = n // COLS
    warps = 2
    while warps < 16 and ctas * warps * 2 <= WARPS_PER_SM * sms and warps * 2 <= k // TILE:
        warps *= 2
    return W4Spec(min(warps, 16 // token_tiles), token_tiles, group // TILE)


def _compile_fn() -> Any:
    fn = getattr(torch.cuda, "compile_kernel", None) or getattr(torch.cuda, "_compile_kernel", None)
    if fn is None:
        raise RuntimeError(f"torch {torch.__version__} has no torch.cuda.compile_kernel (NVRTC)")
    return fn


@functools.cache
def compiled(spec: W4Spec) -> Any:
    """The loaded kernel for spec (NVRTC compile on first use; memoized per process)."""
    options = [f"-D{name}={value}" for name, value in spec.macros().items()] + ["-std=c++17"]
    return _compile_fn()(SOURCE.read_text(), "w4a16_gemv", nvcc_options=options)


def w4a16_gemv(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, sms: int
) -> torch.Tensor:
    """x [M, K] bf16 @ W^T -> [M, N] bf16 (the caller checked unsupported())."""
    m, k = x.shape
    n = qweight.shape[1]
    spec = spec_for(m, n, k, k // scales.shape[0], sms)
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    args = [x, qweight, scales, zeros.contiguous(), y, m, n, k, x.stride(0), y.stride(0)]
    compiled(spec)(grid=(n // COLS, 1, 1), block=(spec.warps * 32, 1, 1), args=args)
    return y
