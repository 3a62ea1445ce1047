"""Model facts: the architecture numbers planning needs, read from a Hugging Face config.json.

Key names are Hugging Face's own (num_hidden_layers, num_key_value_heads, ...) so users can paste their
config.json into spec.model.config. Multimodal configs keep the language model under `text_config`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvpilot.contracts.checkpoint_quant import MODELOPT_FP8_ALGOS, gptq_dynamic_skips, modelopt_fields

# Families whose MLP has two matrices (up, down) instead of the gated three (gate, up, down).
UNGATED_MODEL_TYPES = frozenset(
    {"gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "phi", "starcoder2", "gpt_bigcode", "mpt"}
)
DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "bf16", "half": "fp16", "float": "bf16"}
ALIASES = {
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
}


class ModelFactsError(ValueError):
    """config.json lacks what planning needs, or describes something the planner can't size."""


@dataclass(frozen=True)
class ModelFacts:
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool
    max_positions: int
    dtype: str  # the 16-bit type the model serves in: bf16 | fp16
    gated_mlp: bool = True
    attention_bias: bool = False
    num_experts: int = 0  # 0: dense MLP
    moe_intermediate_size: int = 0
    experts_per_token: int = 0
    shared_expert_intermediate_size: int = 0
    dense_layers: int = 0  # leading layers with a dense MLP in an MoE model
    prequantized: str | None = None  # awq | gptq | fp8 | int8: the checkpoint's own weight format
    quant_group_size: int = 128
    quant_bits: int = 4  # bits per weight of an AWQ/GPTQ checkpoint
    quant_layout: str = ""  # how the checkpoint stores its format where the name does not say (reasons)
    architectures: tuple[str, ...] = ()  # config.json's Hugging Face class names (the runtime loads by them)


def facts_from_config(config: dict[str, Any]) -> ModelFacts:
    """ModelFacts from a config.json mapping; ModelFactsError names the missing key."""
    if not isinstance(config, dict):
        raise ModelFactsError("model config must be a mapping of config.json fields")
    text = config.get("text_config")
    merged = {**config, **text} if isinstance(text, dict) else dict(config)
    if "kv_lora_rank" in merged:
        raise ModelFactsError("multi-head latent attention (kv_lora_rank) models are not supported yet")
    layers = _int(merged, "num_hidden_layers")
    hidden = _int(merged, "hidden_size")
    heads = _int(merged, "num_attention_heads")
    kv_heads = _optional_int(merged, "num_key_value_heads") or heads
    head_dim = _optional_int(merged, "head_dim") or hidden // heads
    if heads % kv_heads:
        raise ModelFactsError(
            f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
        )
    model_type = str(merged.get("model_type", "unknown"))
    experts = (
        _optional_int(merged, "num_local_experts")
        or _optional_int(merged, "num_experts")
        or _optional_int(merged, "n_routed_experts")
        or 0
    )
    intermediate = (
        _optional_int(merged, "intermediate_size")
        or _optional_int(merged, "ffn_hidden_size")
        or _optional_int(merged, "n_inner")
        or 4 * hidden
    )
    qconfig = config.get("quantization_config") or merged.get("quantization_config")
    prequantized, group, bits = _quantization(qconfig)
    return ModelFacts(
        model_type=model_type,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=_int(merged, "vocab_size"),
        tie_embeddings=bool(merged.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
        max_positions=_optional_int(merged, "max_position_embeddings")
        or _optional_int(merged, "n_positions")
        or 2048,
        dtype=DTYPES.get(str(merged.get("torch_dtype") or merged.get("dtype") or "bfloat16"), "bf16"),
        gated_mlp=model_type not in UNGATED_MODEL_TYPES,
        attention_bias=bool(merged.get("attention_bias", model_type == "qwen2")),
        num_experts=experts,
        moe_intermediate_size=_optional_int(merged, "moe_intermediate_size")
        or (intermediate if experts else 0),
        experts_per_token=(_optional_int(merged, "num_experts_per_tok") or 2) if experts else 0,
        shared_expert_intermediate_size=_shared_expert_size(merged),
        dense_layers=_optional_int(merged, "first_k_dense_replace") or 0,
        prequantized=prequantized,
        quant_group_size=group,
        quant_bits=bits if bits in (4, 8) else 4,
        quant_layout=_layout(qconfig),
        architectures=tuple(str(a) for a in config.get("architectures") or () if isinstance(a, str)),
    )


def _int(config: dict[str, Any], key: str) -> int:
    value = _optional_int(config, key)
    if value is None:
        raise ModelFactsError(
            f"config.json has no {key}; paste the model's config.json into spec.model.config"
        )
    return value


def _optional_int(config: dict[str, Any], key: str) -> int | None:
    for name in ALIASES.get(key, (key,)):
        value = config.get(name)
        if value is None:
            continue
        if type(value) is not int or value <= 0:
            raise ModelFactsError(f"config.json {name} must be a positive integer, got {value!r}")
        return value
    return None


def _shared_expert_size(config: dict[str, Any]) -> int:
    size = _optional_int(config, "shared_expert_intermediate_size")
    if size:
        return size
    shared = _optional_int(config, "n_shared_experts") or 0
    return shared * (_optional_int(config, "moe_intermediate_size") or 0)


def _quantization(qconfig: Any) -> tuple[str | None, int, int]:
    """The checkpoint's weight format from quantization_config, its group size and its bits."""
    if not isinstance(qconfig, dict):
        return None, 128, 4
    method = str(qconfig.get("quant_method", "")).lower()
    group: int = qconfig["group_size"] if type(qconfig.get("group_size")) is int else 128
    if method in ("awq", "gptq"):
        _refuse_dynamic_overrides(qconfig)
        bits = qconfig.get("bits", qconfig.get("w_bit", 4))
        if bits == 8 and method == "gptq":
            return "gptq", group, 8
        if bits != 4:
            supported = "4 or 8" if method == "gptq" else "4"
            raise ModelFactsError(
                f"{method} checkpoints with {bits}-bit weights are not supported ({supported}-bit only)"
            )
        return method, group, 4
    if method in ("fp8", "fbgemm_fp8"):
        return "fp8", group, 4
    if method == "compressed-tensors":
        return _compressed_tensors(qconfig)
    if method == "modelopt":
        return _modelopt(qconfig)
    raise ModelFactsError(
        f"quantization_config.quant_method {method or '(none)'!r} is not supported; "
        "use an fp8, AWQ or GPTQ checkpoint (or a 16-bit one, quantized at load)"
    )


def _refuse_dynamic_overrides(qconfig: dict[str, Any]) -> None:
    """GPTQModel's `dynamic`: "-:" keys (modules left 16-bit) are served, per-module bits or groups are not
    (the runtime refuses them too: one reading, kvpilot.contracts.checkpoint_quant)."""
    try:
        gptq_dynamic_skips(qconfig)
    except ValueError as exc:
        raise ModelFactsError(str(exc)) from exc


def _modelopt(qconfig: dict[str, Any]) -> tuple[str, int, int]:
    """NVIDIA ModelOpt: its fp8 algorithms run as fp8 (the legacy layout nests them under 'quantization')."""
    algo = str(modelopt_fields(qconfig).get("quant_algo") or "").upper()
    if algo in MODELOPT_FP8_ALGOS:
        return "fp8", 128, 4
    raise ModelFactsError(
        f"NVIDIA ModelOpt quant_algo {algo or '(missing)'!r} is not supported; supported: "
        f"{', '.join(MODELOPT_FP8_ALGOS)}"
    )


def _compressed_tensors(qconfig: dict[str, Any]) -> tuple[str, int, int]:
    """float8 weights run as fp8; int4/int8 weights (pack-, int- or naive-quantized; W8A8 int8 checkpoints
    too, whose activations the runtime keeps 16-bit) as the gptq family, whose bytes they share (bits per
    weight plus a scale per group)."""
    for group in (qconfig.get("config_groups") or {}).values():
        weights = (group or {}).get("weights") or {}
        bits, kind = weights.get("num_bits"), weights.get("type")
        if bits == 8 and kind == "float":
            return "fp8", 128, 4
        activations = (group or {}).get("input_activations") or {}
        if bits in (4, 8) and kind == "int" and activations.get("type", "int") == "int":
            size = weights.get("group_size")
            return "gptq", size if type(size) is int and weights.get("strategy") == "group" else -1, bits
    raise ModelFactsError(
        "compressed-tensors checkpoint with an unsupported weight scheme (served: float8 weights, and "
        "int4/int8 weights with 16-bit or int8 activations; not float8 activations on int weights)"
    )


def _layout(qconfig: Any) -> str:
    """'compressed-tensors pack-quantized', 'block-wise [128, 128]' or '' (the family name says it all)."""
    if not isinstance(qconfig, dict):
        return ""
    method = str(qconfig.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        return f"compressed-tensors {qconfig.get('format') or 'quantized'}"
    if method == "modelopt":
        return f"NVIDIA ModelOpt {modelopt_fields(qconfig).get('quant_algo')}"
    block = qconfig.get("weight_block_size")
    return f"block-wise {block}" if block else ""
