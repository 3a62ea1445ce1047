"""Which weight quantization a model runs, from config.json's `quantization_config` and `--quantization`.

Two kinds:
  pre-quantized checkpoints  awq (GEMM, 4-bit, zero point), gptq (4/8-bit, sym or not, desc_act with
                             g_idx, v1 or v2 zeros), fp8 (`quant_method: fp8`, and compressed-tensors
                             float8 with per-tensor or per-channel weight scales; both block-wise too:
                             `weight_block_size` / strategy block, DeepSeek-V3 / Qwen3-FP8),
                             compressed-tensors int4/int8 (pack-, int- or naive-quantized, group or
                             channel, sym or not, actorder with weight_g_idx; int8 activations of W8A8
                             checkpoints run 16-bit): run as the gptq family, weight-only;
                             NVIDIA ModelOpt fp8 (quant/modelopt.py) and fbgemm_fp8 (Meta's
                             Llama-3.1-FP8: per-channel scales; activation_scale_ub unused): run as fp8
  quantize at load           int8 (W8A16 per output channel), int4 (W4A16 round-to-nearest with zero
                             points, group 128 or the largest of 64/32/16 that divides the input width),
                             fp8 (W8A8: per-output-channel weight scales, dynamic per-token activations);
                             a GGUF's own grids are kept under int4 / int8 (quant/gguf_grid.py)

Everything the runtime cannot run is refused here, naming the field and what is supported.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kvpilot.runtime.errors import UnsupportedModelError
from kvpilot.runtime.quant.compressed_tensors_config import compressed_tensors
from kvpilot.runtime.quant.ignored import ignored_patterns
from kvpilot.runtime.quant.modelopt import flatten_modelopt, modelopt_fp8_layout
from kvpilot.runtime.quant.scheme import GPTQ_GROUP_SIZES, QuantConfig, fp8_block

__all__ = ["QuantConfig", "int4_group_size", "parse_quant_config"]

LOAD_TIME_METHODS = ("int8", "int4", "fp8")
CHECKPOINT_METHODS = ("awq", "gptq", "fp8", "compressed-tensors", "modelopt", "fbgemm_fp8")
AWQ_GROUP_SIZES = (32, 64, 128)
GPTQ_BITS = (4, 8)
INT4_GROUP_SIZES = (128, 64, 32, 16)  # load-time int4: the first that divides the input width


def parse_quant_config(raw: Any, forced: str | None) -> QuantConfig | None:
    """The model's quantization (None: 16-bit weights). `raw`: config.json's quantization_config (or None);
    `forced`: --quantization (None or "none": follow the checkpoint)."""
    forced = None if forced in (None, "", "none") else forced
    if raw is None or raw == {}:
        return _load_time(forced)
    if not isinstance(raw, dict):
        raise UnsupportedModelError("config.json quantization_config must be a JSON object")
    method = str(raw.get("quant_method", "")).lower()
    if method not in CHECKPOINT_METHODS:
        raise UnsupportedModelError(
            f"config.json quantization_config.quant_method {method or '(missing)'!r} is not supported; "
            f"supported: {', '.join(CHECKPOINT_METHODS)}"
        )
    if method == "modelopt":
        raw = flatten_modelopt(raw)
    parsers: dict[str, Callable[[dict[str, Any]], QuantConfig]] = {
        **{"awq": _awq, "gptq": _gptq, "fp8": _fp8, "compressed-tensors": compressed_tensors},
        **{"modelopt": _modelopt, "fbgemm_fp8": _fbgemm_fp8},
    }
    parsed = parsers[method](raw)
    parsed = replace(parsed, ignored=ignored_patterns(raw))
    if forced is not None and forced != parsed.method:
        packing = f", {parsed.packing} {parsed.bits}-bit" if parsed.packing else ""
        raise UnsupportedModelError(
            f"--quantization {forced} does not match the checkpoint, which is {parsed.method}-quantized "
            f"(config.json quantization_config{packing}); omit --quantization or pass {parsed.method}"
        )
    return parsed


def _load_time(forced: str | None) -> QuantConfig | None:
    if forced is None:
        return None
    if forced in ("awq", "gptq"):
        name = {"awq": "an AWQ", "gptq": "a GPTQ"}[forced]
        raise UnsupportedModelError(
            f"--quantization {forced} needs {name} checkpoint (config.json quantization_config), "
            "and this one holds 16-bit weights; quantize at load with int8, int4 or fp8, or serve a "
            f"pre-quantized {forced.upper()} checkpoint"
        )
    if forced not in LOAD_TIME_METHODS:
        raise UnsupportedModelError(
            f"--quantization {forced!r} is not supported; for a 16-bit checkpoint use one of "
            f"{', '.join(LOAD_TIME_METHODS)}"
        )
    bits = {"int8": 8, "int4": 4, "fp8": 8}[forced]
    return QuantConfig(method=forced, from_checkpoint=False, bits=bits, sym=forced != "int4")


def _field(raw: dict[str, Any], *names: str, default: Any = None) -> Any:
    for name in names:
        if name in raw:
            return raw[name]
    return default


def _awq(raw: dict[str, Any]) -> QuantConfig:
    bits = _field(raw, "bits", "w_bit", default=4)
    group = _field(raw, "group_size", "q_group_size", default=128)
    version = str(raw.get("version", "gemm")).lower()
    zero_point = raw.get("zero_point", True)
    if version != "gemm":
        raise UnsupportedModelError(
            f"config.json quantization_config.version {version!r} (AWQ) is not supported; supported: gemm"
        )
    if bits != 4:
        raise UnsupportedModelError(
            f"config.json quantization_config.bits {bits} (AWQ) is not supported; supported: 4"
        )
    if group not in AWQ_GROUP_SIZES:
        raise UnsupportedModelError(
            f"config.json quantization_config.group_size {group} (AWQ) is not supported; supported: "
            f"{', '.join(map(str, AWQ_GROUP_SIZES))}"
        )
    if zero_point is not True:
        raise UnsupportedModelError(
            "config.json quantization_config.zero_point false (AWQ) is not supported; supported: true"
        )
    return QuantConfig(method="awq", from_checkpoint=True, bits=4, group_size=group, sym=False)


def _gptq(raw: dict[str, Any]) -> QuantConfig:
    bits = raw.get("bits", 4)
    group = raw.get("group_size", 128)
    if bits not in GPTQ_BITS:
        raise UnsupportedModelError(
            f"config.json quantization_config.bits {bits} (GPTQ) is not supported; supported: "
            f"{', '.join(map(str, GPTQ_BITS))}"
        )
    if group not in GPTQ_GROUP_SIZES:
        raise UnsupportedModelError(
            f"config.json quantization_config.group_size {group} (GPTQ) is not supported; supported: "
            f"{', '.join(map(str, GPTQ_GROUP_SIZES))}"
        )
    if raw.get("lm_head"):
        raise UnsupportedModelError(
            "config.json quantization_config.lm_head true (a GPTQ-quantized LM head) is not supported; "
            "supported: lm_head false (the LM head in 16-bit)"
        )
    fmt = str(raw.get("checkpoint_format", "gptq")).lower()
    if fmt not in ("gptq", "gptq_v2"):
        raise UnsupportedModelError(
            f"config.json quantization_config.checkpoint_format {fmt!r} (GPTQ) is not supported; "
            "supported: gptq, gptq_v2"
        )
    return QuantConfig(
        method="gptq",
        from_checkpoint=True,
        bits=bits,
        group_size=group,
        sym=bool(raw.get("sym", True)),
        desc_act=bool(raw.get("desc_act", False)),
        zeros_v2=fmt == "gptq_v2",
    )


def _fp8(raw: dict[str, Any]) -> QuantConfig:
    fmt = str(raw.get("fmt", "e4m3")).lower()
    if fmt != "e4m3":
        raise UnsupportedModelError(
            f"config.json quantization_config.fmt {fmt!r} (fp8) is not supported; supported: e4m3"
        )
    block = raw.get("weight_block_size")
    if block is None:
        return QuantConfig(method="fp8", from_checkpoint=True, bits=8)
    return QuantConfig(
        method="fp8", from_checkpoint=True, bits=8, fp8_block=fp8_block(block, "weight_block_size")
    )


def _modelopt(flat: dict[str, Any]) -> QuantConfig:
    per_channel, block = modelopt_fp8_layout(flat)
    return QuantConfig(
        "fp8", True, bits=8, fp8_scale_per_channel=per_channel, packing="modelopt", fp8_block=block
    )


def _fbgemm_fp8(raw: dict[str, Any]) -> QuantConfig:
    return QuantConfig("fp8", True, bits=8, fp8_scale_per_channel=True)


def int4_group_size(in_features: int) -> int:
    """Load-time int4: group 128 when the input width allows, else the largest of 64/32/16 that divides it
    (SmolLM2's 576 -> 64)."""
    for group in INT4_GROUP_SIZES:
        if in_features % group == 0:
            return group
    raise UnsupportedModelError(
        f"int4 needs an input width divisible by 16 (group sizes {', '.join(map(str, INT4_GROUP_SIZES))}); "
        f"a layer has {in_features}"
    )
