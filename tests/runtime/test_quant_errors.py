"""Quantized checkpoints the runtime cannot run fail at start with one message naming the field."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from kvpilot.runtime.config import ModelConfig
from kvpilot.runtime.errors import ModelLoadError, UnsupportedModelError
from kvpilot.runtime.fixtures.quantized import make_quantized_checkpoint
from kvpilot.runtime.layers.kernel_ops import torch_ops
from kvpilot.runtime.llm import LLM
from kvpilot.runtime.loader import load_model
from kvpilot.runtime.quant.config import QuantConfig, parse_quant_config
from kvpilot.runtime.quant.fp8_method import Fp8Method
from safetensors.torch import load_file, save_file


def load(path: Path, quantization: str | None = None) -> torch.nn.Module:
    return load_model(
        path,
        ModelConfig.from_dir(path),
        device=torch.device("cpu"),
        dtype=torch.float32,
        ops=torch_ops(),
        quantization=quantization,
    )


def set_quant_config(path: Path, **changes: object) -> None:
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"].update(changes)
    (path / "config.json").write_text(json.dumps(config))


@pytest.fixture
def gptq_dir(tmp_path: Path) -> Path:
    return make_quantized_checkpoint(tmp_path / "gptq", "gptq", bits=4, group_size=32)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"quant_method": "bitsandbytes"}, ["quant_method", "bitsandbytes", "awq, gptq"]),
        ({"bits": 3}, ["quantization_config.bits 3", "supported: 4, 8"]),
        ({"group_size": 256}, ["group_size 256", "-1, 32, 64, 128"]),
        ({"checkpoint_format": "marlin"}, ["checkpoint_format", "gptq_v2"]),
        ({"lm_head": True}, ["quantization_config.lm_head", "lm_head false"]),
    ],
)
def test_unsupported_quantization_config(gptq_dir: Path, changes: dict, words: list[str]) -> None:
    set_quant_config(gptq_dir, **changes)
    with pytest.raises(UnsupportedModelError) as info:
        ModelConfig.from_dir(gptq_dir)
    assert all(w in str(info.value) for w in words), str(info.value)


def test_awq_versions_and_sizes_refused(tmp_path: Path) -> None:
    path = make_quantized_checkpoint(tmp_path / "awq", "awq", group_size=32)
    for changes, word in (
        ({"version": "gemv"}, "version"),
        ({"group_size": 16}, "group_size 16"),
        ({"bits": 8, "group_size": 32}, "bits 8"),
    ):
        set_quant_config(path, **changes)
        with pytest.raises(UnsupportedModelError, match=word):
            ModelConfig.from_dir(path)
        set_quant_config(path, version="gemm", group_size=32, bits=4)


def test_missing_tensor_is_named(gptq_dir: Path) -> None:
    weights = load_file(str(gptq_dir / "model.safetensors"))
    del weights["model.layers.1.mlp.up_proj.qzeros"]
    save_file(weights, str(gptq_dir / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"missing tensor\(s\) model.layers.1.mlp.up_proj.qzeros"):
        load(gptq_dir)


def test_shape_mismatch_is_named(gptq_dir: Path) -> None:
    weights = load_file(str(gptq_dir / "model.safetensors"))
    weights["model.layers.0.self_attn.o_proj.scales"] = weights["model.layers.0.self_attn.o_proj.scales"][:1]
    save_file(weights, str(gptq_dir / "model.safetensors"))
    with pytest.raises(ModelLoadError, match=r"tensor model.layers.0.self_attn.o_proj.scales: has shape"):
        load(gptq_dir)


def test_group_size_that_does_not_divide_the_layer(tmp_path: Path) -> None:
    path = make_quantized_checkpoint(tmp_path / "g", "gptq", bits=4, group_size=32)
    set_quant_config(path, group_size=128)  # the tiny model's 64-wide inputs
    with pytest.raises(ModelLoadError, match="group_size"):
        load(path)


def test_awq_or_gptq_forced_on_a_16_bit_checkpoint(tiny_checkpoint_factory: Callable) -> None:
    for method in ("awq", "gptq"):
        with pytest.raises(UnsupportedModelError, match="pre-quantized"):
            load(tiny_checkpoint_factory("qwen3"), method)


def test_forced_method_must_match_the_checkpoint(gptq_dir: Path) -> None:
    with pytest.raises(UnsupportedModelError, match="does not match the checkpoint"):
        load(gptq_dir, "int8")
    assert load(gptq_dir, "gptq") is not None


def test_fp8_on_a_gpu_without_fp8(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    quant = QuantConfig(method="fp8", from_checkpoint=False, bits=8)
    with pytest.raises(UnsupportedModelError, match=r"compute capability 8.9\+.*sm80"):
        Fp8Method(quant, torch.bfloat16, torch.device("cuda"), "triton")


def test_engine_start_reports_one_clear_error(gptq_dir: Path) -> None:
    set_quant_config(gptq_dir, bits=3)
    with pytest.raises(ModelLoadError, match="bits 3"):
        LLM(str(gptq_dir), device="cpu")


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (
            {"format": "marlin-24"},
            ["quantization_config.format 'marlin-24'", "pack-quantized, int-quantized"],
        ),
        ({"input_activations": {"num_bits": 8, "type": "float"}}, ["input_activations", "other than int8"]),
        ({"weights": {"group_size": 256}}, ["group_size 256", "32, 64, 128"]),
        ({"weights": {"strategy": "tensor", "group_size": None}}, ["strategy 'tensor'", "channel"]),
        ({"weights": {"num_bits": 3}}, ["num_bits 3, type 'int'", "num_bits 4 or 8 type int"]),
    ],
)
def test_compressed_tensors_int_schemes_refused(tmp_path: Path, change: dict, words: list[str]) -> None:
    path = make_quantized_checkpoint(tmp_path / "ct", "compressed-tensors-int", bits=4, group_size=32)
    config = json.loads((path / "config.json").read_text())
    qc = config["quantization_config"]
    group = qc["config_groups"]["group_0"]
    if "weights" in change:
        group["weights"].update(change["weights"])
    elif "format" in change:
        qc["format"] = change["format"]
    else:
        group.update(change)
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError) as info:
        ModelConfig.from_dir(path)
    assert all(w in str(info.value) for w in words), str(info.value)


def test_compressed_tensors_int_groups_must_agree_and_zero_points_must_be_there(tmp_path: Path) -> None:
    path = make_quantized_checkpoint(
        tmp_path / "ct", "compressed-tensors-int", bits=4, group_size=32, sym=False
    )
    config = json.loads((path / "config.json").read_text())
    groups = config["quantization_config"]["config_groups"]
    groups["group_1"] = json.loads(json.dumps(groups["group_0"]))
    groups["group_1"]["weights"]["group_size"] = 64
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="differ between groups"):
        ModelConfig.from_dir(path)
    del groups["group_1"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        UnsupportedModelError, match=r"which is gptq-quantized \(.*compressed-tensors 4-bit\)"
    ):
        load(path, "int4")
    weights = load_file(str(path / "model.safetensors"))
    del weights["model.layers.0.self_attn.k_proj.weight_zero_point"]
    save_file(weights, str(path / "model.safetensors"))
    with pytest.raises(
        ModelLoadError, match=r"missing tensor\(s\) model.layers.0.self_attn.k_proj.weight_zero_point"
    ):
        load(path)


@pytest.mark.parametrize("block", [[100, 128], [128], "128x128", [0, 128]])
def test_block_fp8_sizes_refused(tmp_path: Path, block: object) -> None:
    path = make_quantized_checkpoint(tmp_path / "b", "fp8", block=(32, 32))
    set_quant_config(path, weight_block_size=block)
    with pytest.raises(UnsupportedModelError) as info:
        ModelConfig.from_dir(path)
    assert "weight_block_size" in str(info.value) and "multiple of 16" in str(info.value)


def test_block_fp8_scale_of_the_wrong_shape_is_named(tmp_path: Path) -> None:
    path = make_quantized_checkpoint(tmp_path / "b", "fp8", block=(32, 32))
    set_quant_config(path, weight_block_size=[16, 32])  # the tensors hold 32-row blocks
    expected = r"down_proj.weight_scale_inv: has shape \(2, 4\), expected \(4, 4\) .*\[16, 32\]"
    with pytest.raises(ModelLoadError, match=expected):
        load(path)


def test_int8_activations_run_16_bit_and_say_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A W4A8 checkpoint (compressed-tensors int-quantized, int8 activations) loads; with no int4 x int8
    GEMM here its activations stay 16-bit (W8A8 with channel scales runs W8A8: test_int8_w8a8.py)."""
    path = make_quantized_checkpoint(
        tmp_path / "w4a8", "compressed-tensors-int", bits=4, group_size=32, ct_format="int-quantized",
        int8_activations="dynamic",
    )  # fmt: skip
    raw = ModelConfig.from_dir(path).quantization_config
    quant = parse_quant_config(raw, None)
    assert quant is not None and quant.int8_activations
    with caplog.at_level("WARNING"):
        load(path)
    assert "weight-only, with 16-bit activations" in caplog.text
