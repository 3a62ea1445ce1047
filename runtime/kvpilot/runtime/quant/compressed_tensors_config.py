"""compressed-tensors' `quantization_config` (llm-compressor): float8 weights per tensor, channel or block
(fp8), or int4/int8 weights (pack-, int- or naive-quantized) per group or channel, which run as the gptq
family, weight-only (their layout differs, the arithmetic is GPTQ's: quant/checkpoint_formats.py)."""

from __future__ import annotations

from typing import Any

from kvpilot.runtime.errors import UnsupportedModelError
from kvpilot.runtime.quant.scheme import GPTQ_GROUP_SIZES, QuantConfig, fp8_block

CT_INT_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized")  # compressed-tensors int weights


def compressed_tensors(raw: dict[str, Any]) -> QuantConfig:
    """The QuantConfig of a compressed-tensors quantization_config (one weight scheme for all groups)."""
    groups = raw.get("config_groups") or {}
    schemes = [g for g in groups.values() if isinstance(g, dict) and g.get("weights")]
    if not schemes:
        raise UnsupportedModelError(
            "config.json quantization_config.config_groups (compressed-tensors) names no weight scheme; "
            "supported: float8 weights (tensor, channel or block strategy), int4/int8 weights"
        )
    kinds = {(g["weights"].get("type"), g["weights"].get("num_bits")) for g in schemes}
    if kinds == {("float", 8)}:
        return _ct_float([g["weights"] for g in schemes])
    if kinds in ({("int", 4)}, {("int", 8)}):
        return _ct_int(raw, schemes)
    found = ", ".join(f"num_bits {bits}, type {kind!r}" for kind, bits in sorted(kinds, key=str))
    raise UnsupportedModelError(
        f"config.json quantization_config.config_groups.*.weights ({found}) is not supported; supported "
        "(compressed-tensors, one scheme for all layers): num_bits 8 type float, num_bits 4 or 8 type int"
    )


def _ct_float(schemes: list[dict[str, Any]]) -> QuantConfig:
    strategies = {scheme.get("strategy", "tensor") for scheme in schemes}
    if not strategies <= {"tensor", "channel", "block"} or len(strategies) != 1:
        raise UnsupportedModelError(
            "config.json quantization_config.config_groups.*.weights.strategy "
            f"{', '.join(sorted(map(str, strategies)))} is not supported; supported: tensor, channel or block"
        )
    if strategies == {"block"}:
        blocks = {str(scheme.get("block_structure")) for scheme in schemes}
        if len(blocks) != 1:
            raise UnsupportedModelError(
                "config.json quantization_config.config_groups.*.weights.block_structure differ between "
                "groups; supported: one block structure"
            )
        block = fp8_block(schemes[0].get("block_structure"), "config_groups.*.weights.block_structure")
        return QuantConfig(
            method="fp8", from_checkpoint=True, bits=8, packing="compressed-tensors", fp8_block=block
        )
    return QuantConfig(
        method="fp8", from_checkpoint=True, bits=8, fp8_scale_per_channel=strategies == {"channel"}
    )


def _ct_int(raw: dict[str, Any], schemes: list[dict[str, Any]]) -> QuantConfig:
    field = "config.json quantization_config.config_groups.*"
    keys = ("num_bits", "strategy", "group_size", "symmetric")
    weights = {tuple(str(g["weights"].get(key)) for key in keys) for g in schemes}
    if len(weights) != 1:
        raise UnsupportedModelError(f"{field}.weights differ between groups; supported: one int scheme")
    scheme = schemes[0]["weights"]
    fmt = str(schemes[0].get("format") or raw.get("format") or "")
    if fmt not in CT_INT_FORMATS:
        raise UnsupportedModelError(
            f"config.json quantization_config.format {fmt or '(missing)'!r} (compressed-tensors int weights) "
            f"is not supported; supported: {', '.join(CT_INT_FORMATS)}"
        )
    activations = [g["input_activations"] for g in schemes if g.get("input_activations")]
    if any(a.get("type", "int") != "int" or a.get("num_bits") != 8 for a in activations):
        raise UnsupportedModelError(
            f"{field}.input_activations (other than int8) is not supported; supported: null (weight-only) or "
            "int8, which runs weight-only here (the activations stay 16-bit)"
        )
    strategy = scheme.get("strategy")
    group = scheme.get("group_size")
    if strategy == "channel":
        group = -1
    elif strategy != "group" or group not in GPTQ_GROUP_SIZES[1:]:
        raise UnsupportedModelError(
            f"{field}.weights (strategy {strategy!r}, group_size {group}) is not supported; supported: "
            f"strategy channel, or group with group_size {', '.join(map(str, GPTQ_GROUP_SIZES[1:]))}"
        )
    return QuantConfig(
        method="gptq",
        from_checkpoint=True,
        bits=int(scheme["num_bits"]),
        group_size=int(group),
        sym=scheme.get("symmetric", True) is not False,
        desc_act=scheme.get("actorder") not in (None, False),
        packing="compressed-tensors" if fmt == "pack-quantized" else "compressed-tensors-unpacked",
        int8_activations=bool(activations),
    )
