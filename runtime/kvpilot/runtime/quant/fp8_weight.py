"""Load-time fp8 weights: one scale per output channel, chosen to minimise the row's rounding error.

e4m3 keeps 3 mantissa bits, so a row's error depends on where its values fall on the fp8 grid, and the
absmax scale (the row's largest value at 448) is only one choice. The scale here is the best of absmax / 448
and SCALE_STEPS shrinks of it down to MIN_SHRINK (an MSE observer, no calibration data; a shrink clips the
few values past 448 to 448; ties keep the earlier candidate, absmax first). On SmolLM2-135M, W8A8
perplexity against the same dtype without quantization: float32 +2.74% (absmax) -> ~+1.6%, bfloat16 +2.57%
-> ~+2.0%; the ranking of near-equal candidates moves it by about ±0.4% (BENCHMARKS.md, eighth session).
On a GPU one Triton launch scores every candidate (kernels/fp8_scale_search_triton.py).
"""

from __future__ import annotations

import torch
from kvpilot.runtime.kernels.quant_reference import FP8_MAX

SCALE_STEPS = 128
MIN_SHRINK = 0.5
CHUNK_ELEMENTS = 1 << 24  # CPU: rows scored together, bounding the float32 temporaries at ~64 MB each


def candidate_scales(absmax_scale: torch.Tensor, steps: int, min_shrink: float) -> torch.Tensor:
    """[N] absmax / 448 -> float32 [steps + 1, N]: row 0 the absmax scale, then the shrinks ascending."""
    shrinks = torch.cat([torch.ones(1), torch.linspace(min_shrink, 1.0, steps + 1)[:-1]])
    return shrinks.to(absmax_scale.device)[:, None] * absmax_scale[None, :]


def candidate_errors_ref(w: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """w [N, K], scales [C, N] -> float32 [C, N]: Σ_k (fp8(w / s) s − w)², computed as s² Σ_k (fp8(y) − y)²
    with y = w / s, in row chunks."""
    w = w.float()
    rows = max(1, CHUNK_ELEMENTS // max(1, w.shape[1]))
    err = torch.empty(scales.shape, dtype=torch.float32, device=w.device)
    for i in range(0, w.shape[0], rows):
        part = w[i : i + rows]
        for c in range(scales.shape[0]):
            s = scales[c, i : i + rows].view(-1, 1)
            y = part / s
            q = y.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()
            err[c, i : i + rows] = q.sub_(y).square_().sum(dim=1) * s.view(-1).square()
    return err


def quantize_fp8_weight(
    weight: torch.Tensor, steps: int = SCALE_STEPS, min_shrink: float = MIN_SHRINK
) -> tuple[torch.Tensor, torch.Tensor]:
    """W [N, K] -> (float8_e4m3fn [N, K], float32 scales [N]) with each row's scale the candidate of least
    squared rounding error (absmax / 448 among them, so no row is worse than with the absmax scale)."""
    # The candidates are made on the CPU, so a GPU picks the scales the CPU measurements picked: CUDA
    # divides by a scalar through its reciprocal, one bit off the CPU's quotient in half the rows.
    absmax = weight.float().abs().amax(dim=1).clamp(min=1e-12).cpu() / FP8_MAX
    scales = candidate_scales(absmax, steps, min_shrink).to(weight.device)
    if weight.is_cuda:
        from kvpilot.runtime.kernels.fp8_scale_search_triton import candidate_errors_triton

        dense = weight if weight.stride(-1) == 1 else weight.contiguous()
        err = candidate_errors_triton(dense, scales)
    else:
        err = candidate_errors_ref(weight, scales)
    scale = scales.gather(0, err.argmin(dim=0, keepdim=True)).squeeze(0)
    values = (weight.float() / scale.view(-1, 1)).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return values, scale
