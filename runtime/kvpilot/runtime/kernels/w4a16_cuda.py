"""Host side of w4a16_gemv.cu: the int4 weight-only GEMM for 1-16 tokens on mma.sync (CUDA sm_80+, bf16).

Compiled at run time by NVRTC (nvrtc.py), once per W4Spec, and launched on the
current stream (CUDA-graph capturable once compiled: the model's warm-up compiles it). Each warp holds its
weight tiles in a register ring; on sm_90 a column block's K slices may add up in a cluster
(dispatched_launch). The weight stays in the canonical layout of quant_reference.py, so every int4 format
the loader reads (AWQ, GPTQ, load-time int4) runs here unchanged, in groups of 128 rows or more (groups of
32 / 64 go to w4a16_gemm.cu from one token); the Triton kernels remain the CPU path and the fallback for what
this one does not take (see unsupported).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .nvrtc import compile_cuda, launch_pdl

SOURCE = Path(__file__).with_name("w4a16_gemv.cu")
COLS = 64  # output columns per CTA
TILE = 128  # K rows per tile (quant_reference.pack_tile of every real layer)
MAX_M = 16
WARPS = 4
STAGES = 2  # K tiles per warp in registers: 162 registers at sm_90, so 3 CTAs of 4 warps fit per SM
CTAS_PER_SM = 3.0  # K slices per column block until the GPU holds ~this many CTAs per SM
X_BYTES = 32768  # the kernel's shared memory for the staged x: 256 bytes per K tile and token
EARLY_RELEASE = True
MAX_CLUSTER = 8  # the portable cluster size


@dataclass(frozen=True)
class W4Spec:
    """The compile-time constants of one w4a16_gemv.cu build."""

    warps: int
    token_tiles: int  # 8 tokens each
    tiles_per_group: int
    stages: int = STAGES
    early_release: bool = EARLY_RELEASE
    min_ctas: int = 1  # the launch bound's CTAs per SM (4 caps a 4-warp CTA at 128 registers)
    cluster_reduce: bool = False  # sm_90: a column block's 2..8 K slices are one cluster

    def macros(self) -> dict[str, int]:
        return {
            "WARPS": self.warps,
            "NT": self.token_tiles,
            "TILES_PER_GROUP": self.tiles_per_group,
            "STAGES": self.stages,
            "EARLY_RELEASE": int(self.early_release),
            "MIN_CTAS": self.min_ctas,
            "CLUSTER_REDUCE": int(self.cluster_reduce),
        }


def max_tiles(m: int) -> int:
    """K tiles one CTA can stage x for at m tokens."""
    return X_BYTES // (256 * m)


@dataclass(frozen=True)
class W4Launch:
    """One GEMM's launch: the build and the K slices per column block (grid (N / 64, slices))."""

    spec: W4Spec
    slices: int


def unsupported(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bits: int) -> str | None:
    """Why this kernel cannot run x [M, K] @ W^T (None: it can)."""
    return int_cuda_unsupported(x, qweight, scales, bits, COLS, MAX_M)


def int_cuda_unsupported(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    bits: int,
    cols: int,
    max_m: int | None,
    small_groups: tuple[int, ...] = (),
    bits_taken: tuple[int, ...] = (4,),
) -> str | None:
    """Why an integer x bf16 mma.sync kernel of this folder (w4a16_gemv.cu, w4a16_gemm.cu) cannot run
    x [M, K] @ W^T, given the output columns its CTA takes, the most tokens it takes (None: any), the
    groups below a tile it takes (else groups are whole tiles) and the weight bits it takes."""
    if x.device.type != "cuda" or torch.version.cuda is None:
        return "needs a CUDA device"
    if torch.cuda.get_device_capability(x.device) < (8, 0):
        return "needs sm_80+ (bf16 mma, cp.async)"
    if bits not in bits_taken or x.dtype != torch.bfloat16 or scales.dtype != torch.bfloat16:
        taken = " or ".join(f"int{b}" for b in bits_taken)
        return f"{bits}-bit weights with {x.dtype} activations ({taken} with bf16 only)"
    m, k = x.shape
    shape = shape_unsupported(m, qweight.shape[1], k, k // scales.shape[0], cols, max_m, small_groups)
    if shape is not None:
        return shape
    if x.stride(1) != 1 or not (qweight.is_contiguous() and scales.is_contiguous()):
        return "x rows and the weight tensors must be contiguous"
    if x.data_ptr() % 16 or x.stride(0) % 8:
        return "x rows must start 16-byte aligned (they are copied in 16-byte loads)"
    return None


def shape_unsupported(
    m: int, n: int, k: int, group: int, cols: int, max_m: int | None, small_groups: tuple[int, ...] = ()
) -> str | None:
    """int_cuda_unsupported's shape rule alone (None: the kernel takes the shape)."""
    bad_group = group % TILE != 0 and group not in small_groups
    if m < 1 or (max_m is not None and m > max_m) or k % TILE or n % cols or bad_group:
        tokens = f"1..{max_m}" if max_m is not None else "1+"
        groups = f"of {TILE}" + "".join(f" or {g}" for g in small_groups)
        return f"M={m} ({tokens}), K={k} (a multiple of {TILE}), N={n} (of {cols}), group {group} ({groups})"
    return None


def cluster_fits(slices: int) -> bool:
    """Whether a column block's K slices can meet in one portable cluster."""
    return 1 < slices <= MAX_CLUSTER


def launch_for(
    m: int,
    n: int,
    k: int,
    group: int,
    sms: int,
    ctas_per_sm: float = CTAS_PER_SM,
    stages: int = STAGES,
    min_ctas: int = 1,
    clusters: bool = False,
) -> W4Launch:
    """4 warps per CTA; K cut into slices until the CTAs number ~CTAS_PER_SM per SM (never fewer slices
    than the staged x allows, never more than K's tiles). clusters (the GPU has them, sm_90): 2..8 slices
    meet in a cluster's shared memory, not through the workspace."""
    tiles, blocks = k // TILE, n // COLS
    slices = max(1, min(max(-(-tiles // max_tiles(m)), round(ctas_per_sm * sms / blocks)), tiles))
    spec = W4Spec(
        WARPS,
        1 if m <= 8 else 2,
        group // TILE,
        stages,
        min_ctas=min_ctas,
        cluster_reduce=clusters and cluster_fits(slices),
    )
    return W4Launch(spec, slices)


CLUSTER_MAX_M = 4
CLUSTER_MAX_SLICE_TILES = 8  # launch_for's slices no longer than this (qkv, o) take the clustered build
CLUSTER_CTAS_PER_SM = 2.0  # the clustered register build's K slices


def dispatched_launch(m: int, n: int, k: int, group: int, sms: int, hopper: bool) -> W4Launch:
    """The launch w4a16_gemv takes: on sm_90 at <= 4 tokens, where launch_for's slices are 2..8 of at
    most 8 tiles (Qwen3-8B's qkv and o), the register build with fewer slices (CLUSTER_CTAS_PER_SM) adding
    up in a cluster; otherwise launch_for's register build. H200, sixteenth session (x's tile sums from its
    staging): qkv 6.9 / 7.1 / 8.2 us at 1 / 2 / 4 tokens, o 5.3 / 5.7 / 6.6, against 7.1 / 7.7 / 8.7 and
    5.6 / 6.0 / 6.7 on the shared-ring build dispatched there before (removed since), and 9.0-11.0 with ~3
    CTAs per SM in the cluster; gate_up and down keep theirs (down clustered: 12.4 against 12.5 us, H100,
    seventeenth session)."""
    plan = launch_for(m, n, k, group, sms)
    slice_tiles = -(-(k // TILE) // plan.slices)
    fits = slice_tiles <= CLUSTER_MAX_SLICE_TILES and cluster_fits(plan.slices)
    if hopper and m <= CLUSTER_MAX_M and fits:
        clustered = launch_for(m, n, k, group, sms, CLUSTER_CTAS_PER_SM, clusters=True)
        if clustered.spec.cluster_reduce:
            return clustered
    return plan


PREFERRED_MAX_M = 8  # one token tile (162 registers); 16 tokens (218) lost to the Triton kernels everywhere


def preferred(m: int, n: int, k: int, group: int, sms: int) -> bool:
    """Whether this kernel is expected to beat the Triton ones at this shape (the H200 sweep,
    benchmarks/sweep_w4a16_cuda.py): at most 8 tokens, and a launch that fits in one wave of CTAS_PER_SM
    per SM. Its time is ~4.5-5.5 µs fixed plus the bytes at ~4.2 TB/s, and a second wave pays the fixed
    part again (gate_up at 8 tokens: the staged x forces 2 slices, 768 CTAs, 31.8 µs against Triton's
    30.0)."""
    if m > PREFERRED_MAX_M:
        return False
    return (n // COLS) * launch_for(m, n, k, group, sms).slices <= CTAS_PER_SM * sms


def compiled(spec: W4Spec) -> Any:
    """The loaded kernel for spec (nvrtc.compile_cuda: compiled on first use, memoized)."""
    return compile_cuda(SOURCE, "w4a16_gemv", tuple(spec.macros().items()))


def w4a16_gemv(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    sms: int,
    counters: torch.Tensor | None = None,
    plan: W4Launch | None = None,
) -> torch.Tensor:
    """x [M, K] bf16 @ W^T -> [M, N] bf16 (the caller checked unsupported()). counters: >= N / 64 zeroed
    int32 the launch leaves zero (split_k_triton.split_counters, the layer's own); None: fresh zeros.
    plan: the build and slicing (None: dispatched_launch's; benchmarks pass others)."""
    m, k = x.shape
    n = qweight.shape[1]
    hopper = torch.cuda.get_device_capability(x.device) >= (9, 0)
    plan = plan or dispatched_launch(m, n, k, k // scales.shape[0], sms, hopper)
    y = torch.empty(m, n, device=x.device, dtype=x.dtype)
    if plan.slices > 1 and not plan.spec.cluster_reduce:
        workspace = torch.empty(plan.slices, m, n, device=x.device, dtype=torch.float32)
        if counters is None or counters.numel() < n // COLS:
            counters = torch.zeros(n // COLS, device=x.device, dtype=torch.int32)
    else:
        workspace = counters = y  # unused
    args = [x, qweight, scales, zeros.contiguous(), y, workspace, counters, m, n, k, x.stride(0), y.stride(0)]
    kernel = compiled(plan.spec)  # its shared memory is static (the staged x, then the partial sums)
    grid, block = (n // COLS, plan.slices, 1), (plan.spec.warps * 32, 1, 1)
    if hopper:  # PDL: its first weight tiles load while the predecessor drains
        cluster = (1, plan.slices, 1) if plan.spec.cluster_reduce else None
        launch_pdl(kernel, grid, block, args, 0, cluster)
    else:
        kernel(grid=grid, block=block, args=args, shared_mem=0)
    return y
