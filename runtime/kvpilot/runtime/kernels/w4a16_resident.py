"""Host side of w4a16_resident.cu: the int4 GEMV whose CTAs hold their columns' whole weight in shared memory.

One CTA per SM at most, each <= half an SM's shared memory, so the next launch's grid is resident beside this
one's and streams its weight while this one waits for x and computes (PDL, released at entry). It takes the
shapes where the weight of one launch fits in half of the GPU's shared memory (Qwen3-8B's qkv and o, not
gate_up or down) and few tokens (the staged x shares the CTA's half). Compiled at run time by NVRTC, once
per ResidentSpec; the weight stays in the canonical layout of quant_reference.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .nvrtc import allow_shared_memory, compile_cuda, launch_pdl
from .w4a16_cuda import int_cuda_unsupported

SOURCE = Path(__file__).with_name("w4a16_resident.cu")
TILE = 128  # K rows per tile
BLOCK_COLS = 16  # output columns per mma block
WARPS = 8
MAX_M = 16
SM_SHARED = 228 * 1024  # an sm_90 SM's shared memory; each resident CTA also reserves 1 KB
RESIDENT = 2  # grids resident at once: this launch's and the next one's


@dataclass(frozen=True)
class ResidentSpec:
    """The compile-time constants of one w4a16_resident.cu build."""

    blocks: int  # the most 16-column mma blocks a CTA takes
    token_tiles: int  # 8 tokens each
    tiles_per_group: int
    warps: int = WARPS

    def macros(self) -> dict[str, int]:
        return {"BLOCKS": self.blocks, "NT": self.token_tiles, "TILES_PER_GROUP": self.tiles_per_group,
                "WARPS": self.warps}  # fmt: skip

    def shared_bytes(self, m: int, k: int, group: int) -> int:
        """Dynamic shared memory of one CTA: its words, scales and zeros, the staged x and its tile sums, or
        at the end the warps' sums (fp32 [warps][m][cols]) over them, whichever is larger (a short K)."""
        cols = BLOCK_COLS * self.blocks
        inputs = k // 8 * cols * 4 + 2 * (k // group) * cols * 2 + (256 + 8) * m * (k // TILE)
        return max(inputs, self.warps * m * cols * 4)


def grid_ctas(n: int, sms: int) -> int:
    """CTAs of a launch: one per SM, or one per block where the blocks are fewer. Each CTA takes
    n / 16 / CTAs blocks, rounded either way."""
    return min(sms, n // BLOCK_COLS)


def resident_spec(m: int, n: int, k: int, group: int, sms: int) -> ResidentSpec | None:
    """The build for x [m, k] @ W^T (W [n, k], int4, group), or None where the grid's weight does not fit
    RESIDENT grids to an SM."""
    if m > MAX_M or n % BLOCK_COLS or k % TILE or group % TILE:
        return None
    blocks = -(-(n // BLOCK_COLS) // grid_ctas(n, sms))
    spec = ResidentSpec(blocks, 1 if m <= 8 else 2, group // TILE)
    return spec if RESIDENT * (spec.shared_bytes(m, k, group) + 1024) <= SM_SHARED else None


def compiled(spec: ResidentSpec) -> Any:
    """The loaded kernel for spec (nvrtc.compile_cuda: compiled on first use, memoized)."""
    return compile_cuda(SOURCE, "w4a16_resident", tuple(spec.macros().items()))


def unsupported(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bits: int) -> str | None:
    """Why this kernel cannot run x [M, K] @ W^T (None: it can)."""
    why = int_cuda_unsupported(x, qweight, scales, bits, BLOCK_COLS, MAX_M)
    if why is not None:
        return why
    if torch.cuda.get_device_capability(x.device) < (9, 0):
        return "needs sm_90 (two CTAs of up to 113 KB of shared memory per SM)"
    m, k = x.shape
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    if resident_spec(m, qweight.shape[1], k, k // scales.shape[0], sms) is None:
        return f"{qweight.shape[1]} x {k} at {m} tokens does not fit half the GPU's shared memory"
    return None


DISPATCH_MAX_M = 2  # H200: o at 2 tokens 5.7 µs against the cluster GEMV's 5.9, at 4 tokens 6.7 against 6.5
# Off: alone it is the faster int4 GEMV at 1-2 tokens (the fifteenth session's H200 sweep,
# benchmarks/sweep_w4a16_resident.py: qkv at 1 token 6.2-6.4 µs against 7.1, o 5.0-5.3 against 5.6), but W3
# int4 got slower with it dispatched: 2.477 ms a token against 2.382 (2.424 with o alone, 2.448 with qkv
# alone). Likely cause (not measured): its 113 KB CTAs need a shared-memory carveout no other kernel of the
# decode step asks for, and the tenth session saw such a switch between kernels cost W3 2%.
DISPATCHED = False


def takes(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bits: int) -> bool:
    """Whether int_gemm runs x @ W^T here: DISPATCHED, it can, and at most DISPATCH_MAX_M tokens."""
    return DISPATCHED and x.shape[0] <= DISPATCH_MAX_M and unsupported(x, qweight, scales, bits) is None


def w4a16_resident(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    sms: int,
    kernel: Any = None,
    spec: ResidentSpec | None = None,
) -> torch.Tensor:
    """x [M, K] bf16 @ W^T -> [M, N] bf16 (the caller checked unsupported()). kernel, spec: a build to
    launch in place of compiled(resident_spec(...)) (the benchmarks' variants)."""
    m, k = x.shape
    n = qweight.shape[1]
    group = k // scales.shape[0]
    spec = spec or resident_spec(m, n, k, group, sms)
    if spec is None:
        raise ValueError(f"w4a16_resident does not take M={m}, N={n}, K={k}, group {group}")
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    kernel, shared = kernel or compiled(spec), spec.shared_bytes(m, k, group)
    allow_shared_memory(kernel, shared)
    args = [x, qweight, scales, zeros.contiguous(), y, m, n, k, x.stride(0), y.stride(0)]
    launch_pdl(kernel, (grid_ctas(n, sms), 1, 1), (spec.warps * 32, 1, 1), args, shared)
    return y
