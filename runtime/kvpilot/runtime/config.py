"""What the runtime needs to know about a model, read from a Hugging Face config.json."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpilot.runtime.errors import ModelLoadError, UnsupportedModelError
from kvpilot.runtime.gguf_model import resolve_model_dir

# architecture -> (attention has q/k/v bias by construction, q/k RMSNorm)
SUPPORTED_ARCHITECTURES: dict[str, tuple[bool, bool]] = {
    "LlamaForCausalLM": (False, False),
    "Qwen2ForCausalLM": (True, False),
    "Qwen3ForCausalLM": (False, True),
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
_REQUIRED = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # bias on the q/k/v projections (Qwen2; Llama with attention_bias)
    qk_norm: bool  # RMSNorm over each head of q and k before rotary (Qwen3)
    torch_dtype: str  # the checkpoint's dtype name, e.g. "bfloat16"
    o_proj_bias: bool = False  # bias on the output projection (Llama/Qwen3 with attention_bias; never Qwen2)
    # config.json's quantization_config as written (kvpilot.runtime.quant.config parses and checks it)
    quantization_config: dict[str, Any] | None = None

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> ModelConfig:
        """config.json of a model directory (a GGUF file or directory: of its converted copy)."""
        model_dir = resolve_model_dir(model_dir)
        path = Path(model_dir) / "config.json"
        if not Path(model_dir).is_dir():
            raise ModelLoadError(f"model directory {model_dir} does not exist")
        if not path.is_file():
            raise ModelLoadError(f"config.json not found in {model_dir}")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ModelLoadError(f"cannot read {path}: {exc}") from exc
        if not isinstance(raw, dict):
            raise ModelLoadError(f"{path} must hold a JSON object")
        if not raw.get("quantization_config"):  # older NVIDIA ModelOpt exports keep it beside config.json
            from kvpilot.runtime.quant.modelopt import read_hf_quant_config

            raw["quantization_config"] = read_hf_quant_config(Path(model_dir))
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ModelConfig:
        architecture = _architecture(raw)
        _check_supported_features(raw, architecture)
        missing = [key for key in _REQUIRED if not isinstance(raw.get(key), int)]
        if missing:
            raise ModelLoadError(f"config.json lacks required integer field(s): {', '.join(missing)}")
        heads = raw["num_attention_heads"]
        kv_heads = raw.get("num_key_value_heads") or heads
        if heads % kv_heads != 0:
            raise ModelLoadError(
                f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
            )
        qkv_bias, qk_norm = SUPPORTED_ARCHITECTURES[architecture]
        rope_theta, rope_scaling = _rope(raw)
        return cls(
            architecture=architecture,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_hidden_layers=raw["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // heads,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=qkv_bias or bool(raw.get("attention_bias", False)),
            qk_norm=qk_norm,
            torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
            o_proj_bias=not qkv_bias and bool(raw.get("attention_bias", False)),
            quantization_config=_quantization_config(raw),
        )

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim


def _architecture(raw: dict[str, Any]) -> str:
    architectures = raw.get("architectures") or []
    supported = ", ".join(SUPPORTED_ARCHITECTURES)
    if not architectures:
        raise UnsupportedModelError(f"config.json names no architecture; supported: {supported}")
    for name in architectures:
        if name in SUPPORTED_ARCHITECTURES:
            return name
    raise UnsupportedModelError(
        f"architecture {', '.join(map(str, architectures))} is not supported; supported: {supported}"
    )


def _quantization_config(raw: dict[str, Any]) -> dict[str, Any] | None:
    """The quantization_config object, checked to be one (its fields are checked by runtime.quant)."""
    value = raw.get("quantization_config")
    if value in (None, {}):
        return None
    if not isinstance(value, dict):
        raise ModelLoadError("config.json quantization_config must be a JSON object")
    from kvpilot.runtime.quant.config import parse_quant_config

    parse_quant_config(value, None)  # an unsupported format fails here, naming the field
    return value


def _check_supported_features(raw: dict[str, Any], architecture: str) -> None:
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(f"hidden_act {act!r} is not supported for {architecture}; only 'silu'")
    if raw.get("mlp_bias"):
        raise UnsupportedModelError("mlp_bias=true is not supported")
    if raw.get("use_sliding_window"):
        raise UnsupportedModelError("sliding-window attention (use_sliding_window=true) is not supported")


def _rope(raw: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, rope_scaling) from either the classic keys or transformers 5's rope_parameters."""
    params = raw.get("rope_parameters")
    if isinstance(params, dict):
        theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta = raw.get("rope_theta", 10000.0)
        scaling = dict(raw.get("rope_scaling") or {})
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise UnsupportedModelError(
            f"rope scaling type {rope_type!r} is not supported; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    if rope_type == "default":
        return float(theta), None
    scaling["rope_type"] = rope_type
    scaling.pop("type", None)
    return float(theta), scaling
