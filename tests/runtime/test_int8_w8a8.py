"""W8A8 int8 checkpoints: the int8 GEMM (kernels/int8_gemm_triton.py) and its activation quantizer against
their references, and the method (quant/int8_channel.py) that runs a compressed-tensors W8A8 checkpoint:
W8A8 above decode sizes, weight-only at them. Without CUDA the kernels run under TRITON_INTERPRET=1 at
tiny shapes; tests marked `gpu` run Qwen3-8B's layer shapes in bf16."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from kvpilot.runtime.kernels.triton_utils import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before anything imports triton

from kvpilot.runtime.config import ModelConfig  # noqa: E402
from kvpilot.runtime.errors import ModelLoadError  # noqa: E402
from kvpilot.runtime.fixtures.quantized import make_quantized_checkpoint  # noqa: E402
from kvpilot.runtime.kernels.int8_gemm_triton import (  # noqa: E402
    LAUNCHES,
    Int8GemmConfig,
    int8_gemm,
    int8_linear,
    quantize_int8_rows_triton,
)
from kvpilot.runtime.kernels.quant_reference import (  # noqa: E402
    FP8_WEIGHT_ONLY_MAX_M,
    fp8_weight_only_ref,
    int8_gemm_ref,
    quantize_int8_rows_ref,
)
from kvpilot.runtime.layers.kernel_ops import torch_ops  # noqa: E402
from kvpilot.runtime.layers.linear import Linear  # noqa: E402
from kvpilot.runtime.loader import load_model  # noqa: E402
from kvpilot.runtime.quant.config import parse_quant_config  # noqa: E402
from kvpilot.runtime.quant.int8_channel import Int8ChannelMethod, takes_int8_activations  # noqa: E402
from kvpilot.runtime.quant.methods import IntWeightMethod  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

DEVICE = torch.device("cpu" if INTERPRET else "cuda")
W8A8 = {"bits": 8, "group_size": -1, "ct_format": "int-quantized", "int8_activations": "dynamic"}


def int8_weight(n: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 [N, K] and channel scales [N] spanning three orders of magnitude."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * torch.logspace(-3, 0, n)[torch.randperm(n, generator=gen)][:, None]
    q, s = quantize_int8_rows_ref(w)
    return q.to(DEVICE), s.to(DEVICE)


def test_row_quantizer_matches_reference_and_rounds_half_away_from_zero() -> None:
    x = torch.randn(5, 200, generator=torch.Generator().manual_seed(0))
    x[0, :4] = torch.tensor([127.0, 0.5, -0.5, -1.5])  # row 0's scale is 1: exact halves
    x[1] = 0.0  # an all-zero row: scale clamped, values 0
    values, scales = quantize_int8_rows_triton(x.to(DEVICE))
    want_values, want_scales = quantize_int8_rows_ref(x)
    assert want_values[0, :4].tolist() == [127, 1, -1, -2]
    assert torch.equal(values.cpu(), want_values)
    torch.testing.assert_close(scales.cpu(), want_scales)


@pytest.mark.parametrize(("m", "n", "k"), [(17, 48, 96), (70, 130, 64), (5, 40, 100)])
def test_gemm_matches_reference_float32(m: int, n: int, k: int) -> None:
    """Tiles past M, N and K masked, grouped row blocks; the int32 sums are exact, so float32 agrees to
    its rounding."""
    w, s = int8_weight(n, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    xq, sx = quantize_int8_rows_triton(x)
    got = int8_gemm(xq, sx, w, s, torch.float32, Int8GemmConfig(32, 32, 32, 2, 4, 1))
    torch.testing.assert_close(got, int8_gemm_ref(x, w, s), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(got, fp8_weight_only_ref(x, w, s), rtol=1e-4, atol=1e-4)  # x was quantized


def test_linear_takes_the_launch_shape_of_its_bucket() -> None:
    assert [top for top, _ in LAUNCHES][:2] == [64, 512] and LAUNCHES[-1][0] > 1 << 40
    w, s = int8_weight(24, 64)
    x = torch.randn(2, 9, 64, generator=torch.Generator().manual_seed(2)).to(DEVICE)  # [..., K]
    bias = torch.randn(24).to(DEVICE)
    torch.testing.assert_close(int8_linear(x, w, s, bias), int8_gemm_ref(x, w, s, bias), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("opts", "runs"),
    [
        (W8A8, True),
        ({**W8A8, "group_size": 32}, False),  # group scales: the epilogue applies one per channel
        ({**W8A8, "sym": False}, False),  # zero points
        ({**W8A8, "bits": 4, "group_size": 32}, False),  # W4A8
        ({"bits": 8, "group_size": -1}, False),  # weight-only W8A16 (pack-quantized)
    ],
)
def test_which_checkpoints_run_w8a8(opts: dict, runs: bool, tmp_path: Path) -> None:
    path = make_quantized_checkpoint(tmp_path / "q", "compressed-tensors-int", seed=3, **opts)
    quant = parse_quant_config(ModelConfig.from_dir(path).quantization_config, None)
    assert quant is not None and takes_int8_activations(quant) == runs
    methods = [m.quant_method for m in load_cpu(path).modules() if isinstance(m, Linear)]
    want = Int8ChannelMethod if runs else IntWeightMethod
    assert len(methods) == 8 and all(type(m) is want for m in methods)


def test_prefill_runs_w8a8_and_decode_weight_only(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Each layer holds the checkpoint's int8 weight and scales as stored."""
    path = make_quantized_checkpoint(tmp_path / "q", "compressed-tensors-int", seed=3, **W8A8)
    with caplog.at_level(logging.INFO):
        model = load_cpu(path)
    assert "prefills of more than 16 tokens run W8A8" in caplog.text
    layer = model.get_submodule("model.layers.0.mlp.down_proj")
    method = layer.quant_method
    assert isinstance(method, Int8ChannelMethod)
    stored = load_file(str(path / "model.safetensors"))
    assert torch.equal(method.weight, stored["model.layers.0.mlp.down_proj.weight"])
    torch.testing.assert_close(
        method.weight_scale, stored["model.layers.0.mlp.down_proj.weight_scale"].view(-1).float()
    )
    w, s = method.weight, method.weight_scale
    for m in (FP8_WEIGHT_ONLY_MAX_M, FP8_WEIGHT_ONLY_MAX_M + 1, 40):
        x = torch.randn(m, layer.in_features, generator=torch.Generator().manual_seed(m))
        want = int8_gemm_ref(x, w, s) if m > FP8_WEIGHT_ONLY_MAX_M else fp8_weight_only_ref(x, w, s)
        torch.testing.assert_close(layer(x), want, rtol=1e-5, atol=1e-5)


def test_a_float_weight_in_a_w8a8_checkpoint_is_refused(tmp_path: Path) -> None:
    path = make_quantized_checkpoint(tmp_path / "q", "compressed-tensors-int", seed=3, **W8A8)
    tensors = load_file(str(path / "model.safetensors"))
    name = "model.layers.1.self_attn.o_proj.weight"
    tensors[name] = tensors[name].float()
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(
        ModelLoadError, match=r"W8A8 int8 checkpoint weight has dtype torch\.float32; supported: int8"
    ):
        load_cpu(path)


@pytest.mark.parametrize("activations", ["dynamic", None], ids=["w8a8", "w8a16"])
def test_symmetric_zero_points_written_as_zeros_are_accepted(
    activations: str | None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Older compressed-tensors versions write weight_zero_point (all zero) for symmetric weights: loaded
    without an "unexpected tensor" warning and to the same weights; a nonzero one contradicts the config."""
    opts = {**W8A8, "int8_activations": activations}
    plain = make_quantized_checkpoint(tmp_path / "plain", "compressed-tensors-int", seed=3, **opts)
    path = make_quantized_checkpoint(tmp_path / "zp", "compressed-tensors-int", seed=3, **opts)
    tensors = load_file(str(path / "model.safetensors"))
    for name in [n for n in tensors if n.endswith(".weight_scale")]:
        tensors[name.replace("weight_scale", "weight_zero_point")] = torch.zeros_like(
            tensors[name], dtype=torch.int8
        )
    save_file(tensors, str(path / "model.safetensors"))
    with caplog.at_level(logging.WARNING):
        model = load_cpu(path)
    assert "unexpected checkpoint tensor" not in caplog.text
    name = "model.layers.1.self_attn.o_proj"
    layer = model.get_submodule(name)
    x = torch.randn(20, layer.in_features, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(layer(x), load_cpu(plain).get_submodule(name)(x))
    if activations is None:
        return
    tensors[name + ".weight_zero_point"][3] = 1
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="weight_zero_point holds nonzero values"):
        load_cpu(path)


def load_cpu(path: Path) -> torch.nn.Module:
    return load_model(
        path, ModelConfig.from_dir(path), device=torch.device("cpu"), dtype=torch.float32, ops=torch_ops()
    )


@pytest.mark.gpu
@pytest.mark.parametrize("m", [17, 100, 1024])
@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (4096, 12288)])
def test_linear_matches_reference_at_qwen3_shapes(m: int, n: int, k: int) -> None:
    w, s = int8_weight(n, k)
    x = (0.1 * torch.randn(m, k, device=DEVICE)).bfloat16()
    got = int8_linear(x, w, s, None).float()
    want = int8_gemm_ref(x.float(), w, s).float()
    assert float((got - want).norm() / want.norm()) < 3e-3


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16])
def test_decode_gemv_reads_int8(m: int) -> None:
    """The fp8 GEMV's loads convert any 8-bit type: int8 weights give the weight-only reference."""
    from kvpilot.runtime.quant.fp8_gemm import fp8_linear

    w, s = int8_weight(4096, 4096)
    x = (0.1 * torch.randn(m, 4096, device=DEVICE)).bfloat16()
    got = fp8_linear(x, w, s, None).float()
    want = fp8_weight_only_ref(x.float(), w, s).float()
    assert float((got - want).norm() / want.norm()) < 1e-2
