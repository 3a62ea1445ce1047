"""ModelConfig parsing, the HF -> fused name mapping, and every way a checkpoint can be unloadable."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from kvpilot.runtime.config import ModelConfig
from kvpilot.runtime.errors import ModelLoadError, UnsupportedModelError
from kvpilot.runtime.layers.kernel_ops import torch_ops
from kvpilot.runtime.loader import checkpoint_to_param, load_model, param_to_checkpoint
from safetensors.torch import load_file, save_file

CPU = torch.device("cpu")


def load(path: Path) -> torch.nn.Module:
    return load_model(path, ModelConfig.from_dir(path), device=CPU, dtype=torch.float32, ops=torch_ops())


def edit_config(path: Path, **changes: object) -> None:
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("family", "qkv_bias", "qk_norm", "tied", "kv_heads", "head_dim"),
    [
        ("llama2", False, False, False, 4, 16),
        ("llama3", False, False, False, 2, 16),
        ("qwen2", True, False, True, 2, 16),
        ("qwen3", False, True, True, 2, 32),
    ],
)
def test_config_from_dir(
    family: str,
    qkv_bias: bool,
    qk_norm: bool,
    tied: bool,
    kv_heads: int,
    head_dim: int,
    tiny_checkpoint_factory: Callable,
) -> None:
    config = ModelConfig.from_dir(tiny_checkpoint_factory(family))
    assert (config.attention_bias, config.qk_norm, config.tie_word_embeddings) == (qkv_bias, qk_norm, tied)
    assert (config.num_key_value_heads, config.head_dim) == (kv_heads, head_dim)
    assert config.torch_dtype == "float32"
    assert config.o_proj_bias is False
    assert (config.rope_scaling or {}).get("rope_type") == ("llama3" if family == "llama3" else None)


def test_transformers5_rope_parameters_read_like_classic_keys(llama3_checkpoint: Path) -> None:
    classic = json.loads((llama3_checkpoint / "config.json").read_text())
    modern = {k: v for k, v in classic.items() if k not in ("rope_theta", "rope_scaling")}
    modern["rope_parameters"] = {**classic["rope_scaling"], "rope_theta": classic["rope_theta"]}
    modern["dtype"] = modern.pop("torch_dtype")
    assert ModelConfig.from_dict(modern) == ModelConfig.from_dict(classic)


def test_llama_attention_bias_also_biases_o_proj_but_qwen2_never_does() -> None:
    base = {
        "vocab_size": 8,
        "hidden_size": 8,
        "intermediate_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
    }
    llama = ModelConfig.from_dict({**base, "architectures": ["LlamaForCausalLM"], "attention_bias": True})
    qwen2 = ModelConfig.from_dict({**base, "architectures": ["Qwen2ForCausalLM"]})
    assert (llama.attention_bias, llama.o_proj_bias) == (True, True)
    assert (qwen2.attention_bias, qwen2.o_proj_bias) == (True, False)
    assert llama.num_key_value_heads == 2 and llama.head_dim == 4  # defaults: MHA, hidden / heads


def test_name_mapping_round_trips() -> None:
    assert checkpoint_to_param("model.layers.3.self_attn.k_proj.bias") == (
        "model.layers.3.self_attn.qkv_proj.bias",
        1,
    )
    assert checkpoint_to_param("model.layers.0.mlp.up_proj.weight") == (
        "model.layers.0.mlp.gate_up_proj.weight",
        1,
    )
    assert checkpoint_to_param("model.norm.weight") == ("model.norm.weight", None)
    for name in [
        "model.layers.1.self_attn.q_proj.weight",
        "model.layers.1.self_attn.v_proj.bias",
        "model.layers.1.mlp.gate_proj.weight",
        "lm_head.weight",
    ]:
        assert param_to_checkpoint(*checkpoint_to_param(name)) == name


def test_fused_weights_are_the_concatenated_checkpoint_tensors(qwen2_checkpoint: Path) -> None:
    model = load(qwen2_checkpoint)
    tensors = load_file(qwen2_checkpoint / "model.safetensors")
    attn, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    p = "model.layers.1."
    qkv = [tensors[f"{p}self_attn.{n}_proj.weight"] for n in "qkv"]
    assert torch.equal(attn.qkv_proj.weight, torch.cat(qkv))
    assert torch.equal(attn.qkv_proj.bias, torch.cat([tensors[f"{p}self_attn.{n}_proj.bias"] for n in "qkv"]))
    gate_up = [tensors[f"{p}mlp.{n}_proj.weight"] for n in ("gate", "up")]
    assert torch.equal(mlp.gate_up_proj.weight, torch.cat(gate_up))
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied
    assert torch.equal(model.lm_head.weight, tensors["model.embed_tokens.weight"])


def test_untied_lm_head_is_its_own_tensor(llama2_checkpoint: Path) -> None:
    model = load(llama2_checkpoint)
    tensors = load_file(llama2_checkpoint / "model.safetensors")
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    assert torch.equal(model.lm_head.weight, tensors["lm_head.weight"])


def test_missing_config(qwen3_checkpoint: Path, copy_checkpoint: Callable) -> None:
    path = copy_checkpoint(qwen3_checkpoint)
    (path / "config.json").unlink()
    with pytest.raises(ModelLoadError, match=r"config\.json not found"):
        ModelConfig.from_dir(path)
    with pytest.raises(ModelLoadError, match="does not exist"):
        ModelConfig.from_dir(path / "nope")


def test_unparseable_config(qwen3_checkpoint: Path, copy_checkpoint: Callable) -> None:
    path = copy_checkpoint(qwen3_checkpoint)
    (path / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match=r"cannot read .*config\.json"):
        ModelConfig.from_dir(path)


def test_unsupported_architecture_names_the_supported_ones(
    qwen3_checkpoint: Path, copy_checkpoint: Callable
) -> None:
    path = copy_checkpoint(qwen3_checkpoint)
    edit_config(path, architectures=["MambaForCausalLM"])
    with pytest.raises(UnsupportedModelError, match="MambaForCausalLM is not supported") as info:
        ModelConfig.from_dir(path)
    for name in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope scaling type 'yarn'"),
        (
            {"quantization_config": {"quant_method": "bitsandbytes"}},
            "quant_method .bitsandbytes. is not supported",
        ),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"use_sliding_window": True}, "sliding-window"),
    ],
)
def test_unsupported_features(changes: dict, message: str, qwen3_checkpoint: Path) -> None:
    raw = {**json.loads((qwen3_checkpoint / "config.json").read_text()), **changes}
    with pytest.raises(UnsupportedModelError, match=message):
        ModelConfig.from_dict(raw)


def test_bad_head_counts_and_missing_fields(qwen3_checkpoint: Path) -> None:
    raw = json.loads((qwen3_checkpoint / "config.json").read_text())
    with pytest.raises(ModelLoadError, match=r"num_attention_heads \(4\) must be a multiple"):
        ModelConfig.from_dict({**raw, "num_key_value_heads": 3})
    with pytest.raises(ModelLoadError, match=r"lacks required integer field.*hidden_size"):
        ModelConfig.from_dict({k: v for k, v in raw.items() if k != "hidden_size"})


def test_missing_weights(qwen3_checkpoint: Path, copy_checkpoint: Callable) -> None:
    path = copy_checkpoint(qwen3_checkpoint)
    (path / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"no weights .*model\.safetensors"):
        load(path)
    torch.save({}, path / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="safetensors only"):
        load(path)


def test_corrupt_weights_name_the_file(qwen3_checkpoint: Path, copy_checkpoint: Callable) -> None:
    path = copy_checkpoint(qwen3_checkpoint)
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])  # truncated download
    with pytest.raises(ModelLoadError, match=r"cannot read weights file model\.safetensors"):
        load(path)
    (path / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(ModelLoadError, match=r"cannot read weights file model\.safetensors"):
        load(path)


def test_incomplete_checkpoint_names_the_missing_tensor(
    qwen3_checkpoint: Path, copy_checkpoint: Callable
) -> None:
    path = copy_checkpoint(qwen3_checkpoint)
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"], tensors["model.layers.0.self_attn.k_norm.weight"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ModelLoadError, match="incomplete") as info:
        load(path)
    assert "model.layers.1.self_attn.k_proj.weight" in str(info.value)
    assert "model.layers.0.self_attn.k_norm.weight" in str(info.value)


def test_wrong_shape_names_the_tensor(llama2_checkpoint: Path, copy_checkpoint: Callable) -> None:
    path = copy_checkpoint(llama2_checkpoint)
    tensors = load_file(path / "model.safetensors")
    tensors["model.layers.0.mlp.up_proj.weight"] = torch.zeros(3, 64)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"model\.layers\.0\.mlp\.up_proj\.weight has shape \(3, 64\)"):
        load(path)


def test_sharded_index_with_a_missing_shard(
    tiny_checkpoint_factory: Callable, copy_checkpoint: Callable
) -> None:
    path = copy_checkpoint(tiny_checkpoint_factory("llama3", shards=2))
    (path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"missing: model-00002-of-00002\.safetensors"):
        load(path)


def test_unexpected_tensors_are_ignored(qwen3_checkpoint: Path, copy_checkpoint: Callable) -> None:
    path = copy_checkpoint(qwen3_checkpoint)
    tensors = load_file(path / "model.safetensors")
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(16)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()  # tied, but stored anyway
    save_file(tensors, path / "model.safetensors")
    model = load(path)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_static_kv_cache_scales_are_accepted_without_a_warning(
    qwen3_checkpoint: Path, copy_checkpoint: Callable, caplog: pytest.LogCaptureFixture
) -> None:
    """llm-compressor writes per-layer k_scale/v_scale; the 8-bit cache computes finer per-token-head scales,
    so they load silently and change nothing. An unknown tensor still gets its warning."""
    path = copy_checkpoint(qwen3_checkpoint)
    tensors = load_file(path / "model.safetensors")
    scales = {f"model.layers.0.self_attn.{n}": torch.tensor(0.02) for n in ("k_scale", "v_scale")}
    save_file(
        {**tensors, **scales, "model.layers.0.mystery.weight": torch.zeros(2)}, path / "model.safetensors"
    )
    with caplog.at_level("WARNING"):
        model = load(path)
    warned = [r.getMessage() for r in caplog.records if "ignoring unexpected" in r.getMessage()]
    assert warned == ["ignoring unexpected checkpoint tensor model.layers.0.mystery.weight"]
    reference = load(qwen3_checkpoint)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters(), strict=True))
