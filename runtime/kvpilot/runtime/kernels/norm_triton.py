"""Triton RMSNorm, optionally fused with the residual add before it (rms_norm_ref's contract).

One program per token row: load x (and residual), add in fp32, round the sum to the activation dtype (the
reference adds in that dtype), write it as the new residual, then normalise the rounded sum in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_utils import next_power_of_2, pdl_launch, pdl_supported, require_same_device

# Release the next kernel at entry instead of after the norm: a GEMV after it (the int4 CUDA GEMV loads its
# first weight tiles before it waits) then starts while the GEMV before the norm drains. H200, W3 (with
# SILU_RELEASE_EARLY): int4 decode steps 2.66-2.67 -> 2.59-2.60 ms (two same-call pairs), bf16 and fp8
# unchanged. (The decode attention kernels keep their late release: released early, back-to-back decodes
# got slower in the sixth session.)
NORM_RELEASE_EARLY = True


@triton.jit
def _rms_norm_kernel(
    x_ptr,  # [num_rows, hidden]
    residual_ptr,  # [num_rows, hidden] (read when HAS_RESIDUAL)
    weight_ptr,  # [hidden]
    out_ptr,  # [num_rows, hidden]
    residual_out_ptr,  # [num_rows, hidden]: x + residual (written when HAS_RESIDUAL)
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    hidden,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = False,  # programmatic dependent launch (triton_utils.pdl_supported)
    RELEASE_EARLY: tl.constexpr = False,  # PDL: release the next kernel at entry (NORM_RELEASE_EARLY)
):
    if PDL and RELEASE_EARLY:
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    w = tl.load(weight_ptr + offs, mask=mask, other=0.0).to(tl.float32)  # a weight: no wait for it
    if PDL:  # x and the residual come from the kernel before
        tl.extra.cuda.gdc_wait()
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(residual_ptr + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * stride_ro + offs, x, mask=mask)
    xf = x.to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(xf * xf, 0) / hidden + eps)
    if PDL and not RELEASE_EARLY:  # late, so that the next kernel's waiting programs hold no slots long
        tl.extra.cuda.gdc_launch_dependents()
    tl.store(out_ptr + row * stride_o + offs, (xf * inv_rms * w).to(out_ptr.dtype.element_ty), mask=mask)


def _rows(name: str, t: torch.Tensor, hidden: int) -> torch.Tensor:
    """[..., hidden] -> [rows, hidden] with a dense last dim (a view when the layout allows it)."""
    if t.shape[-1] != hidden:
        raise ValueError(f"{name} last dim must be {hidden}, got {tuple(t.shape)}")
    t2 = t.reshape(-1, hidden)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def rms_norm_triton(
    x: torch.Tensor,  # [num_tokens, hidden] (any leading dims)
    weight: torch.Tensor,  # [hidden]
    eps: float,
    residual: torch.Tensor | None = None,  # like x
    pdl: bool = True,  # programmatic dependent launch where the GPU has it
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Without residual: returns norm(x). With residual: r = x + residual; returns (norm(r), r)."""
    hidden = x.shape[-1]
    if weight.shape != (hidden,):
        raise ValueError(f"weight must be [{hidden}], got {tuple(weight.shape)}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(
            f"residual must match x {tuple(x.shape)} {x.dtype}, got {tuple(residual.shape)} {residual.dtype}"
        )
    require_same_device(x=x, weight=weight, **({} if residual is None else {"residual": residual}))
    x2 = _rows("x", x, hidden)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out2 = out.view(-1, hidden)
    r2 = x2 if residual is None else _rows("residual", residual, hidden)
    r_out = out if residual is None else torch.empty_like(out)
    ro2 = r_out.view(-1, hidden)
    block = next_power_of_2(hidden)
    pdl = pdl and pdl_supported(x.device)
    if x2.shape[0] > 0:
        _rms_norm_kernel[(x2.shape[0],)](
            x2,
            r2,
            weight,
            out2,
            ro2,
            x2.stride(0),
            r2.stride(0),
            out2.stride(0),
            ro2.stride(0),
            hidden,
            eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK=block,
            PDL=pdl,
            RELEASE_EARLY=NORM_RELEASE_EARLY,
            num_warps=min(16, max(1, block // 512)),
            **pdl_launch(pdl),
        )
    return out if residual is None else (out, r_out)
