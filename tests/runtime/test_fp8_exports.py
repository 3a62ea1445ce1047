"""NVIDIA ModelOpt fp8 checkpoints (config.json `quant_method: modelopt`, or an older export's
hf_quant_config.json) and FBGEMM's (`quant_method: fbgemm_fp8`) load their weights exactly and serve; the
reference dequantization here reads the exported tensors directly (scale per tensor [], per channel [N] or
[N, 1], per block [N/128, 1, K/128, 1])."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from kvpilot.runtime.config import ModelConfig
from kvpilot.runtime.distributed.quant_sharding import quantized_split
from kvpilot.runtime.distributed.sharding import TensorSplit
from kvpilot.runtime.errors import ModelLoadError, UnsupportedModelError
from kvpilot.runtime.fixtures.fp8_exports import make_fbgemm_fp8_checkpoint, make_modelopt_checkpoint
from kvpilot.runtime.kernels.quant_reference import dequantize_fp8_blocks_ref, fp8_block_w8a8_ref
from kvpilot.runtime.layers.kernel_ops import torch_ops
from kvpilot.runtime.llm import LLM
from kvpilot.runtime.loader import load_model, read_split
from kvpilot.runtime.quant.config import parse_quant_config
from kvpilot.runtime.sampling_params import SamplingParams
from safetensors import safe_open
from safetensors.torch import load_file, save_file

PROMPTS = ["the cat sat on", "a quick brown fox"]
FUSED = {"self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"), "mlp.gate_up_proj": ("gate_proj", "up_proj")}


def reference_weight(tensors: dict[str, torch.Tensor], prefix: str) -> torch.Tensor:
    """W [N, K] float32 = fp8 weight times its ModelOpt scale, element by element."""
    w = tensors[prefix + "weight"].float()
    scale = tensors[prefix + "weight_scale"].float()
    if scale.dim() == 0:
        return w * scale
    if scale.dim() == 1 or scale.shape[1:] == (1,):
        return w * scale.reshape(-1, 1)
    rows, cols = torch.arange(w.shape[0]) // 128, torch.arange(w.shape[1]) // 128
    return w * scale[:, 0, :, 0][rows][:, cols]


def load_cpu(path: Path) -> torch.nn.Module:
    config = ModelConfig.from_dir(path)
    return load_model(path, config, device=torch.device("cpu"), dtype=torch.float32, ops=torch_ops())


def greedy_tokens(path: Path) -> list[list[int]]:
    llm = LLM(str(path), device="cpu", dtype="float32", max_model_len=128, kernel_backend="torch")
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    return [o.token_ids for o in llm.generate(PROMPTS, params)]


def loaded_weight(layer: torch.nn.Module) -> torch.Tensor:
    method = layer.quant_method
    if hasattr(method, "block_scale"):
        return dequantize_fp8_blocks_ref(method.weight, method.block_scale, method.scale_block)
    return method.weight.float() * method.weight_scale.view(-1, 1)


def assert_layer_1_loads_exactly(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Layer 1's fused q/k/v and gate/up weights are the reference dequantization of their parts."""
    for fused, parts in FUSED.items():
        layer = model.get_submodule(f"model.layers.1.{fused}")
        block = fused.split(".")[0]
        want = torch.cat([reference_weight(tensors, f"model.layers.1.{block}.{p}.") for p in parts])
        assert torch.equal(loaded_weight(layer), want)


@pytest.mark.parametrize("legacy", [False, True], ids=["config-json", "hf-quant-config"])
@pytest.mark.parametrize("algo", ["FP8", "FP8_PER_CHANNEL_PER_TOKEN", "FP8_PB_WO"])
def test_modelopt_weights_load_exactly_and_serve(algo: str, legacy: bool, tmp_path: Path) -> None:
    path = make_modelopt_checkpoint(tmp_path / "m", algo, legacy=legacy, seed=3)
    tensors = load_file(str(path / "model.safetensors"))
    assert any(name.endswith("k_proj.k_scale") for name in tensors)  # read and unused
    model = load_cpu(path)
    assert_layer_1_loads_exactly(model, tensors)
    assert all(len(tokens) == 8 for tokens in greedy_tokens(path))


def test_block_wise_modelopt_serves_its_dequantized_model(tmp_path: Path) -> None:
    """FP8_PB_WO on this tiny model runs weight-only throughout (K holds too few 128 blocks for
    _scaled_mm's block scaling), so its tokens are exactly the dequantized float model's."""
    path = make_modelopt_checkpoint(tmp_path / "m", "FP8_PB_WO", seed=3)
    tensors = load_file(str(path / "model.safetensors"))
    floats = {n: t.float() for n, t in tensors.items() if not n.endswith(("weight_scale", "_scale"))}
    for name in [n for n in floats if n + "_scale" in tensors]:
        floats[name] = reference_weight(tensors, name[: -len("weight")])
    reference = tmp_path / "deq"
    reference.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (reference / name).write_bytes((path / name).read_bytes())
    config = json.loads((path / "config.json").read_text())
    del config["quantization_config"]
    (reference / "config.json").write_text(json.dumps({**config, "torch_dtype": "float32"}))
    save_file(floats, str(reference / "model.safetensors"), metadata={"format": "pt"})
    assert greedy_tokens(path) == greedy_tokens(reference)


def test_block_wise_modelopt_runs_w8a8_where_k_holds_four_blocks(tmp_path: Path) -> None:
    """Hidden 512 = 4 blocks of 128 along K: above 16 tokens the layers run W8A8 on ModelOpt's scales."""
    wide = {"hidden_size": 512, "intermediate_size": 1024}
    heads = {"num_attention_heads": 16, "num_key_value_heads": 4}
    path = make_modelopt_checkpoint(tmp_path / "m", "FP8_PB_WO", **wide, **heads)
    tensors = load_file(str(path / "model.safetensors"))
    layer = load_cpu(path).get_submodule("model.layers.1.self_attn.o_proj")
    method = layer.quant_method
    assert method.w8a8 and method.block_scale.shape == (4, 4)
    want = reference_weight(tensors, "model.layers.1.self_attn.o_proj.")
    x = torch.randn(17, 512, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(layer(x), fp8_block_w8a8_ref(x, method.weight, method.block_scale))
    assert float((layer(x) - x @ want.t()).norm() / (x @ want.t()).norm()) < 0.06


def test_exclude_modules_wildcards_keep_layers_16_bit(tmp_path: Path) -> None:
    keep = tuple(f"model.layers.1.mlp.{p}_proj" for p in ("gate", "up", "down"))
    wildcard = ("model.layers.1.mlp*",)
    path = make_modelopt_checkpoint(tmp_path / "m", legacy=True, keep_16bit=keep, exclude=wildcard)
    model = load_cpu(path)
    assert model.get_submodule("model.layers.1.mlp.gate_up_proj").quant_method is None
    assert model.get_submodule("model.layers.1.mlp.down_proj").quant_method is None
    assert model.get_submodule("model.layers.0.mlp.down_proj").quant_method is not None
    assert model.get_submodule("model.layers.1.self_attn.o_proj").quant_method is not None


def test_fbgemm_fp8_loads_exactly_and_keeps_modules_to_not_convert_16_bit(tmp_path: Path) -> None:
    keep = tuple(f"model.layers.0.self_attn.{p}_proj" for p in "qkvo")  # as Meta leaves attention layers
    path = make_fbgemm_fp8_checkpoint(tmp_path / "m", keep_16bit=keep, seed=3)
    tensors = load_file(str(path / "model.safetensors"))
    model = load_cpu(path)
    assert model.get_submodule("model.layers.0.self_attn.qkv_proj").quant_method is None
    assert model.get_submodule("model.layers.0.self_attn.o_proj").quant_method is None
    assert_layer_1_loads_exactly(model, tensors)
    assert all(len(tokens) == 8 for tokens in greedy_tokens(path))


def test_unsupported_algorithms_and_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModelError) as err:
        parse_quant_config({"quant_method": "modelopt", "quant_algo": "NVFP4"}, None)
    assert "quant_algo 'NVFP4' (NVIDIA ModelOpt) is not supported; supported: FP8," in str(err.value)
    path = make_modelopt_checkpoint(tmp_path / "m", legacy=True)
    (path / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}}))
    with pytest.raises(UnsupportedModelError, match=r"hf_quant_config\.json holds no 'quantization' object"):
        ModelConfig.from_dir(path)
    with pytest.raises(UnsupportedModelError, match="--quantization int8 does not match the checkpoint"):
        parse_quant_config({"quant_method": "modelopt", "quant_algo": "FP8"}, "int8")


def test_quantized_tensors_without_a_quantization_config_are_refused(tmp_path: Path) -> None:
    """fp8 weights cast to 16-bit without their scales would serve garbage: loading stops instead."""
    path = make_modelopt_checkpoint(tmp_path / "m", legacy=True)
    (path / "hf_quant_config.json").unlink()
    with pytest.raises(ModelLoadError) as err:
        load_cpu(path)
    assert "holds float8_e4m3fn values, but config.json declares no quantization" in str(err.value)


def test_block_scales_split_for_tensor_parallel_along_their_k_axis(tmp_path: Path) -> None:
    """A row-parallel rank reads its K blocks from ModelOpt's [N/128, 1, K/128, 1] scale (axis 2)."""
    quant = parse_quant_config({"quant_method": "modelopt", "quant_algo": "FP8_PB_WO"}, None)
    assert quant is not None and quant.fp8_block == (128, 128)
    scale = torch.arange(2 * 4, dtype=torch.float32).reshape(2, 1, 4, 1)
    save_file({"s": scale}, str(tmp_path / "s.safetensors"))
    split = quantized_split(quant, "weight_scale", (2, 1, 4, 1), TensorSplit(1, 256, 256, whole=512))
    assert split is not None and (split.dim, split.start, split.length) == (2, 2, 2)
    with safe_open(str(tmp_path / "s.safetensors"), "pt") as f:
        assert torch.equal(read_split(f.get_slice("s"), split), scale[:, :, 2:4])
    rows = quantized_split(quant, "weight_scale", (2, 1, 4, 1), TensorSplit(0, 128, 128, whole=256))
    assert rows is not None and (rows.dim, rows.start, rows.length) == (0, 1, 1)
