"""Load-time fp8 weights: one scale per output channel, chosen to minimise the row's rounding error.

e4m3 keeps 3 mantissa bits, so a row's error depends on where its values fall on the fp8 grid, and the
absmax scale (the row's largest value at 448) is only one choice. The scale here is the best of
SCALE_STEPS + 1 candidates from absmax / 448 shrunk by up to MIN_SHRINK (an MSE observer, no calibration
data; a shrink clips the few values past 448 to 448). On SmolLM2-135M, W8A8 perplexity against the same
dtype without quantization: float32 +2.74% (absmax) -> +1.57%, bfloat16 +2.57% -> +2.01%; the ranking of
near-equal candidates moves it by about ±0.4% (BENCHMARKS.md, eighth session).
"""

from __future__ import annotations

import torch
from kvpilot.runtime.kernels.quant_reference import FP8_MAX

SCALE_STEPS = 128
MIN_SHRINK = 0.5
CHUNK_ELEMENTS = 1 << 24  # rows searched together: bounds the float32 temporaries at ~64 MB each


def quantize_fp8_weight(
    weight: torch.Tensor, steps: int = SCALE_STEPS, min_shrink: float = MIN_SHRINK
) -> tuple[torch.Tensor, torch.Tensor]:
    """W [N, K] -> (float8_e4m3fn [N, K], float32 scales [N]) with each row's scale the candidate of least
    squared error (absmax / 448 included, so no row is worse than the absmax scale)."""
    w = weight.float()
    rows = max(1, CHUNK_ELEMENTS // max(1, w.shape[1]))
    parts = [_quantize_rows(w[i : i + rows], steps, min_shrink) for i in range(0, w.shape[0], rows)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def _quantize_rows(w: torch.Tensor, steps: int, min_shrink: float) -> tuple[torch.Tensor, torch.Tensor]:
    absmax = w.abs().amax(dim=1).clamp(min=1e-12) / FP8_MAX  # [R]
    best_scale, best_err = absmax, _rounding_error(w, absmax)
    for shrink in torch.linspace(min_shrink, 1.0, steps + 1)[:-1].tolist():
        scale = absmax * shrink
        err = _rounding_error(w, scale)
        better = err < best_err
        best_scale, best_err = torch.where(better, scale, best_scale), torch.where(better, err, best_err)
    return _to_fp8(w, best_scale), best_scale


def _to_fp8(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (w / scale.view(-1, 1)).clamp_(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def _rounding_error(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Σ_k (fp8(w / s) s − w)² per row, as s² Σ_k (fp8(y) − y)² with y = w / s: [R, K] -> [R]."""
    y = w / scale.view(-1, 1)
    q = y.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()
    return q.sub_(y).square_().sum(dim=1) * scale.square()
