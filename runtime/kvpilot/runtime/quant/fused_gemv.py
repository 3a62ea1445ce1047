"""Batch-1 decode GEMVs of the quantized weight formats with the op before the projection fused in (the
bf16 counterpart: kernels/gemv_dispatch.py; quant/fp8_method.py calls these):

  norm  h = hidden + residual, RMSNorm(h) * w -> GEMV (qkv, gate_up); h returned for the next residual
  silu  silu(gate) * up -> GEMV (down)

  fp8   the weight-only GEMV's one-warp multiply-add path (kernels/fp8_gemv_triton.py), with
        programmatic dependent launch on sm_90+ (gemv_dispatch.pdl_enabled).
  int   none: int4 / int8 had norm and SiLU prologues on the tensor-core GEMV's dot path; they lost (below)
        and were removed (2026-12-01, fifth session); int_linear takes explicit launch shapes (sweeps).
Which fuse by default: what beat the separate ops on the H200 (benchmarks/bench_gemv_chain.py: 36
layers' GEMMs of Qwen3-8B at batch 1 in one CUDA graph, ms/token, 2026-12-01, one run each):

  fp8   unfused 2.384 | silu fused 2.326 | norm fused 2.435 | both 2.465 (2.513 without PDL)
  int4  unfused 2.413 | qkv norm fused 2.762 | + gate_up norm on the dot GEMV, not the mma 3.813 |
        + silu 4.062
  int8  unfused 3.138 | norms fused 3.852 | + silu 5.030
So only fp8's silu fuses (FUSE_*); the int prologues are gone. W3 (`python -m kvpilot.runtime.bench
--workloads W3`) was measured once, with an earlier choice of switches (fp8 norm and silu fused; int4
qkv's norm fused): fp8 3.29 ms/token (3.3 before), int4 3.68 (3.4 before), as the chain predicts.
Why the others lose: the fp8 norm adds the residual add, the sum of squares and the norm weight to every
lane's 16 x values per step in a kernel already near its issue rate; the int dot GEMV pads the token to 16
rows, so a prologue on x's tile costs 16 times its work (silu: sigmoids on the padded tile), and the norm as
two dots with the norm weight on W's rows still costs a second dot, a multiply per weight value and a pass
over the row for the sum of squares. With these switches off the layer runs the separate ops, exactly as
before.

Each entry returns None where it does not fuse (a switch off, M != FUSED_M, no GPU, a layout the kernel
does not take); the layer then runs the separate ops. A config passed in overrides the switches (the
benchmark's sweeps, the tests).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from kvpilot.runtime.kernels.fp8_gemv_triton import default_fp8_gemv_config, norm_fp8_gemv, silu_fp8_gemv
from kvpilot.runtime.kernels.gemv_dispatch import pdl_enabled
from kvpilot.runtime.kernels.int_gemv_triton import GemvConfig, default_gemv_config, int_gemv
from kvpilot.runtime.kernels.quant_reference import pack_tile
from kvpilot.runtime.kernels.triton_utils import num_sms
from kvpilot.runtime.quant.int_weight import IntWeight

FUSED_M = 1  # the decoder layer fuses at <= gemv.GEMV_MAX_M tokens; the fused kernels were tuned at 1
FUSE_FP8_NORM, FUSE_FP8_SILU = False, True
INT_PDL = False  # the chain: 2.771 with PDL vs 2.762 ms (int4), 3.796 vs 3.852 (int8): no clear gain
# fp8 silu: 8 rows x 2 warps per program (the chain: 2.465 ms/token with both fused against 2.587 with
# 4 x 1 and 2.461 with 16 x 4); the fp8 norm (if fused) as the plain GEMV, 4 x 1 (8 x 2: 2.535 vs 2.465);
# the next weight tile prefetched in registers: 3.60 vs 2.47 (not used)
FP8_SILU_TILE = (8, 2)


def kernels_run_on(x: torch.Tensor) -> bool:
    """Whether the fused kernels take tensors on x's device: a GPU (the CPU tests let the interpreter)."""
    return x.is_cuda


def _takes(x: torch.Tensor, k: int) -> bool:
    """x [FUSED_M, k], dense rows of 16- or 32-bit floats, where the kernels run."""
    return (
        kernels_run_on(x)
        and x.dim() == 2
        and x.shape[0] == FUSED_M
        and x.shape[1] == k
        and x.stride(-1) == 1
        and x.dtype in (torch.bfloat16, torch.float16, torch.float32)
    )


def fp8_config(
    n: int, k: int, device: torch.device, tile: tuple[int, int] | None = None, prefetch: bool = False
) -> GemvConfig:
    """The fp8 GEMV's M = 1 shape (default_fp8_gemv_config), PDL where the GPU has it; tile = (rows per
    program, warps) with split-K until the warps fill the SMs 8 deep, as the default's rule."""
    cfg = replace(
        default_fp8_gemv_config(1, n, k, num_sms(device)), pdl=pdl_enabled(device), prefetch=prefetch
    )
    if tile is None:
        return cfg
    blocks, steps, want = -(-n // tile[0]), -(-k // cfg.block_k), 8 * num_sms(device)
    fits = [s for s in (1, 2, 4, 8) if steps % s == 0]
    split = next((s for s in fits if blocks * s * tile[1] >= want), fits[-1])
    return replace(cfg, block_n=tile[0], num_warps=tile[1], split_k=split)


def fp8_norm_linear(
    hidden: torch.Tensor,
    residual: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
    weight: torch.Tensor,  # float8_e4m3fn [N, K]
    weight_scale: torch.Tensor,  # float32 [N]
    counters: torch.Tensor | None,
    config: GemvConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(rmsnorm(h) (W s)^T, h) in one launch, or None (see the module doc)."""
    n, k = weight.shape
    if (config is None and not FUSE_FP8_NORM) or not _takes(hidden, k):
        return None
    if residual is not None and not _takes(residual, k):
        return None
    cfg = config or fp8_config(n, k, hidden.device)
    return norm_fp8_gemv(hidden, residual, norm_weight, eps, weight, weight_scale, cfg, counters)


def fp8_silu_linear(
    gate_up: torch.Tensor,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    counters: torch.Tensor | None,
    config: GemvConfig | None = None,
) -> torch.Tensor | None:
    """silu(gate) * up @ (W s)^T in one launch, or None."""
    n, k = weight.shape
    if (config is None and not FUSE_FP8_SILU) or not _takes(gate_up, 2 * k):
        return None
    cfg = config or fp8_config(n, k, gate_up.device, FP8_SILU_TILE)
    return silu_fp8_gemv(gate_up, weight, weight_scale, cfg, counters)


def int_config(w: IntWeight, device: torch.device) -> GemvConfig:
    """The dot GEMV's M = 1 shape (default_gemv_config), PDL if INT_PDL."""
    k = w.qweight.shape[0] * (32 // w.bits)
    cfg = default_gemv_config(1, w.out_features, k, w.bits, num_sms(device))
    return replace(cfg, pdl=INT_PDL and pdl_enabled(device))


def _int_takes(x: torch.Tensor, w: IntWeight, k: int) -> bool:
    """The dot GEMV takes this weight: no act-order permutation, whole pack tiles, every dot of 16+ rows
    inside one group (w4a16_triton.fused_supported's rule)."""
    rows = w.qweight.shape[0] * (32 // w.bits)
    tile = pack_tile(rows, w.bits)
    chunk = tile // (32 // w.bits)
    group = rows // w.scales.shape[0]
    layout = w.perm is None and rows % tile == 0 and chunk >= 16 and group % chunk == 0
    return layout and _takes(x, k)


def int_linear(
    x: torch.Tensor, w: IntWeight, counters: torch.Tensor | None, config: GemvConfig | None = None
) -> torch.Tensor | None:
    """x W^T through the dot GEMV with an explicit launch shape (the benchmark's sweeps), or None."""
    k = w.qweight.shape[0] * (32 // w.bits)
    if config is None or not _int_takes(x, w, k):
        return None
    return int_gemv(x, w.qweight, w.scales, w.zeros, w.bits, config, counters)
