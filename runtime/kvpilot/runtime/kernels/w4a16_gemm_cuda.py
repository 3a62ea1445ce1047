"""Host side of w4a16_gemm.cu: the int4 / int8 weight-only GEMM on mma.sync (CUDA sm_80+, bf16; dispatched
on sm_90 at 5-384 tokens, from 3 below a long K, from 1 for groups of 32 or 64 rows and for int8, see
preferred), from 17 tokens on sm_90 on warpgroup mmas (WGMMA_FIRST_TOKEN_TILES), and at 9-16 tokens where
K slices are long or the output wide (sixteen_token_wgmma).

Compiled at run time by NVRTC (nvrtc.py), once per GemmSpec, launched on the current stream (CUDA-graph
capturable once compiled). The weight stays in the canonical layout of quant_reference.py, so every int4
and int8 format the loader reads runs here unchanged. On sm_90 a column block's K slices meet in a cluster's
shared memory; elsewhere a launch takes one slice. The Triton kernels (w4a16_mma_triton) stay the CPU path
and the fallback for what this one does not take (see unsupported). The launch rule is w4a16_gemm_plan.py.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

from .nvrtc import allow_cluster, allow_shared_memory, compile_cuda, launch_pdl, max_active_clusters
from .triton_utils import num_sms
from .w4a16_cuda import int_cuda_unsupported
from .w4a16_gemm_plan import (
    COLS_PER_WARP,
    SMALL_GROUPS,
    WARPS,
    WGMMA_FIRST_TOKEN_TILES,
    GemmLaunch,
    GemmSpec,
    launch_for,
    preferred,
)

SOURCE = Path(__file__).with_name("w4a16_gemm.cu")
BITS = (4, 8)  # the weight bits its builds take (BITS 8: w8a16_dequant.cuh)


def unsupported(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bits: int) -> str | None:
    """Why this kernel cannot run x [M, K] @ W^T (None: it can)."""
    cols = COLS_PER_WARP * WARPS
    return int_cuda_unsupported(x, qweight, scales, bits, cols, None, SMALL_GROUPS, BITS)


@functools.cache
def clusters_held(spec: GemmSpec, slices: int) -> int:
    """How many clusters of slices CTAs of this build the current GPU holds at once (memoized: it compiles
    the build, and the answer is the device's; a process serves on one kind of GPU)."""
    kernel, shared = compiled(spec), spec.shared_bytes()
    allow_shared_memory(kernel, shared)
    allow_cluster(kernel, slices)
    return max_active_clusters(kernel, (spec.warps * 32, 1, 1), shared, (1, slices, 1))


def takes(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    offsets: torch.Tensor | None = None,
    bits: int = 4,
) -> bool:
    """Whether the integer dispatch (w4a16_triton.int_gemm, w4a16_mma_triton.int_gemm_mma) sends x [M, K] @
    W^T (+ the offsets' term) here: it can, and is expected to be faster."""
    if unsupported(x, qweight, scales, bits) is not None:
        return False
    if offsets is not None and not (offsets.dtype == scales.dtype and offsets.shape == scales.shape):
        return False
    hopper = torch.cuda.get_device_capability(x.device) >= (9, 0)
    return preferred(x.shape[0], x.shape[1], hopper, x.shape[1] // scales.shape[0], bits)


def gemm_if_taken(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    bits: int,
    offsets: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """w4a16_gemm's x [M, K] @ W^T (+ the offsets' term) where the integer dispatch sends it here (int4 or
    int8, a CUDA x, takes), else None: w4a16_triton.int_gemm and w4a16_mma_triton.int_gemm_mma ask this
    first."""
    if bits not in BITS or not x.is_cuda or not takes(x, qweight, scales, offsets, bits):
        return None
    return w4a16_gemm(x, qweight, scales, zeros, num_sms(x.device), offsets=offsets)


def compiled(spec: GemmSpec) -> Any:
    """The loaded kernel for spec (nvrtc.compile_cuda: compiled on first use, memoized)."""
    return compile_cuda(SOURCE, "w4a16_gemm", tuple(spec.macros().items()), "90a" if spec.wgmma else None)


def w4a16_gemm(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    sms: int,
    plan: GemmLaunch | None = None,
    offsets: torch.Tensor | None = None,
) -> torch.Tensor:
    """x [M, K] bf16 @ W^T -> [M, N] bf16 (the caller checked unsupported(); qweight's rows say the bits:
    K / 8 for int4, K / 4 for int8); offsets bf16 [K/G, N]: added to each weight of their group and column.
    plan: the build and grid (None: launch_for's; benchmarks pass others)."""
    m, k = x.shape
    n, bits = qweight.shape[1], 32 * qweight.shape[0] // k
    capability = torch.cuda.get_device_capability(x.device)
    hopper = capability >= (9, 0)
    plan = plan or launch_for(
        m, n, k, k // scales.shape[0], sms, hopper, held=clusters_held if hopper else None,
        wgmma_from=WGMMA_FIRST_TOKEN_TILES if capability == (9, 0) else 0, offsets=offsets is not None,
        bits=bits,
    )  # fmt: skip
    if plan.spec.offsets != (offsets is not None) or plan.spec.bits != bits:
        raise ValueError(
            f"the build's offsets / bits ({plan.spec.offsets} / {plan.spec.bits}) and the call's"
            f" ({offsets is not None} / {bits}) do not agree"
        )
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    off = scales if offsets is None else offsets.contiguous()  # read with OFFSETS only
    args = [x, qweight, scales, zeros.contiguous(), off, y, m, n, k, x.stride(0), y.stride(0)]
    shared = plan.spec.shared_bytes()
    kernel = compiled(plan.spec)
    allow_shared_memory(kernel, shared)
    grid, block = plan.grid(n), (plan.spec.warps * 32, 1, 1)
    if hopper:  # PDL: its first weight tiles load while the predecessor drains
        cluster = (1, plan.slices, 1) if plan.spec.cluster_reduce else None
        allow_cluster(kernel, plan.slices)
        launch_pdl(kernel, grid, block, args, shared, cluster)
    else:
        kernel(grid=grid, block=block, args=args, shared_mem=shared)
    return y
