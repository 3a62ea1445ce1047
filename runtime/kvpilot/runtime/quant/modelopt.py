"""NVIDIA ModelOpt fp8 checkpoints (the `nvidia/*-FP8` models), detected from config.json's
quantization_config (`quant_method: modelopt`, newer exports) or, in older exports that leave config.json
unquantized, from hf_quant_config.json beside it ({"quantization": {"quant_algo": ...}}).

Served quant_algo values, all as the fp8 family (their tensors are the fp8 formats' own):
  FP8                        weight float8_e4m3fn [N, K], weight_scale [] per tensor, static input_scale []
                             (read and unused: activations are scaled per token, as for every fp8 checkpoint)
  FP8_PER_CHANNEL_PER_TOKEN  weight_scale [N] per output channel
  FP8_PB_WO                  weight_scale per 128 x 128 block, written [N/128, 1, K/128, 1]
KV-cache scales (`k_proj.k_scale`, `v_proj.v_scale`) are read and unused, as llm-compressor's are (the
8-bit cache scales per token and head). Layers left 16-bit: `exclude_modules` (legacy) or `ignore`, fnmatch
wildcards ("lm_head", "model.layers.0.mlp*"), turned into quant/ignored.py patterns.
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any

from kvpilot.contracts.checkpoint_quant import MODELOPT_FP8_ALGOS, modelopt_fields
from kvpilot.runtime.errors import ModelLoadError, UnsupportedModelError

HF_QUANT_CONFIG = "hf_quant_config.json"
PB_WO_BLOCK = (128, 128)  # ModelOpt's block-wise fp8 writes no block size: it is always 128 x 128


def read_hf_quant_config(model_dir: Path) -> dict[str, Any] | None:
    """An older ModelOpt export's quantization (hf_quant_config.json) as a quantization_config, or None."""
    path = model_dir / HF_QUANT_CONFIG
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"cannot read {path}: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("quantization"), dict):
        raise UnsupportedModelError(f"{path} holds no 'quantization' object (NVIDIA ModelOpt's layout)")
    return {"quant_method": "modelopt", **raw}


def flatten_modelopt(raw: dict[str, Any]) -> dict[str, Any]:
    """One shape for both exports: {"quant_method": "modelopt", "quant_algo": ..., "ignore": [patterns]}.
    The legacy layout nests quant_algo and exclude_modules under "quantization"."""
    fields = modelopt_fields(raw)
    excluded = fields.get("exclude_modules", fields.get("ignore")) or []
    if not isinstance(excluded, list) or not all(isinstance(p, str) for p in excluded):
        raise UnsupportedModelError(
            "config.json quantization_config.exclude_modules (ModelOpt) must be a list of module names"
        )
    return {
        "quant_method": "modelopt",
        "quant_algo": str(fields.get("quant_algo") or "").upper(),
        "ignore": [_pattern(p) for p in excluded],
    }


def _pattern(wildcard: str) -> str:
    """A ModelOpt wildcard as a quant/ignored.py pattern: plain names as they are, wildcards as a regex."""
    if not any(c in wildcard for c in "*?["):
        return wildcard
    return "re:" + fnmatch.translate(wildcard)


def modelopt_fp8_layout(flat: dict[str, Any]) -> tuple[bool, tuple[int, int] | None]:
    """(per-channel scales, block) of a flattened ModelOpt config; refuses what is not fp8."""
    algo = flat["quant_algo"]
    if algo not in MODELOPT_FP8_ALGOS:
        raise UnsupportedModelError(
            f"config.json quantization_config.quant_algo {algo or '(missing)'!r} (NVIDIA ModelOpt) is not "
            f"supported; supported: {', '.join(MODELOPT_FP8_ALGOS)}"
        )
    return algo == "FP8_PER_CHANNEL_PER_TOKEN", PB_WO_BLOCK if algo == "FP8_PB_WO" else None
