"""Quantized weights: format detection (config), checkpoint unpacking, load-time quantization and the
per-format linear methods that plug into layers/linear.py."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from kvpilot.runtime.kernels.quant_reference import FP8_WEIGHT_ONLY_MAX_M
from kvpilot.runtime.layers.linear import Linear
from kvpilot.runtime.quant.config import QuantConfig, parse_quant_config
from kvpilot.runtime.quant.fp8_block import Fp8BlockMethod
from kvpilot.runtime.quant.fp8_method import Fp8Method
from kvpilot.runtime.quant.ignored import stays_16bit
from kvpilot.runtime.quant.int8_channel import Int8ChannelMethod, takes_int8_activations
from kvpilot.runtime.quant.methods import IntWeightMethod
from torch import nn

log = logging.getLogger(__name__)
__all__ = ["QuantConfig", "attach_quant_methods", "finish_quant_methods", "parse_quant_config"]


def attach_quant_methods(
    model: nn.Module,
    quant: QuantConfig,
    *,
    dtype: torch.dtype,
    device: torch.device,
    backend: str,
    checkpoint_parts: Callable[[str], list[str]] = lambda name: [name],
) -> None:
    """Give every Linear of the (not yet materialised) model its format's method, but those the checkpoint
    leaves 16-bit (quant/ignored.py; checkpoint_parts: the checkpoint modules a module is made of, for the
    fused ones). The LM head and the embedding stay in the model dtype."""
    method_class: type[Fp8Method | Fp8BlockMethod | IntWeightMethod] = IntWeightMethod
    if quant.method == "fp8":
        method_class = Fp8Method if quant.fp8_block is None else Fp8BlockMethod
    elif takes_int8_activations(quant):
        method_class = Int8ChannelMethod
        log.info(
            "W8A8 int8 checkpoint: prefills of more than %d tokens run W8A8 (activations quantized per "
            "token); decode steps run weight-only, with 16-bit activations",
            FP8_WEIGHT_ONLY_MAX_M,
        )
    elif quant.int8_activations:
        log.warning(
            "the checkpoint quantizes activations to int8 (compressed-tensors W4A8, or W8A8 with group "
            "scales or zero points): kvpilot runs it weight-only, with 16-bit activations (at least as "
            "accurate; no int8 GEMM speed-up)"
        )
    for name, module in model.named_modules():
        if isinstance(module, Linear) and not stays_16bit(name, checkpoint_parts(name), quant.ignored):
            module.set_quant_method(method_class(quant, dtype, device, backend))


def finish_quant_methods(model: nn.Module) -> None:
    """Repack every quantized layer's collected tensors into its kernel layout (after loading)."""
    for module in model.modules():
        if isinstance(module, Linear) and module.quant_method is not None:
            module.quant_method.finish(module)
