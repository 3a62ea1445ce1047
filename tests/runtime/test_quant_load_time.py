"""--quantization int8 / int4 / fp8 on a 16-bit checkpoint: int8 and int4 serve exactly the tokens of the
float model whose weights are the documented round-to-nearest values (computed here independently)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from kvpilot.runtime.config import ModelConfig
from kvpilot.runtime.errors import ModelLoadError
from kvpilot.runtime.kernels.quant_reference import dequantize_int_ref, pack_rows, unpack_rows
from kvpilot.runtime.layers.kernel_ops import torch_ops
from kvpilot.runtime.llm import LLM
from kvpilot.runtime.loader import load_model
from kvpilot.runtime.quant.config import int4_group_size
from kvpilot.runtime.quant.int_weight import from_unpacked
from kvpilot.runtime.sampling_params import SamplingParams
from safetensors.torch import load_file, save_file

PROMPTS = ["the cat sat on", "a quick brown fox", "hello world"]
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def rtn_int8(w: torch.Tensor) -> torch.Tensor:
    """Symmetric per output row: q in [-127, 127], W ~ q * absmax / 127."""
    scale = w.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127
    return torch.round(w / scale).clamp(-127, 127) * scale


def rtn_int4(w: torch.Tensor, group: int) -> torch.Tensor:
    """Asymmetric per (row, group of inputs): [min(lo, 0), max(hi, 0)] onto 0..15 with an integer zero."""
    n, k = w.shape
    g = w.reshape(n, k // group, group)
    lo = g.amin(dim=2, keepdim=True).clamp(max=0)
    hi = g.amax(dim=2, keepdim=True).clamp(min=0)
    scale = ((hi - lo) / 15).clamp(min=1e-8)
    zero = torch.round(-lo / scale).clamp(0, 15)
    q = torch.round(g / scale + zero).clamp(0, 15)
    return ((q - zero) * scale).reshape(n, k)


def write_rtn_model(source: Path, out: Path, mode: str) -> Path:
    shutil.copytree(source, out)
    weights = load_file(str(out / "model.safetensors"))
    for name, w in weights.items():
        if name.split(".")[-2] in PROJ and name.endswith(".weight"):
            w = w.float()
            weights[name] = rtn_int8(w) if mode == "int8" else rtn_int4(w, int4_group_size(w.shape[1]))
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def greedy(model_dir: Path, **kw: object) -> list[list[int]]:
    llm = LLM(str(model_dir), device="cpu", dtype="float32", max_model_len=128, kernel_backend="torch", **kw)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    return [o.token_ids for o in llm.generate(PROMPTS, params)]


@pytest.mark.parametrize(
    ("mode", "family"), [("int8", "qwen3"), ("int4", "qwen3"), ("int4", "llama2"), ("int8", "qwen2")]
)
def test_load_time_quantization_serves_the_rtn_model_tokens(
    mode: str, family: str, tiny_checkpoint_factory: Callable, tmp_path: Path
) -> None:
    source = tiny_checkpoint_factory(family)
    reference = write_rtn_model(source, tmp_path / "rtn", mode)
    assert greedy(source, quantization=mode) == greedy(reference)


def test_fp8_at_load_runs_close_to_float(tiny_checkpoint_factory: Callable) -> None:
    path = tiny_checkpoint_factory("qwen3")
    cpu = torch.device("cpu")
    kw = {"device": cpu, "dtype": torch.float32, "ops": torch_ops()}
    fp8 = load_model(path, ModelConfig.from_dir(path), quantization="fp8", **kw)
    ref = load_model(path, ModelConfig.from_dir(path), **kw)
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
    layer = fp8.get_submodule("model.layers.0.mlp.gate_up_proj")
    assert layer.quant_method.weight.dtype == torch.float8_e4m3fn
    assert layer.quant_method.weight_scale.shape == (256,)
    y, y_ref = layer(x), ref.get_submodule("model.layers.0.mlp.gate_up_proj")(x)
    assert 0 < float((y - y_ref).norm() / y_ref.norm()) < 0.06
    assert len(greedy(path, quantization="fp8")[0]) == 8


def test_int4_group_size_choice() -> None:
    assert int4_group_size(4096) == 128
    assert int4_group_size(576) == 64  # SmolLM2-135M's hidden size
    assert int4_group_size(1536) == 128
    assert int4_group_size(48) == 16


@pytest.mark.parametrize("bits", [4, 8])
def test_canonical_packing_round_trips(bits: int) -> None:
    q = torch.randint(0, 1 << bits, (64, 24), generator=torch.Generator().manual_seed(bits))
    packed = pack_rows(q, bits)
    assert packed.dtype == torch.int32 and packed.shape == (64 * bits // 32, 24)
    assert torch.equal(unpack_rows(packed, bits), q.to(torch.int32))
    scales, zeros = torch.full((2, 24), 0.5), torch.full((2, 24), float(1 << (bits - 1)))
    assert torch.equal(dequantize_int_ref(packed, scales, zeros, bits), (q - zeros[0]) * 0.5)


def test_fractional_zero_points_are_refused() -> None:
    """The Triton GEMV takes OFFSET + z as a 16-bit integer: a zero of 7.4 would run as 7 on the GPU and as
    7.4 in the references, so the canonical layout refuses it instead (GGUF Q4_1's zeros are such: they go
    through from_affine, a whole zero plus an offset, tests/runtime/test_quant_gguf_grid.py)."""
    q = torch.randint(0, 16, (64, 8), generator=torch.Generator().manual_seed(0))
    scales = torch.full((2, 8), 0.5)
    assert from_unpacked(q, scales, torch.full((2, 8), 7.0), 4, torch.bfloat16).zeros.dtype == torch.bfloat16
    with pytest.raises(ModelLoadError, match="fractional zero points; supported: integer zero points"):
        from_unpacked(q, scales, torch.full((2, 8), 7.4), 4, torch.float32)


@pytest.mark.parametrize("bits", [4, 8])
def test_canonical_packing_interleaves_each_tile_of_128_rows(bits: int) -> None:
    """Value j of word row t*C + r is row t*128 + j*C + r (C = 128 * bits / 32): the kernel's layout."""
    per_word, k = 32 // bits, 256
    q = torch.randint(0, 1 << bits, (k, 3), generator=torch.Generator().manual_seed(7))
    packed = pack_rows(q, bits)
    chunk = 128 // per_word
    for t, r, j in ((0, 0, 1), (1, chunk - 1, per_word - 1), (1, 2, 0)):
        value = (int(packed[t * chunk + r, 1]) >> (j * bits)) & ((1 << bits) - 1)
        assert value == int(q[t * 128 + j * chunk + r, 1])


def test_quantized_layers_hold_fewer_bytes(tiny_checkpoint_factory: Callable) -> None:
    path = tiny_checkpoint_factory("qwen3")
    config = ModelConfig.from_dir(path)
    model = load_model(
        path, config, device=torch.device("cpu"), dtype=torch.float32, ops=torch_ops(), quantization="int4"
    )
    part = model.get_submodule("model.layers.0.mlp.down_proj").quant_method.parts[0]
    assert part.qweight.shape == (128 // 8, 64) and part.scales.shape == (1, 64)  # K=128: one group
    assert json.loads((path / "config.json").read_text()).get("quantization_config") is None


def test_quantized_weights_with_an_8bit_kv_cache(tiny_checkpoint_factory: Callable) -> None:
    """Weight and KV quantization compose: int4 weights over an int8 KV cache keep the int4 model's first
    tokens (8-bit KV only perturbs the attention slightly on these well-separated logits)."""
    path = tiny_checkpoint_factory("qwen3")
    both = greedy(path, quantization="int4", kv_cache_dtype="int8")
    weights_only = greedy(path, quantization="int4")
    assert [t[:2] for t in both] == [t[:2] for t in weights_only]
