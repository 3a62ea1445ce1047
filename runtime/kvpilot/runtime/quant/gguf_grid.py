"""16-bit weights already on a GGUF grid keep that grid under int4 / int8 at load.

A GGUF file's tensors are dequantized at load (gguf_model.py), so a model served from a GGUF file reaches
`--quantization int4` / `int8` as 16-bit weights that hold, per block of 32 inputs, one of
  Q4_0  w = d (q - 8), q in 0..15, d = (the block's weight of largest magnitude) / -8: exactly an int4
        group-32 weight of the canonical layout (scale |d|, zero 8; for d > 0 the values mirrored,
        q' = 15 - q, zero 7); Q5_0 likewise with q - 16, q in 0..31, as int8;
  Q4_1  w = d q + m, q in 0..15 spanning the block's [min, max] (ggml: d = (max - min) / 15, m = min): an
        int4 group-32 weight with scale d and the fractional zero point -m / d, kept as the nearest whole
        zero plus a per-group offset (quant/int_weight.py, from_affine);
  Q4_K  w = d sc q - dmin m per sub-block of 32 (6-bit sc and m under a 256-weight block's d and dmin):
        16 evenly spaced levels again, but q need not reach 0 or 15, so the block's [min, max] spans
        15, 14, ... steps; the most steps that put every weight on a level are taken (any such grid holds
        the weights exactly), then kept as Q4_1's is; Q5_1 and Q5_K likewise with 32 levels, as int8;
  Q8_0  w = d q, q in -127..127, d = (the block's largest magnitude) / 127: an int8 group-32 weight (zero
        128, as the canonical layout stores signed 8-bit values), where int8 at load would otherwise
        round again onto one scale per output channel.
  Q6_K  w = d sc (q - 32) per sub-block of 16 inputs, q in 0..63: two scales per 32 inputs, so no group-32
        grid holds it. llama.cpp's Q4_K_M / Q4_K_S files keep their most sensitive projections (attn_v, half
        of ffn_down) in Q6_K, so under int4 such a projection is held at 8 bits, rounded onto int8 groups of
        32 (off by at most an eighth of the coarser Q6_K step of the 32), not at 4: the file's mix
        (gguf_weight); under int8 likewise, in place of one scale per output channel.
(The 2- and 3-bit K types and the IQ types fit no group-32 grid: they are rounded again.)
Each is kept as such instead of being quantized a second time onto groups of 64 or 128 (SmolLM2-135M's
perplexity under int4: +30% under round-to-nearest, +0.000% with its Q4_1 grid kept; BENCHMARKS.md,
twentieth and twenty-first sessions).

A tensor counts as on a grid only if every weight lies within a tenth of a step of it (a bf16 copy of a
grid does; random weights pass one block with odds of about 0.2**30); anything else returns None.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from kvpilot.runtime.quant.int_weight import IntWeight, from_affine, quantize_rtn

GRID_GROUP = 32  # ggml's block of the legacy 4-bit types
KEPT_TYPES = {"int4": ("Q4_0", "Q4_1", "Q4_K"), "int8": ("Q8_0", "Q5_0", "Q5_1", "Q5_K")}
HELD_AT_8_BITS = ("Q6_K",)  # under int4 or int8: int8 groups of 32 (gguf_weight)
Q6_K_BLOCK = 16  # Q6_K's sub-block
TOLERANCE = 0.1  # of a step
PROBE_COLUMNS = 64  # a first slice of output channels rules most weights out cheaply


def recover_gguf_grid(weight: torch.Tensor, bits: int, dtype: torch.dtype) -> IntWeight | None:
    """W [N, K] on a GGUF grid of 32-input blocks that fits `bits` (4: Q4_0, Q4_1, Q4_K; 8: Q8_0, Q5_0, Q5_1,
    Q5_K) -> that grid as an int{bits} group-32 weight (scales in `dtype`); None when W is on none."""
    n, k = weight.shape
    if k % GRID_GROUP:
        return None
    for grid_values in _GRIDS[bits]:
        # the probe: no float32 copy of the whole weight for the usual 16-bit checkpoint
        if grid_values(_blocks(weight[:PROBE_COLUMNS]), dtype) is None:
            continue
        found = grid_values(_blocks(weight), dtype)
        if found is not None:
            q, scale, zero = found
            return from_affine(q.reshape(k, n).to(torch.int32), scale, zero, bits, dtype)
    return None


def gguf_weight(weight: torch.Tensor, method: str, dtype: torch.dtype) -> IntWeight | None:
    """What `--quantization method` (int4, int8) keeps of a weight W [N, K] from a GGUF: its own grid at
    method's bits, or a Q6_K weight at 8 bits in int8 groups of 32; None when it is neither."""
    bits = 4 if method == "int4" else 8
    found = recover_gguf_grid(weight, bits, dtype)
    if found is None and on_q6_k_grid(weight):  # int8: finer than one scale per output channel
        found = quantize_rtn(weight, 8, GRID_GROUP, sym=True)
    return found


def on_q6_k_grid(weight: torch.Tensor) -> bool:
    """Whether every 16-input sub-block of W [N, K] is d sc (q - 32), q in 0..63: Q6_K's grid."""
    if weight.shape[1] % Q6_K_BLOCK:
        return False
    for rows in (weight[:PROBE_COLUMNS], weight):
        blocks = rows.float().reshape(-1, Q6_K_BLOCK)
        if _fit_steps(blocks, blocks.abs().amax(dim=1), most=32, give_up=2) is None:
            return False
    return True


def grid_note(types: dict[str, int], method: str | None) -> str | None:
    """What to tell a user loading a GGUF whose projections are of `types` (ggml type -> tensors) under
    `--quantization method` (None: none): how to keep its grids, or which of them are held or rounded."""
    quantized = sorted(t for t in types if t not in ("F32", "F16", "BF16"))
    if not quantized:
        return None
    listed = ", ".join(f"{types[t]} {t}" for t in quantized)
    held = [t for t in quantized if t in HELD_AT_8_BITS]
    if method is None:
        for fit, kept in KEPT_TYPES.items():  # int4 only where it keeps one type at its bits
            if all(t in kept or t in held for t in quantized) and (
                fit == "int8" or len(held) < len(quantized)
            ):
                but = f" ({', '.join(held)} at 8 bits)" if held else ""
                return (
                    f"this GGUF's projections are {listed}: --quantization {fit} keeps them at their bits"
                    f"{but}; they now run dequantized to 16 bits"
                )
        return None
    kept = KEPT_TYPES.get(method, ())
    rounded = [t for t in quantized if t not in kept and t not in held]
    said = [f"the {', '.join(held)} ones are held at 8 bits (int8 groups of 32)"] if held else []
    if rounded:
        said.append(f"the {', '.join(rounded)} ones are rounded again (kept exactly: {', '.join(kept)})")
    if not said:
        return None
    return f"this GGUF's projections are {listed}; under --quantization {method} {'; '.join(said)}"


def _blocks(weight: torch.Tensor) -> torch.Tensor:
    """W [N, K] -> W^T by blocks, float32 [K / 32, 32, N]."""
    n, k = weight.shape
    return weight.float().t().reshape(k // GRID_GROUP, GRID_GROUP, n)


Grid = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # q [groups, 32, N], scale, zero [groups, N]


def _symmetric_values(w: torch.Tensor, dtype: torch.dtype, half: int, qmax: int) -> Grid | None:
    """The grid of Q4_0 (half 8) or Q5_0 (half 16) of w [groups, 32, N]: w = d (q - half), d = the signed
    weight of largest magnitude / -half; if every weight is on it and `dtype` holds the scales, else None."""
    extreme = w.gather(1, w.abs().argmax(dim=1, keepdim=True)).squeeze(1)  # signed: ggml's max
    scale = torch.where(extreme == 0, 1.0, extreme.abs() / half)  # an all-zero block: q = half, any scale
    # extreme > 0: d < 0, w = |d| (half - q) = |d| (q' - (half - 1)) with q' = 2 half - 1 - q
    zero = torch.where(extreme > 0, half - 1.0, float(half))
    return _on_grid(w, scale, zero, dtype, qmax)


def _affine_values(w: torch.Tensor, dtype: torch.dtype, most: int, qmax: int) -> Grid | None:
    """The grid of w [groups, 32, N] whose blocks each lie on most + 1 evenly spaced levels (16: Q4_1,
    Q4_K; 32: Q5_1, Q5_K), with a fractional zero, if every block does and `dtype` holds the scales; else
    None."""
    lo, hi = w.amin(dim=1), w.amax(dim=1)
    blocks = (w - lo.unsqueeze(1)).transpose(1, 2).reshape(-1, GRID_GROUP)  # [groups * N, 32], from 0
    span = (hi - lo).reshape(-1)
    steps = _fit_steps(blocks, span, most, give_up=1)  # Q4_1 and Q5_1 always span `most`
    if steps is None:
        return None
    scale = torch.where(span == 0, 1.0, span / steps).view_as(lo)
    return _on_grid(w, scale, -lo / scale, dtype, qmax)


def _fit_steps(blocks: torch.Tensor, span: torch.Tensor, most: int, give_up: int) -> torch.Tensor | None:
    """Per block of blocks [B, S] (values measured from 0), the most steps, `most` down to 1, that cut its
    span [B] into steps every value lies on; None if a block fits none, or none fits any of the first
    `give_up` counts (random weights: one pass). Most blocks fit at once: only the others are retried."""
    steps = torch.where(span == 0, float(most), 0.0)  # a constant block: any step
    for count in range(most, 0, -1):
        left = (steps == 0).nonzero().squeeze(1)
        if left.numel() == 0:
            return steps
        step = (span[left] / count).unsqueeze(1)
        on_levels = (blocks[left] - torch.round(blocks[left] / step) * step).abs().le(TOLERANCE * step)
        fits = on_levels.all(dim=1)
        steps[left[fits]] = float(count)
        if count == most - give_up + 1 and not bool((steps[span != 0] > 0).any()):
            return None
    return None if bool((steps == 0).any()) else steps


def _q8_0_values(w: torch.Tensor, dtype: torch.dtype, qmax: int = 255) -> Grid | None:
    """The Q8_0 grid of w [groups, 32, N] (q in -127..127, stored as q + 128) if every weight is on it and
    `dtype` holds the scales; else None."""
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax == 0, 1.0, amax / 127)
    return _on_grid(w, scale, torch.full_like(scale, 128.0), dtype, qmax)


def _on_grid(
    w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, dtype: torch.dtype, qmax: int
) -> Grid | None:
    """(q, scale, zero) if every weight of w is within TOLERANCE of a step of scale (q - zero), q in
    0..qmax, and `dtype` holds the scales; else None."""
    if not bool((scale.to(dtype) > 0).all()):
        return None
    s, z = scale.unsqueeze(1), zero.unsqueeze(1)
    q = torch.round(w / s + z).clamp(0, qmax)
    if not bool(((q - z) * s - w).abs().le(TOLERANCE * s).all()):
        return None
    return q, scale, zero


GridValues = Callable[[torch.Tensor, torch.dtype], Grid | None]
# bits -> the grids tried in order (whole zero points first: they need no offsets)
_GRIDS: dict[int, tuple[GridValues, ...]] = {
    4: (partial(_symmetric_values, half=8, qmax=15), partial(_affine_values, most=15, qmax=15)),
    8: (
        _q8_0_values,
        partial(_symmetric_values, half=16, qmax=255),
        partial(_affine_values, most=31, qmax=255),
    ),
}
