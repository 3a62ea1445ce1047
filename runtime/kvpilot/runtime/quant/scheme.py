"""The parsed form of a model's weight quantization (quant/config.py reads it from config.json's
`quantization_config` and `--quantization`; quant/compressed_tensors_config.py reads compressed-tensors)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvpilot.runtime.errors import UnsupportedModelError

GPTQ_GROUP_SIZES = (-1, 32, 64, 128)


@dataclass(frozen=True)
class QuantConfig:
    """method: awq, gptq, fp8 (both fp8 sources), int8, int4. from_checkpoint: the tensors are already
    quantized (qweight/... or float8 weight + weight_scale), else a 16-bit checkpoint quantized at load."""

    method: str
    from_checkpoint: bool
    bits: int = 16
    group_size: int = -1  # -1: one group over the whole input width
    sym: bool = True
    desc_act: bool = False
    zeros_v2: bool = False  # GPTQ v2 zeros (stored as is) instead of v1's zero - 1
    fp8_scale_per_channel: bool = False  # compressed-tensors channel strategy (else per tensor)
    # how an integer checkpoint's tensors are laid out: "" (its method's own: qweight/qzeros/scales),
    # "compressed-tensors" (pack-quantized: weight_packed/weight_scale/weight_zero_point/weight_g_idx) or
    # "compressed-tensors-unpacked" (int-/naive-quantized: int8 weight, weight_scale, weight_zero_point)
    packing: str = ""
    # the checkpoint quantizes activations to int8 too (compressed-tensors W8A8 / W4A8): W8A8 with channel
    # scales runs W8A8 above decode sizes (quant/methods.py), anything else weight-only (16-bit activations)
    int8_activations: bool = False
    # modules the checkpoint leaves 16-bit (quant/ignored.py patterns)
    ignored: tuple[str, ...] = ()
    # block-wise fp8 ([rows, columns] of W [N, K] per float32 scale; None: per tensor or per channel)
    fp8_block: tuple[int, int] | None = None


def fp8_block(block: Any, name: str) -> tuple[int, int]:
    """Block-wise fp8's [output rows, input columns] per scale: two positive multiples of 16."""
    if (
        not isinstance(block, list | tuple)
        or len(block) != 2
        or not all(type(b) is int and b > 0 and b % 16 == 0 for b in block)
    ):
        raise UnsupportedModelError(
            f"config.json quantization_config.{name} {block!r} (block-wise fp8) is not supported; "
            "supported: [rows, columns], each a positive multiple of 16 (DeepSeek-V3 / Qwen3-FP8: [128, 128])"
        )
    return int(block[0]), int(block[1])
