"""Reading checkpoint quantization fields the operator's planner and the runtime's loader both judge (one
reading, two error types: each side wraps the ValueError in its own)."""

from __future__ import annotations

from typing import Any

# NVIDIA ModelOpt quant_algo values served, all as the fp8 family (kvpilot/runtime/quant/modelopt.py)
MODELOPT_FP8_ALGOS = ("FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO")
# GPTQModel `dynamic` overrides: the fields an override may repeat, with the GPTQ config's defaults
GPTQ_OVERRIDABLE: dict[str, Any] = {"bits": 4, "group_size": 128, "sym": True, "desc_act": False}


def modelopt_fields(qconfig: dict[str, Any]) -> dict[str, Any]:
    """A ModelOpt quantization config's own fields: nested under "quantization" in hf_quant_config.json's
    (legacy) layout, at the top in config.json's."""
    nested = qconfig.get("quantization")
    return nested if isinstance(nested, dict) else qconfig


def gptq_dynamic_skips(qconfig: dict[str, Any]) -> list[str]:
    """GPTQModel's `dynamic` "-:" keys (modules left 16-bit) as regular expressions. ValueError, naming the
    key, for an override that changes bits, group_size, sym or desc_act (per-module quantization is not
    served: one GEMM layout serves every layer) or for a malformed field."""
    dynamic = qconfig.get("dynamic") or {}
    if not isinstance(dynamic, dict):
        raise ValueError("quantization_config.dynamic must be an object (GPTQModel)")
    skips = []
    for key, override in dynamic.items():
        if str(key).startswith("-:"):
            skips.append(str(key)[2:])
            continue
        if not isinstance(override, dict):
            raise ValueError(
                f"quantization_config.dynamic[{key!r}] must be an object of overrides (GPTQModel)"
            )
        changed = {
            field: value
            for field, value in override.items()
            if field in GPTQ_OVERRIDABLE and value != qconfig.get(field, GPTQ_OVERRIDABLE[field])
        }
        if changed:
            raise ValueError(
                f"quantization_config.dynamic[{key!r}] sets {changed} for the modules it matches: per-module "
                "quantization is not supported; supported: '-:' keys (modules left 16-bit) and overrides "
                "equal to the checkpoint's own bits, group_size, sym and desc_act"
            )
    return skips
