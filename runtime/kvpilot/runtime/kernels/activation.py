"""SiLU-and-multiply: the gated MLP activation of Llama/Qwen."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """x: [num_tokens, 2 * intermediate] (gate then up) -> [num_tokens, intermediate]."""
    gate, up = x.chunk(2, dim=-1)
    return (F.silu(gate.float()) * up.float()).to(x.dtype)
