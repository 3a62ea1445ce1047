"""The layers and variants of benchmarks/bench_gemv_chain.py: one Qwen3-8B decoder layer's GEMMs at M = 1
per weight format, unfused (as main ran them before the fused quantized GEMVs) and fused (the model's
entries), with options to sweep."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from kvpilot.runtime.kernels.activation_triton import silu_and_mul_triton
from kvpilot.runtime.kernels.fp8_gemv_triton import fp8_gemv
from kvpilot.runtime.kernels.gemv_dispatch import norm_linear_triton, silu_linear_triton
from kvpilot.runtime.kernels.int4_mma_gemv_triton import default_mma_config, int4_mma_gemv
from kvpilot.runtime.kernels.int_gemv_triton import GemvConfig
from kvpilot.runtime.kernels.norm_triton import rms_norm_triton
from kvpilot.runtime.kernels.quant_reference import quantize_fp8_rows_ref
from kvpilot.runtime.kernels.split_k_triton import split_counters
from kvpilot.runtime.kernels.triton_utils import num_sms
from kvpilot.runtime.kernels.w4a16_triton import int_gemm
from kvpilot.runtime.quant import fused_gemv as fg
from kvpilot.runtime.quant.fp8_gemm import fp8_linear
from kvpilot.runtime.quant.int_weight import quantize_rtn

HIDDEN, QKV, INTER, Q = 4096, 6144, 12288, 4096
EPS = 1e-6
BF16 = torch.bfloat16
Layer = dict[str, Any]
LayerFn = Callable[[torch.Tensor, torch.Tensor, Layer], tuple[torch.Tensor, torch.Tensor]]
SHAPES = {"qkv": (QKV, HIDDEN), "o": (HIDDEN, Q), "gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}
BYTES_PER_VALUE = {"bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


def make_layer(quant: str, device: str = "cuda", dtype: torch.dtype = BF16) -> Layer:
    """Random weights of one layer in `quant`'s kernel layout, each with its own split-K counters."""
    layer: Layer = {
        "nw1": 1 + 0.1 * torch.randn(HIDDEN, device=device, dtype=dtype),
        "nw2": 1 + 0.1 * torch.randn(HIDDEN, device=device, dtype=dtype),
    }
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device=device, dtype=dtype) * k**-0.5
        counters = split_counters(n, w.device)
        if quant == "bf16":
            layer[name] = w
        elif quant == "fp8":
            values, scale = quantize_fp8_rows_ref(w)
            layer[name] = (values, scale.view(-1).contiguous(), counters)
        else:
            bits = 4 if quant == "int4" else 8
            layer[name] = (quantize_rtn(w, bits, 128 if bits == 4 else -1, sym=bits == 8), counters)
        del w
    return layer


def weight_bytes(quant: str) -> float:
    return sum(n * k for n, k in SHAPES.values()) * BYTES_PER_VALUE[quant]


@dataclass(frozen=True)
class Opts:
    fused: bool = True  # False: every op apart, as main ran them before the fused quantized GEMVs
    norm: bool | None = None  # fp8: fuse the norms; None: as the model
    silu: bool | None = None  # fp8: fuse the SiLU; None: as the model (quant/fused_gemv.py's switches)
    pdl: bool | None = None  # None: as the model (fp8 on, int off)
    l2_ahead: int = 0  # the mma GEMV's L2 prefetch distance
    reduce: str = "fixup"  # split-K reduction of the fused launches and the mma GEMV
    tile: dict[str, tuple[int, int]] | None = None  # fp8: {"norm"/"silu": (rows, warps)}
    prefetch: bool = False  # fp8 fused launches: the next weight tile loaded early


def _fp8_cfg(kind: str, w: torch.Tensor, o: Opts) -> GemvConfig:
    default = fg.FP8_SILU_TILE if kind == "silu" else None
    tile = (o.tile or {}).get(kind, default)
    cfg = fg.fp8_config(*w.shape, w.device, tile, o.prefetch)
    return replace(cfg, reduce=o.reduce, pdl=cfg.pdl if o.pdl is None else o.pdl)


def _plain(x: torch.Tensor, p: Any, quant: str, o: Opts, mma: bool = False) -> torch.Tensor:
    if quant == "bf16":
        return F.linear(x, p)
    if quant == "fp8":
        w, s, c = p
        return fp8_linear(x, w, s, None, counters=c) if o.fused else fp8_gemv(x, w, s, counters=c)
    w, c = p
    if mma and o.fused and (o.l2_ahead or o.reduce != "fixup"):  # the mma GEMV with this variant's options
        cfg = default_mma_config(w.out_features, x.shape[1], num_sms(x.device))
        cfg = replace(cfg, l2_ahead=o.l2_ahead, reduce=o.reduce)
        return int4_mma_gemv(x, w.qweight, w.scales, w.zeros, cfg, c)
    return int_gemm(x, w.qweight, w.scales, w.zeros, w.bits, None, c)


def _norm(
    x: torch.Tensor, r: torch.Tensor, nw: torch.Tensor, p: Any, quant: str, o: Opts, mlp: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    mma = quant == "int4" and mlp  # gate_up: the mma GEMV's layer
    if quant == "bf16" and o.fused:
        return norm_linear_triton(x, r, nw, EPS, p)
    out = None
    fp8_norm = fg.FUSE_FP8_NORM if o.norm is None else o.norm
    if o.fused and fp8_norm and quant == "fp8":
        w, s, c = p
        out = fg.fp8_norm_linear(x, r, nw, EPS, w, s, c, _fp8_cfg("norm", w, o))
    if out is not None:
        return out
    y, r = rms_norm_triton(x, nw, EPS, r)
    return _plain(y, p, quant, o, mma), r


def _silu(gu: torch.Tensor, p: Any, quant: str, o: Opts) -> torch.Tensor:
    if quant == "bf16" and o.fused:
        return silu_linear_triton(gu, p)
    out = None
    if quant == "fp8" and o.fused and (fg.FUSE_FP8_SILU if o.silu is None else o.silu):
        w, s, c = p
        out = fg.fp8_silu_linear(gu, w, s, c, _fp8_cfg("silu", w, o))
    return out if out is not None else _plain(silu_and_mul_triton(gu), p, quant, o)


def layer_fn(quant: str, o: Opts) -> LayerFn:
    def layer(h: torch.Tensor, r: torch.Tensor, p: Layer) -> tuple[torch.Tensor, torch.Tensor]:
        qkv, r = _norm(h, r, p["nw1"], p["qkv"], quant, o, mlp=False)
        attn = qkv[:, :Q].contiguous()  # the attention stand-in
        gu, r = _norm(_plain(attn, p["o"], quant, o), r, p["nw2"], p["gate_up"], quant, o, mlp=True)
        return _silu(gu, p["down"], quant, o), r

    return layer


def variants(quant: str) -> dict[str, LayerFn]:
    """ "fused" is the model's defaults (quant/fused_gemv.py's switches); the others change one thing."""
    opts = {"unfused": Opts(fused=False), "fused": Opts()}
    if quant == "int4":
        opts |= {
            "fused-mma-l2a1": Opts(l2_ahead=1),
            "fused-mma-wide": Opts(reduce="fixup_wide"),
        }
    if quant == "fp8":
        opts |= {
            "fused-nopdl": Opts(pdl=False),
            "fused+norm": Opts(norm=True),
            "fused+norm8x2w": Opts(norm=True, tile={"norm": (8, 2)}),
            "fused-silu4x1w": Opts(tile={"silu": (4, 1)}),
            "fused-silu16x4w": Opts(tile={"silu": (16, 4)}),
        }
    return {name: layer_fn(quant, o) for name, o in opts.items()}
