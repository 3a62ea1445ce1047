"""Triton SiLU-and-multiply: out = silu(gate) * up for x = [gate | up] along the last dim."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_utils import pdl_launch, pdl_supported, require_last_dim_contiguous

_BLOCK = 1024
SILU_RELEASE_EARLY = True  # PDL: release the next kernel at entry (see norm_triton.NORM_RELEASE_EARLY)


@triton.jit
def _silu_and_mul_kernel(
    x_ptr,  # [num_rows, 2 * inter]: gate in the first half, up in the second
    out_ptr,  # [num_rows, inter]
    stride_x,
    stride_o,
    inter,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,  # programmatic dependent launch (triton_utils.pdl_supported)
    RELEASE_EARLY: tl.constexpr = False,  # PDL: release the next kernel at entry (SILU_RELEASE_EARLY)
):
    if PDL and RELEASE_EARLY:
        tl.extra.cuda.gdc_launch_dependents()
    if PDL:  # [gate | up] comes from the kernel before
        tl.extra.cuda.gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < inter
    gate = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + offs, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    if PDL and not RELEASE_EARLY:
        tl.extra.cuda.gdc_launch_dependents()
    tl.store(out_ptr + row * stride_o + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_triton(x: torch.Tensor, pdl: bool = True) -> torch.Tensor:
    """x: [num_tokens, 2 * intermediate] (gate then up) -> [num_tokens, intermediate]."""
    if x.shape[-1] % 2:
        raise ValueError(f"last dim must be even (gate | up), got {tuple(x.shape)}")
    inter = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * inter)
    require_last_dim_contiguous("x", x2)
    out = torch.empty(*x.shape[:-1], inter, dtype=x.dtype, device=x.device)
    out2 = out.view(-1, inter)
    if x2.shape[0] > 0 and inter > 0:
        grid = (x2.shape[0], triton.cdiv(inter, _BLOCK))
        pdl = pdl and pdl_supported(x.device)
        args = (x2, out2, x2.stride(0), out2.stride(0), inter)
        _silu_and_mul_kernel[grid](
            *args, BLOCK=_BLOCK, PDL=pdl, RELEASE_EARLY=SILU_RELEASE_EARLY, num_warps=4, **pdl_launch(pdl)
        )
    return out
