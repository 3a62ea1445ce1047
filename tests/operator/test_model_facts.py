"""Model facts come from config.json with Hugging Face's key names; bad configs get a clear error."""

from __future__ import annotations

from typing import Any

import pytest
from kvpilot.operator.planning.model_facts import ModelFactsError, facts_from_config


def test_qwen3_8b(model_configs: dict[str, dict[str, Any]]) -> None:
    facts = facts_from_config(model_configs["Qwen/Qwen3-8B"])
    assert (facts.num_layers, facts.hidden_size, facts.num_heads, facts.num_kv_heads, facts.head_dim) == (
        36,
        4096,
        32,
        8,
        128,
    )
    assert (facts.intermediate_size, facts.vocab_size, facts.max_positions) == (12288, 151936, 40960)
    assert facts.tie_embeddings is False and facts.dtype == "bf16" and facts.gated_mlp
    assert facts.prequantized is None and facts.num_experts == 0


def test_head_dim_defaults_to_hidden_over_heads(model_configs: dict[str, dict[str, Any]]) -> None:
    facts = facts_from_config(model_configs["Qwen/Qwen2.5-7B-Instruct"])
    assert facts.head_dim == 3584 // 28 == 128
    assert facts.attention_bias  # qwen2 has q/k/v biases


def test_kv_heads_default_to_heads() -> None:
    config = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10}
    facts = facts_from_config(config)
    assert facts.num_kv_heads == 4 and facts.intermediate_size == 256 and facts.max_positions == 2048


def test_fp16_and_fp32_checkpoints(model_configs: dict[str, dict[str, Any]]) -> None:
    assert facts_from_config(model_configs["meta-llama/Llama-2-7b-hf"]).dtype == "fp16"
    fp32 = {**model_configs["Qwen/Qwen3-8B"], "torch_dtype": "float32"}
    assert facts_from_config(fp32).dtype == "bf16"


def test_text_config_of_a_multimodal_model() -> None:
    config = {
        "model_type": "qwen3_vl",
        "vision_config": {"depth": 24},
        "text_config": {
            "num_hidden_layers": 36,
            "hidden_size": 2560,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "vocab_size": 151936,
            "intermediate_size": 9728,
            "dtype": "bfloat16",
            "tie_word_embeddings": True,
        },
    }
    facts = facts_from_config(config)
    assert (facts.num_layers, facts.hidden_size, facts.tie_embeddings) == (36, 2560, True)


def test_gpt2_style_aliases() -> None:
    facts = facts_from_config(
        {
            "model_type": "gpt2",
            "n_layer": 12,
            "n_embd": 768,
            "n_head": 12,
            "vocab_size": 50257,
            "n_positions": 1024,
        }
    )
    assert (facts.num_layers, facts.hidden_size, facts.max_positions) == (12, 768, 1024)
    assert not facts.gated_mlp


def test_mixture_of_experts(model_configs: dict[str, dict[str, Any]]) -> None:
    facts = facts_from_config(model_configs["mistralai/Mixtral-8x7B-Instruct-v0.1"])
    assert (facts.num_experts, facts.experts_per_token, facts.moe_intermediate_size) == (8, 2, 14336)


def test_prequantized_checkpoints(model_configs: dict[str, dict[str, Any]]) -> None:
    awq = facts_from_config(model_configs["Qwen/Qwen2.5-72B-Instruct-AWQ"])
    assert (awq.prequantized, awq.quant_group_size, awq.dtype) == ("awq", 128, "fp16")
    base = model_configs["Qwen/Qwen3-8B"]
    gptq_config = {"quant_method": "gptq", "bits": 4, "group_size": 64}
    gptq = facts_from_config({**base, "quantization_config": gptq_config})
    assert (gptq.prequantized, gptq.quant_group_size) == ("gptq", 64)
    fp8 = facts_from_config({**base, "quantization_config": {"quant_method": "fp8"}})
    assert fp8.prequantized == "fp8"
    qwen3_fp8 = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}  # Qwen/Qwen3-8B-FP8
    assert facts_from_config({**base, "quantization_config": qwen3_fp8}).prequantized == "fp8"
    w4a16 = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128, "symmetric": True}
    ct = {"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": w4a16}}}
    ct4 = facts_from_config({**base, "quantization_config": ct})  # llm-compressor's W4A16: gptq family
    assert (ct4.prequantized, ct4.quant_group_size, ct4.quant_bits) == ("gptq", 128, 4)
    w8a16 = {"num_bits": 8, "type": "int", "strategy": "channel"}
    ct["config_groups"] = {"group_0": {"weights": w8a16, "input_activations": None}}
    ct8 = facts_from_config({**base, "quantization_config": ct})
    assert (ct8.prequantized, ct8.quant_group_size, ct8.quant_bits) == ("gptq", -1, 8)
    ct["config_groups"]["group_0"]["input_activations"] = {"num_bits": 8, "type": "int", "dynamic": True}
    w8a8 = facts_from_config({**base, "quantization_config": ct})  # W8A8 int8: served, weights 8-bit
    assert (w8a8.prequantized, w8a8.quant_bits) == ("gptq", 8)
    ct["config_groups"]["group_0"]["input_activations"] = {"num_bits": 8, "type": "float"}
    with pytest.raises(ModelFactsError, match="not float8 activations on int weights"):
        facts_from_config({**base, "quantization_config": ct})
    gptq8 = facts_from_config({**base, "quantization_config": {**gptq_config, "bits": 8}})
    assert (gptq8.prequantized, gptq8.quant_bits) == ("gptq", 8)
    skips = {**gptq_config, "dynamic": {r"-:.*\.0\..*": {}, r"+:.*down": {"group_size": 64}}}
    assert facts_from_config({**base, "quantization_config": skips}).prequantized == "gptq"
    mixed_bits = {**gptq_config, "dynamic": {r".*down_proj": {"bits": 8}}}  # GPTQModel per-module override
    with pytest.raises(ModelFactsError, match=r"sets \{'bits': 8\} for the modules it matches"):
        facts_from_config({**base, "quantization_config": mixed_bits})


def test_modelopt_and_fbgemm_fp8_checkpoints(model_configs: dict[str, dict[str, Any]]) -> None:
    """NVIDIA ModelOpt's fp8 algorithms plan as fp8, in both config layouts; its 4-bit ones are refused."""
    base = model_configs["Qwen/Qwen3-8B"]
    flat = {"quant_method": "modelopt", "quant_algo": "FP8", "ignore": ["lm_head"]}
    facts = facts_from_config({**base, "quantization_config": flat})
    assert (facts.prequantized, facts.quant_layout) == ("fp8", "NVIDIA ModelOpt FP8")
    fbgemm = {"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0}  # meta-llama/*-FP8
    assert facts_from_config({**base, "quantization_config": fbgemm}).prequantized == "fp8"
    nested = {"quant_method": "modelopt", "quantization": {"quant_algo": "fp8_pb_wo"}}
    assert facts_from_config({**base, "quantization_config": nested}).prequantized == "fp8"
    with pytest.raises(ModelFactsError, match="ModelOpt quant_algo 'NVFP4' is not supported; supported: FP8"):
        facts_from_config({**base, "quantization_config": {**flat, "quant_algo": "NVFP4"}})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_hidden_layers": None}, "config.json has no num_hidden_layers; paste the model's config.json"),
        ({"vocab_size": None}, "config.json has no vocab_size"),
        ({"num_attention_heads": "32"}, "num_attention_heads must be a positive integer, got '32'"),
        ({"hidden_size": 0}, "hidden_size must be a positive integer"),
        ({"num_key_value_heads": 5}, "not a multiple of num_key_value_heads 5"),
        ({"kv_lora_rank": 512}, "multi-head latent attention"),
        ({"quantization_config": {"quant_method": "bitsandbytes"}}, "'bitsandbytes' is not supported"),
        ({"quantization_config": {"quant_method": "awq", "bits": 3}}, "3-bit weights are not supported"),
    ],
)
def test_bad_configs_say_what_is_wrong(
    model_configs: dict[str, dict[str, Any]], change: dict[str, Any], message: str
) -> None:
    config = {k: v for k, v in {**model_configs["Qwen/Qwen3-8B"], **change}.items() if v is not None}
    with pytest.raises(ModelFactsError) as caught:
        facts_from_config(config)
    assert message in str(caught.value)


def test_not_a_mapping() -> None:
    with pytest.raises(ModelFactsError, match="must be a mapping"):
        facts_from_config(["num_hidden_layers", 2])  # type: ignore[arg-type]
