"""Rotary position embedding: the cos/sin cache (with Llama 3 / linear frequency scaling) and the layer."""

from __future__ import annotations

import math
from typing import Any

import torch
from kvpilot.runtime.kernels.rotary import apply_rotary_ref
from kvpilot.runtime.layers.backend import lazy_op, pick_op
from torch import nn

_APPLY_ROTARY = {
    "torch": apply_rotary_ref,
    "cpu": apply_rotary_ref,  # the model's rotary runs inside qkv_prepare
    "triton": lazy_op("kvpilot.runtime.kernels.rotary_triton", "apply_rotary_triton"),
}


def rope_inv_freq(
    head_dim: int, theta: float, scaling: dict[str, Any] | None, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2], float32, computed as transformers computes them."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    rope_type = (scaling or {}).get("rope_type", "default")
    if rope_type == "linear":
        return inv_freq / float(scaling["factor"])  # type: ignore[index]
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)  # type: ignore[arg-type]
    return inv_freq


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1: long wavelengths slowed by `factor`, short ones kept, the band between interpolated."""
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_context = float(scaling["original_max_position_embeddings"])
    low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin_cache(
    head_dim: int,
    max_positions: int,
    theta: float,
    scaling: dict[str, Any] | None,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """[max_positions, head_dim] float32: cos of each frequency in the first half, sin in the second."""
    inv_freq = rope_inv_freq(head_dim, theta, scaling, device)
    positions = torch.arange(max_positions, dtype=torch.int64, device=device).float()
    freqs = torch.outer(positions, inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


class RotaryEmbedding(nn.Module):
    """Applies rotary embedding to q and k by position. The cache is a plain tensor built on `device`
    (not a buffer), so materialising a meta-built model leaves it intact."""

    def __init__(
        self,
        head_dim: int,
        max_positions: int,
        theta: float,
        scaling: dict[str, Any] | None,
        *,
        device: torch.device | str = "cpu",
        backend: str = "torch",
    ) -> None:
        super().__init__()
        self.cos_sin_cache = rope_cos_sin_cache(head_dim, max_positions, theta, scaling, device)
        self._op = pick_op(_APPLY_ROTARY, backend, "apply_rotary")

    def forward(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [T]; q [T, H, D]; k [T, KVH, D]."""
        return self._op(positions, q, k, self.cos_sin_cache)
