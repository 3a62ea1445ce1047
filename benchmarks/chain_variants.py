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
from kvpilot.runtime.kernels.fp8_gemv_triton import FP8_M1_BLOCK_K, fp8_gemv
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
from kvpilot.runtime.quant.int_weight import IntWeight, quantize_rtn

HIDDEN, QKV, INTER, Q = 4096, 6144, 12288, 4096
EPS = 1e-6
BF16 = torch.bfloat16
Layer = dict[str, Any]
LayerFn = Callable[[torch.Tensor, torch.Tensor, Layer], tuple[torch.Tensor, torch.Tensor]]
SHAPES = {"qkv": (QKV, HIDDEN), "o": (HIDDEN, Q), "gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}
BYTES_PER_VALUE = {"bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}


def make_layer(quant: str) -> Layer:
    """Random weights of one layer in `quant`'s kernel layout, each with its own split-K counters."""
    layer: Layer = {
        "nw1": 1 + 0.1 * torch.randn(HIDDEN, device="cuda", dtype=BF16),
        "nw2": 1 + 0.1 * torch.randn(HIDDEN, device="cuda", dtype=BF16),
    }
    for name, (n, k) in SHAPES.items():
        w = torch.randn(n, k, device="cuda", dtype=BF16) * k**-0.5
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
    fused: bool = True
    pdl: bool = True
    reduce: str = "fixup"  # split-K reduction of the fused launches (and the mma GEMV's)
    mma: bool = False  # int4 gate_up: norm kernel + the mma GEMV, not the fused dot GEMV
    l2_ahead: int = 0  # the mma GEMV's L2 prefetch distance
    norm_tile: tuple[int, int] = (0, 0)  # fp8 norm launches: (rows per program, warps); 0: the default
    silu_tile: tuple[int, int] = (0, 0)
    o_pdl: bool = False  # int: O through the dot GEMV with PDL (the model: int_gemm, no PDL)


def _fp8_cfg(n: int, k: int, tile: tuple[int, int], o: Opts) -> GemvConfig:
    cfg = fg.fp8_config(n, k, torch.device("cuda"))
    if tile[0]:  # split-K until the warps fill the SMs 8 deep, as the default's rule
        blocks, steps = -(-n // tile[0]), k // FP8_M1_BLOCK_K
        want = 8 * num_sms(torch.device("cuda"))
        split = next((s for s in (1, 2, 4, 8) if steps % s == 0 and blocks * s * tile[1] >= want), 8)
        cfg = replace(cfg, block_n=tile[0], num_warps=tile[1], split_k=split)
    return replace(cfg, pdl=o.pdl, reduce=o.reduce)


def _int_cfg(w: IntWeight, o: Opts) -> GemvConfig:
    return replace(fg.int_config(w, torch.device("cuda")), pdl=o.pdl, reduce=o.reduce)


def _plain(x: torch.Tensor, p: Any, quant: str, o: Opts) -> torch.Tensor:
    if quant == "bf16":
        return F.linear(x, p)
    if quant == "fp8":
        w, s, c = p
        return fp8_linear(x, w, s, None, counters=c) if o.fused else fp8_gemv(x, w, s, counters=c)
    w, c = p
    if o.o_pdl:
        out = fg.int_linear(x, w, c, _int_cfg(w, o))
        assert out is not None
        return out
    return int_gemm(x, w.qweight, w.scales, w.zeros, w.bits, None, c)


def _norm(
    x: torch.Tensor, r: torch.Tensor, nw: torch.Tensor, p: Any, quant: str, o: Opts, mlp: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    if not o.fused or (quant == "int4" and mlp and o.mma):
        y, r = rms_norm_triton(x, nw, EPS, r)
        if o.fused and o.mma:  # the mma GEMV with this variant's options
            w, c = p
            cfg = replace(default_mma_config(w.out_features, HIDDEN, num_sms(x.device)), l2_ahead=o.l2_ahead)
            return int4_mma_gemv(y, w.qweight, w.scales, w.zeros, replace(cfg, reduce=o.reduce), c), r
        return _plain(y, p, quant, o), r
    if quant == "bf16":
        return norm_linear_triton(x, r, nw, EPS, p)
    if quant == "fp8":
        w, s, c = p
        out = fg.fp8_norm_linear(x, r, nw, EPS, w, s, c, _fp8_cfg(*w.shape, o.norm_tile, o))
    else:
        w, c = p
        out = fg.int_norm_linear(x, r, nw, EPS, w, c, _int_cfg(w, o))
    assert out is not None
    return out


def _silu(gu: torch.Tensor, p: Any, quant: str, o: Opts) -> torch.Tensor:
    if not o.fused:
        return _plain(silu_and_mul_triton(gu), p, quant, o)
    if quant == "bf16":
        return silu_linear_triton(gu, p)
    if quant == "fp8":
        w, s, c = p
        out = fg.fp8_silu_linear(gu, w, s, c, _fp8_cfg(*w.shape, o.silu_tile, o))
    else:
        w, c = p
        out = fg.int_silu_linear(gu, w, c, _int_cfg(w, o))
    assert out is not None
    return out


def layer_fn(quant: str, o: Opts) -> LayerFn:
    def layer(h: torch.Tensor, r: torch.Tensor, p: Layer) -> tuple[torch.Tensor, torch.Tensor]:
        qkv, r = _norm(h, r, p["nw1"], p["qkv"], quant, o, mlp=False)
        attn = qkv[:, :Q].contiguous()  # the attention stand-in
        gu, r = _norm(_plain(attn, p["o"], quant, o), r, p["nw2"], p["gate_up"], quant, o, mlp=True)
        return _silu(gu, p["down"], quant, o), r

    return layer


def variants(quant: str) -> dict[str, LayerFn]:
    opts = {"unfused": Opts(fused=False), "fused": Opts(), "fused-nopdl": Opts(pdl=False)}
    if quant in ("int4", "int8"):
        opts |= {"fused-wide": Opts(reduce="fixup_wide"), "fused-o-pdl": Opts(o_pdl=True)}
    if quant == "int4":
        opts |= {
            "fused-mma": Opts(mma=True),
            "fused-mma-l2a1": Opts(mma=True, l2_ahead=1),
            "fused-mma-l2a2": Opts(mma=True, l2_ahead=2),
            "fused-mma-wide": Opts(mma=True, reduce="fixup_wide"),
            "fused-mma-l2a2-wide": Opts(mma=True, l2_ahead=2, reduce="fixup_wide"),
        }
    if quant == "fp8":
        for rows, warps in ((8, 1), (8, 2), (16, 2), (16, 4)):
            opts[f"fused-norm{rows}x{warps}w"] = Opts(norm_tile=(rows, warps))
            opts[f"fused-silu{rows}x{warps}w"] = Opts(silu_tile=(rows, warps))
    return {name: layer_fn(quant, o) for name, o in opts.items()}
