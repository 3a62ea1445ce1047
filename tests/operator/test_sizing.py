"""Byte arithmetic against published parameter counts and the seeds' KV example."""

from __future__ import annotations

from typing import Any

import pytest
from kvpilot.operator.planning.model_facts import facts_from_config
from kvpilot.operator.planning.sizing import (
    BLOCK_SIZE,
    GIB,
    NCCL_BYTES,
    kv_bytes_per_token,
    kv_cache_tokens,
    linear_bytes,
    param_counts,
    weight_bytes,
    weight_bytes_per_gpu,
    workspace_bytes,
)

# Parameter counts as published on the model cards / safetensors metadata (billions).
PUBLISHED = {
    "Qwen/Qwen3-0.6B": 0.596,
    "Qwen/Qwen3-8B": 8.19,
    "Qwen/Qwen2.5-7B-Instruct": 7.62,
    "Qwen/Qwen2.5-72B-Instruct": 72.7,
    "meta-llama/Llama-2-7b-hf": 6.74,
    "meta-llama/Llama-3.3-70B-Instruct": 70.6,
    "meta-llama/Llama-3.1-405B-Instruct": 405.9,
    "mistralai/Mixtral-8x7B-Instruct-v0.1": 46.7,
}


@pytest.mark.parametrize("repo", sorted(PUBLISHED))
def test_parameter_count_matches_the_model_card(model_configs: dict[str, dict[str, Any]], repo: str) -> None:
    total = param_counts(facts_from_config(model_configs[repo])).total / 1e9
    assert total == pytest.approx(PUBLISHED[repo], rel=0.005)


def test_seeds_kv_example_is_4_gib() -> None:
    """32 layers, 32 KV heads, head_dim 128, 8192 tokens, fp16: 2 x 32 x 32 x 128 x 2 B x 8192 = 4.00 GiB."""
    facts = facts_from_config(
        {
            "num_hidden_layers": 32,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "vocab_size": 32000,
            "torch_dtype": "float16",
        }
    )
    assert kv_bytes_per_token(facts, "fp16") == 2 * 32 * 32 * 128 * 2 == 512 * 1024
    assert kv_bytes_per_token(facts, "fp16") * 8192 == 4 * GIB


def test_kv_per_token_of_design_models(model_configs: dict[str, dict[str, Any]]) -> None:
    assert kv_bytes_per_token(facts_from_config(model_configs["Qwen/Qwen3-8B"]), "bf16") == 144 * 1024
    assert kv_bytes_per_token(facts_from_config(model_configs["Qwen/Qwen3-0.6B"]), "bf16") == 112 * 1024


def test_8bit_kv_halves_elements_and_adds_one_scale_per_head_vector(
    model_configs: dict[str, dict[str, Any]],
) -> None:
    facts = facts_from_config(model_configs["Qwen/Qwen3-8B"])
    vectors = 2 * 36 * 8
    for dtype in ("fp8", "int8"):
        assert kv_bytes_per_token(facts, dtype) == vectors * (128 + 4)
    assert kv_bytes_per_token(facts, "bf16") == vectors * 256


def test_kv_per_gpu_splits_heads_over_tp_and_layers_over_pp(model_configs: dict[str, dict[str, Any]]) -> None:
    facts = facts_from_config(model_configs["Qwen/Qwen2.5-72B-Instruct"])  # 80 layers, 8 KV heads
    whole = kv_bytes_per_token(facts, "bf16")
    assert kv_bytes_per_token(facts, "bf16", tp=4) == whole // 4
    assert kv_bytes_per_token(facts, "bf16", pp=3) == whole * 27 // 80  # ceil(80 / 3) = 27 layers


def test_weight_formats(model_configs: dict[str, dict[str, Any]]) -> None:
    facts = facts_from_config(model_configs["Qwen/Qwen2.5-72B-Instruct"])
    params = param_counts(facts)
    n = params.layer_linear
    assert linear_bytes(params, "none") == 2 * n
    assert linear_bytes(params, "fp8") == n + 4 * params.out_channels == linear_bytes(params, "int8")
    awq = linear_bytes(params, "awq")
    assert awq == n // 2 + (n // 128) * 4  # 4-bit + 16-bit scale and zero per 128 (the runtime's layout)
    assert linear_bytes(params, "gptq") == awq == linear_bytes(params, "int4")
    assert linear_bytes(params, "gptq", 128, bits=8) == n + (n // 128) * 4
    vocab_and_norms = 2 * (params.embedding + params.lm_head + params.layer_other)
    assert weight_bytes(facts, "none") == 2 * params.total
    assert weight_bytes(facts, "awq") == awq + vocab_and_norms
    assert 39 * GIB < weight_bytes(facts, "awq") < 40 * GIB
    with pytest.raises(ValueError, match="unknown quantization"):
        linear_bytes(params, "int3")


def test_weights_per_gpu(model_configs: dict[str, dict[str, Any]]) -> None:
    facts = facts_from_config(model_configs["meta-llama/Llama-3.3-70B-Instruct"])
    whole = weight_bytes(facts, "none")
    assert weight_bytes_per_gpu(facts, "none", 1, 1) == whole
    assert weight_bytes_per_gpu(facts, "none", 4, 1) == pytest.approx(whole / 4, abs=1)
    two_stages = weight_bytes_per_gpu(facts, "none", 1, 2)
    one_vocab = 2 * param_counts(facts).embedding
    assert two_stages == pytest.approx((whole - 2 * one_vocab) / 2 + one_vocab, abs=1)


def test_tied_embedding_counts_once(model_configs: dict[str, dict[str, Any]]) -> None:
    tied = param_counts(facts_from_config(model_configs["Qwen/Qwen3-0.6B"]))
    assert tied.lm_head == 0 and tied.embedding == 151936 * 1024


def test_workspace_grows_with_batch_and_communication(model_configs: dict[str, dict[str, Any]]) -> None:
    facts = facts_from_config(model_configs["Qwen/Qwen3-8B"])
    small = workspace_bytes(facts, 1, 1, 2048, 256)
    assert workspace_bytes(facts, 1, 1, 8192, 256) > small
    assert workspace_bytes(facts, 2, 1, 0, 0) - workspace_bytes(facts, 1, 1, 0, 0) == NCCL_BYTES
    assert workspace_bytes(facts, 1, 2, 0, 0) - workspace_bytes(facts, 1, 1, 0, 0) == NCCL_BYTES
    assert 1 * GIB < small < 2 * GIB


def test_kv_cache_tokens_are_whole_blocks() -> None:
    assert kv_cache_tokens(100 * 1000 + 999, 1000) == 96  # 100 tokens -> 6 blocks of 16
    assert kv_cache_tokens(-5, 1000) == 0
    assert kv_cache_tokens(BLOCK_SIZE * 10, 10) == BLOCK_SIZE
