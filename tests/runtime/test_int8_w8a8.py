"""W8A8 int8 (kernels/int8_w8a8_triton.py) against its reference, and the dispatch that runs a compressed-
tensors W8A8 checkpoint's prefills through it. Without CUDA the kernels run under TRITON_INTERPRET=1 at
tiny shapes; tests marked `gpu` run Qwen3-8B's layer shapes in bf16."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from kvpilot.runtime.kernels.triton_utils import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before anything imports triton

from kvpilot.runtime.config import ModelConfig  # noqa: E402
from kvpilot.runtime.fixtures.quantized import make_quantized_checkpoint  # noqa: E402
from kvpilot.runtime.kernels.int8_w8a8_triton import (  # noqa: E402
    W8A8Config,
    int8_w8a8,
    quantize_int8_rows_triton,
    w8a8_supported,
)
from kvpilot.runtime.kernels.quant_reference import (  # noqa: E402
    int8_w8a8_ref,
    int_gemm_ref,
    quantize_int8_rows_ref,
)
from kvpilot.runtime.layers.kernel_ops import torch_ops  # noqa: E402
from kvpilot.runtime.layers.linear import Linear  # noqa: E402
from kvpilot.runtime.loader import load_model  # noqa: E402
from kvpilot.runtime.quant.config import parse_quant_config  # noqa: E402
from kvpilot.runtime.quant.int_weight import IntWeight, quantize_rtn  # noqa: E402
from kvpilot.runtime.quant.methods import W8A8_MIN_M, IntWeightMethod, takes_int8_activations  # noqa: E402

DEVICE = torch.device("cpu" if INTERPRET else "cuda")
W8A8_CHANNEL = {"bits": 8, "group_size": -1, "ct_format": "int-quantized", "int8_activations": "dynamic"}
WIDE = {"hidden_size": 128, "intermediate_size": 256}  # K = 128, 256: whole 128-row pack tiles


def int8_weight(n: int, k: int, seed: int = 0) -> IntWeight:
    """Symmetric per-channel int8 (zero point 128) whose channel scales span three orders of magnitude."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * torch.logspace(-3, 0, n)[torch.randperm(n, generator=gen)][:, None]
    q = quantize_rtn(w, 8, -1, sym=True)
    return IntWeight(q.qweight.to(DEVICE), q.scales.to(DEVICE), q.zeros.to(DEVICE), 8)


def test_row_quantizer_matches_reference_and_rounds_half_away_from_zero() -> None:
    x = torch.randn(5, 200, generator=torch.Generator().manual_seed(0))
    x[0, :4] = torch.tensor([127.0, 0.5, -0.5, -1.5])  # row 0's scale is 1: exact halves
    x[1] = 0.0  # an all-zero row: scale clamped, values 0
    values, scales = quantize_int8_rows_triton(x.to(DEVICE))
    want_values, want_scales = quantize_int8_rows_ref(x)
    assert want_values[0, :4].tolist() == [127, 1, -1, -2]
    assert torch.equal(values.cpu(), want_values)
    torch.testing.assert_close(scales.cpu(), want_scales)


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize(("m", "n", "k"), [(17, 48, 128), (40, 96, 256)])
def test_kernel_matches_reference_float32(m: int, n: int, k: int, swap: bool) -> None:
    """Tiles past M and N masked; the int32 sums are exact, so float32 agrees to rounding."""
    w = int8_weight(n, k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    got = int8_w8a8(x, w.qweight, w.scales, W8A8Config(32, 32, 4, 1, swap))
    want = int8_w8a8_ref(x, w.qweight, w.scales)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    weight_only = int_gemm_ref(x, w.qweight, w.scales, w.zeros, 8)
    assert not torch.allclose(got, weight_only, rtol=1e-4, atol=1e-4)  # the activations were quantized


def test_shapes_it_takes() -> None:
    assert w8a8_supported(4096) and w8a8_supported(12288) and w8a8_supported(128)
    assert not w8a8_supported(576) and not w8a8_supported(64)  # pack tiles of 64 rows: dots of 16
    w = int8_weight(32, 64)
    with pytest.raises(ValueError, match="K = 64"):
        int8_w8a8(torch.zeros(20, 64, device=DEVICE), w.qweight, w.scales)


@pytest.mark.parametrize(
    ("opts", "runs"),
    [
        (W8A8_CHANNEL, True),
        ({**W8A8_CHANNEL, "group_size": 32}, False),  # group scales: the epilogue applies one per channel
        ({**W8A8_CHANNEL, "bits": 4, "group_size": 32}, False),  # W4A8
        ({"bits": 8, "group_size": -1}, False),  # weight-only W8A16
    ],
)
def test_which_checkpoints_run_w8a8(opts: dict, runs: bool, tmp_path: Path) -> None:
    path = make_quantized_checkpoint(tmp_path / "q", "compressed-tensors-int", seed=3, **WIDE, **opts)
    quant = parse_quant_config(ModelConfig.from_dir(path).quantization_config, None)
    assert quant is not None and takes_int8_activations(quant) == runs
    methods = [m.quant_method for m in load_cpu(path).modules() if isinstance(m, Linear)]
    assert len(methods) == 8 and all(isinstance(m, IntWeightMethod) and m.w8a8 == runs for m in methods)


def test_narrow_layers_stay_weight_only(tmp_path: Path) -> None:
    """K = 64 (the default tiny model's width) has no 128-row pack tile: those layers stay weight-only."""
    path = make_quantized_checkpoint(tmp_path / "q", "compressed-tensors-int", seed=3, **W8A8_CHANNEL)
    layers = [m for m in load_cpu(path).modules() if isinstance(m, Linear)]
    widths = {layer.in_features for layer in layers}
    assert 64 in widths and len(widths) > 1
    for layer in layers:
        assert isinstance(layer.quant_method, IntWeightMethod)
        assert layer.quant_method.w8a8 == (layer.in_features % 128 == 0), layer.in_features


def test_prefill_runs_w8a8_and_decode_weight_only(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = make_quantized_checkpoint(tmp_path / "q", "compressed-tensors-int", seed=3, **WIDE, **W8A8_CHANNEL)
    with caplog.at_level(logging.INFO):
        model = load_cpu(path)
    assert "prefills of more than 16 tokens run W8A8" in caplog.text
    layer = model.get_submodule("model.layers.0.mlp.down_proj")
    method = layer.quant_method
    assert isinstance(method, IntWeightMethod)
    part = method.parts[0]
    for m in (W8A8_MIN_M - 1, W8A8_MIN_M, 40):
        x = torch.randn(m, 256, generator=torch.Generator().manual_seed(m))
        got = layer(x)
        if m >= W8A8_MIN_M:
            want = int8_w8a8_ref(x, part.qweight, part.scales)
        else:
            want = int_gemm_ref(x, part.qweight, part.scales, part.zeros, 8)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def load_cpu(path: Path) -> torch.nn.Module:
    return load_model(
        path, ModelConfig.from_dir(path), device=torch.device("cpu"), dtype=torch.float32, ops=torch_ops()
    )


@pytest.mark.gpu
@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("m", [17, 100, 1024])
@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (4096, 12288)])
def test_kernel_matches_reference_at_qwen3_shapes(m: int, n: int, k: int, swap: bool) -> None:
    w = int8_weight(n, k)
    x = (0.1 * torch.randn(m, k, device=DEVICE)).bfloat16()
    got = int8_w8a8(x, w.qweight, w.scales, W8A8Config(swap=swap)).float()
    want = int8_w8a8_ref(x.float(), w.qweight, w.scales.float()).float()
    assert float((got - want).norm() / want.norm()) < 3e-3
