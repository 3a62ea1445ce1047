"""AWQ / GPTQ / fp8 / compressed-tensors checkpoints packed from a known float model serve exactly the
tokens of the model whose weights are their dequantized values. The dequantization here is an independent
reference written bit by bit from the formats (not the runtime's unpacker)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from kvpilot.runtime.config import ModelConfig
from kvpilot.runtime.errors import UnsupportedModelError
from kvpilot.runtime.fixtures.quantized import make_quantized_checkpoint
from kvpilot.runtime.kernels.quant_reference import fp8_block_w8a8_ref
from kvpilot.runtime.layers.kernel_ops import torch_ops
from kvpilot.runtime.layers.linear import Linear
from kvpilot.runtime.llm import LLM
from kvpilot.runtime.loader import load_model
from kvpilot.runtime.sampling_params import SamplingParams
from safetensors.torch import load_file, save_file

PROMPTS = ["the cat sat on", "a quick brown fox", "hello world"]
AWQ_NIBBLE_COLUMN = [0, 2, 4, 6, 1, 3, 5, 7]


def _field(word: int, index: int, bits: int) -> int:
    return (word >> (index * bits)) & ((1 << bits) - 1)


def _reference_dequant(tensors: dict[str, torch.Tensor], prefix: str, qc: dict) -> torch.Tensor:
    """W [N, K] float32 from one layer's packed tensors, word by word in Python."""
    method = qc["quant_method"]
    if prefix + "weight_packed" in tensors or qc.get("format") in ("int-quantized", "naive-quantized"):
        return _reference_compressed_int(tensors, prefix, qc)
    block = qc.get("weight_block_size") or _ct_block(qc)
    if block:
        return _reference_block_fp8(tensors, prefix, block)
    if method in ("fp8", "compressed-tensors"):
        w = tensors[prefix + "weight"].float()
        scale = tensors[prefix + "weight_scale"].float()
        return w * (scale.reshape(-1, 1) if scale.numel() > 1 else scale.reshape(()))
    qweight = tensors[prefix + "qweight"].to(torch.int64) & 0xFFFFFFFF
    qzeros = tensors[prefix + "qzeros"].to(torch.int64) & 0xFFFFFFFF
    scales = tensors[prefix + "scales"].float()
    bits = qc.get("bits", 4)
    per = 32 // bits
    groups, n = scales.shape
    if method == "awq":
        k = qweight.shape[0]
        q = torch.empty(k, n)
        z = torch.empty(groups, n)
        for c in range(n // 8):
            for i in range(8):
                col = 8 * c + AWQ_NIBBLE_COLUMN[i]
                q[:, col] = torch.tensor([_field(int(v), i, 4) for v in qweight[:, c]], dtype=torch.float32)
                z[:, col] = torch.tensor([_field(int(v), i, 4) for v in qzeros[:, c]], dtype=torch.float32)
        g_idx = torch.arange(k) // (k // groups)
    else:
        k = qweight.shape[0] * per
        q = torch.empty(k, n)
        for r in range(qweight.shape[0]):
            for j in range(per):
                q[r * per + j] = ((qweight[r] >> (j * bits)) & ((1 << bits) - 1)).float()
        z = torch.empty(groups, n)
        for c in range(qzeros.shape[1]):
            for j in range(per):
                z[:, c * per + j] = ((qzeros[:, c] >> (j * bits)) & ((1 << bits) - 1)).float()
        if qc.get("checkpoint_format", "gptq") == "gptq":
            z = z + 1
        g_idx = tensors[prefix + "g_idx"].to(torch.int64)
    return ((q - z[g_idx]) * scales[g_idx]).t().contiguous()


def _ct_block(qc: dict) -> list[int] | None:
    groups = qc.get("config_groups") or {}
    return next((g["weights"].get("block_structure") for g in groups.values()), None)


def _reference_block_fp8(tensors: dict[str, torch.Tensor], prefix: str, block: list[int]) -> torch.Tensor:
    """W [N, K]: every element times the scale of the [bn, bk] block it falls in, one by one."""
    w = tensors[prefix + "weight"].float()
    scale = tensors.get(prefix + "weight_scale_inv", tensors.get(prefix + "weight_scale"))
    assert scale is not None
    rows = torch.arange(w.shape[0]) // block[0]
    cols = torch.arange(w.shape[1]) // block[1]
    return w * scale.float()[rows][:, cols]


def _reference_compressed_int(tensors: dict[str, torch.Tensor], prefix: str, qc: dict) -> torch.Tensor:
    """compressed-tensors pack-quantized: signed values stored with an offset of 2**(bits-1), packed
    along K (weights) or N (zero points), low bits first."""
    scheme = qc["config_groups"]["group_0"]["weights"]
    bits = scheme["num_bits"]
    per, offset = 32 // bits, 1 << (bits - 1)
    scale = tensors[prefix + "weight_scale"].float()  # [N, groups]
    g_idx = tensors.get(prefix + "weight_g_idx")
    if qc["format"] != "pack-quantized":  # int-/naive-quantized: signed int8 values, as stored
        q, k = tensors[prefix + "weight"].float(), tensors[prefix + "weight"].shape[1]
        zp = tensors.get(prefix + "weight_zero_point")
        z = torch.zeros_like(scale) if zp is None else zp.float()
        g = torch.arange(k) // (k // scale.shape[1]) if g_idx is None else g_idx.to(torch.int64)
        return (q - z[:, g]) * scale[:, g]
    packed = tensors[prefix + "weight_packed"].to(torch.int64) & 0xFFFFFFFF
    n, k = packed.shape[0], packed.shape[1] * per
    q = torch.empty(n, k)
    for c in range(packed.shape[1]):
        for j in range(per):
            q[:, c * per + j] = torch.tensor([_field(int(v), j, bits) - offset for v in packed[:, c]])
    z = torch.zeros(n, scale.shape[1])
    if prefix + "weight_zero_point" in tensors:
        zp = tensors[prefix + "weight_zero_point"].to(torch.int64) & 0xFFFFFFFF
        for r in range(zp.shape[0]):
            for j in range(per):
                z[r * per + j] = torch.tensor([_field(int(v), j, bits) - offset for v in zp[r]])
    groups = scale.shape[1]
    g = torch.arange(k) // (k // groups) if g_idx is None else g_idx.to(torch.int64)
    return (q - z[:, g]) * scale[:, g]


def write_dequantized(quantized: Path, out: Path) -> Path:
    """The float32 checkpoint whose projection weights are the quantized checkpoint's values."""
    out.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        (out / name).write_bytes((quantized / name).read_bytes())
    config = json.loads((quantized / "config.json").read_text())
    qc = config.pop("quantization_config")
    config["torch_dtype"] = "float32"
    (out / "config.json").write_text(json.dumps(config))
    tensors = load_file(str(quantized / "model.safetensors"))
    weights: dict[str, torch.Tensor] = {}
    prefixes = {n[: -len("qweight")] for n in tensors if n.endswith("qweight")}
    prefixes |= {n[: -len("weight_scale")] for n in tensors if n.endswith("weight_scale")}
    prefixes |= {n[: -len("weight_scale_inv")] for n in tensors if n.endswith("weight_scale_inv")}
    packed = ("qweight", "qzeros", "scales", "g_idx", "weight", "weight_scale", "input_scale")
    packed += ("weight_packed", "weight_zero_point", "weight_g_idx", "weight_shape", "weight_scale_inv")
    for name, t in tensors.items():
        prefix, _, suffix = name.rpartition(".")
        if prefix + "." not in prefixes or suffix not in packed:
            weights[name] = t.float()
    for prefix in prefixes:
        weights[prefix + "weight"] = _reference_dequant(tensors, prefix, qc)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def load_cpu(path: Path) -> torch.nn.Module:
    return load_model(
        path, ModelConfig.from_dir(path), device=torch.device("cpu"), dtype=torch.float32, ops=torch_ops()
    )


def greedy_tokens(model_dir: Path) -> list[list[int]]:
    llm = LLM(str(model_dir), device="cpu", dtype="float32", max_model_len=128, kernel_backend="torch")
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    return [o.token_ids for o in llm.generate(PROMPTS, params)]


CASES = {
    "awq-g32": ("awq", {"group_size": 32}),
    "awq-g64-llama": ("awq", {"group_size": 64, "family": "llama3"}),
    "awq-g128": ("awq", {"group_size": 128, "hidden_size": 128}),
    "gptq4-sym-g32": ("gptq", {"bits": 4, "group_size": 32, "sym": True}),
    "gptq4-asym-descact-g64": ("gptq", {"bits": 4, "group_size": 64, "sym": False, "desc_act": True}),
    "gptq4-v2-asym-g128": (
        "gptq",
        {"bits": 4, "group_size": 128, "sym": False, "v2": True, "hidden_size": 128},
    ),
    "gptq8-sym-g-1-qwen2": ("gptq", {"bits": 8, "group_size": -1, "family": "qwen2"}),
    "gptq8-asym-descact-g32": ("gptq", {"bits": 8, "group_size": 32, "sym": False, "desc_act": True}),
    "ct-int4-sym-g32": ("compressed-tensors-int", {"bits": 4, "group_size": 32}),
    "ct-int4-asym-actorder-g64-llama": (
        "compressed-tensors-int",
        {"bits": 4, "group_size": 64, "sym": False, "desc_act": True, "family": "llama3"},
    ),
    "ct-int8-sym-channel": ("compressed-tensors-int", {"bits": 8, "group_size": -1}),
    "ct-int8-asym-g32": ("compressed-tensors-int", {"bits": 8, "group_size": 32, "sym": False}),
    # W8A8 int8 checkpoints (int-quantized): the 19-token prefill runs W8A8 (int8 activations), decode
    # weight-only; these greedy tokens are still the dequantized model's (layers: test_int8_w8a8.py)
    "ct-int8-w8a8-dynamic-channel": (
        "compressed-tensors-int",
        {"bits": 8, "group_size": -1, "ct_format": "int-quantized", "int8_activations": "dynamic"},
    ),
    "ct-int4-naive-asym-actorder-static": (
        "compressed-tensors-int",
        {
            "bits": 4,
            "group_size": 32,
            "sym": False,
            "desc_act": True,
            "ct_format": "naive-quantized",
            "int8_activations": "static",
        },
    ),
    # block-wise fp8 runs weight-only: the tokens of the dequantized model, like the integer formats
    "fp8-block-32": ("fp8", {"block": (32, 32)}),
    "fp8-block-48-ragged-llama": ("fp8", {"block": (48, 48), "family": "llama3"}),
    "fp8-block-128": ("fp8", {"block": (128, 128)}),
    "ct-fp8-block-16x32": ("compressed-tensors", {"block": (16, 32)}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_packed_checkpoint_serves_the_tokens_of_its_dequantized_model(case: str, tmp_path: Path) -> None:
    fmt, opts = CASES[case]
    quantized = make_quantized_checkpoint(tmp_path / "q", fmt, seed=3, **opts)
    reference = write_dequantized(quantized, tmp_path / "deq")
    assert greedy_tokens(quantized) == greedy_tokens(reference)


# (W8A8 int8 checkpoints keep their plain int8 weight: quant/int8_channel.py)
@pytest.mark.parametrize(
    "case", [c for c in CASES if c.startswith("ct-int") and "w8a8" not in c] + ["gptq4-asym-descact-g64"]
)
def test_loaded_integer_weights_are_dense(case: str, tmp_path: Path) -> None:
    """The GPU kernels read qweight/scales/zeros as dense rows: a transposed view (compressed-tensors keeps
    scales as [N, groups]) gave wrong tokens on the H100 before the canonical weight was made contiguous."""
    fmt, opts = CASES[case]
    path = make_quantized_checkpoint(tmp_path / "q", fmt, seed=3, **opts)
    model = load_cpu(path)
    parts = [
        p for m in model.modules() if isinstance(m, Linear) and m.quant_method for p in m.quant_method.parts
    ]
    assert len(parts) >= 8
    assert all(t.is_contiguous() for p in parts for t in (p.qweight, p.scales, p.zeros))


@pytest.mark.parametrize(
    ("fmt", "per_channel"), [("fp8", False), ("compressed-tensors", True), ("compressed-tensors", False)]
)
def test_fp8_checkpoint_weights_load_exactly(fmt: str, per_channel: bool, tmp_path: Path) -> None:
    """fp8 also quantizes activations, so tokens may differ from the dequantized model's: the weights
    and scales must load exactly, and each layer's output stays within fp8's error of the float one."""
    quantized = make_quantized_checkpoint(tmp_path / "q", fmt, per_channel=per_channel)
    reference = write_dequantized(quantized, tmp_path / "deq")
    fp8, ref = load_cpu(quantized), load_cpu(reference)
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(0))
    for name in ("self_attn.qkv_proj", "mlp.gate_up_proj"):
        layer = fp8.get_submodule(f"model.layers.1.{name}")
        method = layer.quant_method
        dequantized = method.weight.float() * method.weight_scale.view(-1, 1)
        want = ref.get_submodule(f"model.layers.1.{name}").weight
        assert torch.equal(dequantized, want)
        y, y_ref = layer(x), x @ want.t()
        assert float((y - y_ref).norm() / y_ref.norm()) < 0.06
    assert len(greedy_tokens(quantized)[0]) == 8


def test_block_fp8_runs_w8a8_above_decode_sizes(tmp_path: Path) -> None:
    """128 x 128 blocks: up to 16 tokens weight-only (the dequantized weight, exactly), above W8A8 as
    DeepSeek's recipe runs it (activations per token and 128 inputs): the CPU follows the GPU's split."""
    wide = {
        "hidden_size": 512,
        "intermediate_size": 1024,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
    }
    quantized = make_quantized_checkpoint(tmp_path / "q", "fp8", block=(128, 128), **wide)
    reference = write_dequantized(quantized, tmp_path / "deq")
    fp8, ref = load_cpu(quantized), load_cpu(reference)
    gen = torch.Generator().manual_seed(0)
    for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
        layer = fp8.get_submodule(f"model.layers.1.{name}")
        want = ref.get_submodule(f"model.layers.1.{name}").weight
        assert layer.quant_method.w8a8
        decode, prefill = (
            torch.randn(16, want.shape[1], generator=gen),
            torch.randn(17, want.shape[1], generator=gen),
        )
        torch.testing.assert_close(layer(decode), decode @ want.t(), rtol=1e-5, atol=1e-5)
        y = layer(prefill)
        method = layer.quant_method
        torch.testing.assert_close(y, fp8_block_w8a8_ref(prefill, method.weight, method.block_scale))
        exact = prefill @ want.t()
        assert not torch.allclose(y, exact, rtol=1e-5, atol=1e-5)  # the activations were quantized
        assert float((y - exact).norm() / exact.norm()) < 0.06
    assert len(greedy_tokens(quantized)[0]) == 8


@pytest.mark.parametrize(
    ("fmt", "opts"),
    [
        ("compressed-tensors-int", {"bits": 4, "group_size": 32, "sym": False}),
        ("awq", {"group_size": 32}),
        ("fp8", {"block": (32, 32)}),
    ],
)
def test_mixed_precision_checkpoint_keeps_its_16_bit_layers(fmt: str, opts: dict, tmp_path: Path) -> None:
    """Layers a checkpoint leaves 16-bit (compressed-tensors `ignore`, `modules_to_not_convert`) load as
    16-bit layers, fused q/k/v included when all three are left: the dequantized model's tokens."""
    keep = ("model.layers.1.mlp.down_proj", *(f"model.layers.0.self_attn.{p}_proj" for p in "qkv"))
    quantized = make_quantized_checkpoint(tmp_path / "q", fmt, seed=3, keep_16bit=keep, **opts)
    model = load_cpu(quantized)
    assert model.get_submodule("model.layers.1.mlp.down_proj").quant_method is None
    assert model.get_submodule("model.layers.0.self_attn.qkv_proj").quant_method is None
    assert model.get_submodule("model.layers.0.mlp.down_proj").quant_method is not None
    reference = write_dequantized(quantized, tmp_path / "deq")
    assert greedy_tokens(quantized) == greedy_tokens(reference)


def test_ignore_patterns_regex_and_partly_fused_groups(tmp_path: Path) -> None:
    keep = tuple(f"model.layers.{i}.mlp.{p}_proj" for i in (0, 1) for p in ("gate", "up"))
    path = make_quantized_checkpoint(tmp_path / "q", "compressed-tensors-int", seed=3, keep_16bit=keep)
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"]["ignore"] = ["lm_head", r"re:.*mlp\.(gate|up)_proj$"]
    (path / "config.json").write_text(json.dumps(config))
    model = load_cpu(path)
    assert all(model.get_submodule(f"model.layers.{i}.mlp.gate_up_proj").quant_method is None for i in (0, 1))
    config["quantization_config"]["ignore"] = ["lm_head", "model.layers.0.mlp.up_proj"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError) as err:
        load_cpu(path)
    text = str(err.value)
    assert "leaves model.layers.0.mlp.up_proj in 16-bit" in text
    assert "quantizes the rest of model.layers.0.mlp.gate_up_proj" in text
