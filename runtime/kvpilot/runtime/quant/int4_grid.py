"""16-bit weights already on a GGUF Q4_0 grid keep that grid under int4 at load.

A GGUF file's tensors are dequantized at load (gguf_model.py), so a model served from a Q4_0 file reaches
`--quantization int4` as 16-bit weights holding, per block of 32 inputs, w = d (q - 8) with q in 0..15 and
d = (the block's weight of largest magnitude) / -8. That is exactly an int4 group-32 weight of the canonical
layout (scale |d|, zero 8; for d > 0 the values mirrored, q' = 15 - q, zero 7), so it is kept as such
instead of being quantized a second time onto groups of 64 or 128.

Q4_1 (w = d q + m, the built-in SmolLM2's type) would need the zero point -m / d, a fraction, which the GPU
kernels do not take (quant/int_weight.py: zeros are whole numbers), so Q4_1 weights go through
round-to-nearest (BENCHMARKS.md, twentieth session, has the perplexities of both ways).

A tensor counts as on the grid only if every weight lies within a tenth of a step of it (a bf16 copy of a
grid does; random weights pass one block with odds of about 0.2**30); anything else returns None.
"""

from __future__ import annotations

import torch
from kvpilot.runtime.quant.int_weight import IntWeight, from_unpacked

GRID_GROUP = 32  # ggml's block of the legacy 4-bit types
TOLERANCE = 0.1  # of a step
PROBE_COLUMNS = 256  # a first slice of output channels rules most weights out cheaply


def recover_q4_0_grid(weight: torch.Tensor, dtype: torch.dtype) -> IntWeight | None:
    """W [N, K] on a Q4_0 grid of 32-input blocks -> that grid as an int4 group-32 weight (scales in
    `dtype`); None when W is not on such a grid."""
    n, k = weight.shape
    if k % GRID_GROUP or _grid_values(_blocks(weight[:PROBE_COLUMNS]), dtype) is None:
        return None  # the probe: no float32 copy of the whole weight for the usual 16-bit checkpoint
    found = _grid_values(_blocks(weight), dtype)
    if found is None:
        return None
    q, scale, zero = found
    return from_unpacked(q.reshape(k, n).to(torch.int32), scale, zero, 4, dtype)


def _blocks(weight: torch.Tensor) -> torch.Tensor:
    """W [N, K] -> W^T by blocks, float32 [K / 32, 32, N]."""
    n, k = weight.shape
    return weight.float().t().reshape(k // GRID_GROUP, GRID_GROUP, n)


def _grid_values(
    w: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(q [groups, 32, N], scale, zero [groups, N]) if every weight of w [groups, 32, N] is within TOLERANCE
    of a step of its block's Q4_0 grid and `dtype` holds the scales; else None."""
    extreme = w.gather(1, w.abs().argmax(dim=1, keepdim=True)).squeeze(1)  # signed: ggml's max
    scale = torch.where(extreme == 0, 1.0, extreme.abs() / 8)  # an all-zero block: q = 8, any scale
    zero = torch.where(extreme > 0, 7.0, 8.0)  # extreme > 0: d < 0, w = |d| (8 - q) = |d| (q' - 7)
    if not bool((scale.to(dtype) > 0).all()):
        return None
    s, z = scale.unsqueeze(1), zero.unsqueeze(1)
    q = torch.round(w / s + z).clamp(0, 15)
    if not bool(((q - z) * s - w).abs().le(TOLERANCE * s).all()):
        return None
    return q, scale, zero
