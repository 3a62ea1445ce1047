"""The fp8 references follow the GPU's dispatch by token count: weight-only (W8A16) up to
FP8_WEIGHT_ONLY_MAX_M tokens, W8A8 (activations quantized per token) above. The torch backend is the oracle
of the Triton one: a W8A8 reference against the W8A16 decode GEMV differed by 0.24
in a logprob on the H200."""

from __future__ import annotations

import pytest
import torch
from kvpilot.runtime.kernels.quant_reference import (
    FP8_WEIGHT_ONLY_MAX_M,
    fp8_gemm_ref,
    fp8_weight_only_ref,
    quantize_fp8_rows_ref,
)
from kvpilot.runtime.quant.config import QuantConfig
from kvpilot.runtime.quant.fp8_method import Fp8Method


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("m", [1, FP8_WEIGHT_ONLY_MAX_M, FP8_WEIGHT_ONLY_MAX_M + 1, 64])
def test_cpu_fp8_layer_follows_the_dispatch(backend: str, m: int) -> None:
    torch.manual_seed(0)
    method = Fp8Method(
        QuantConfig(method="fp8", from_checkpoint=False, bits=8), torch.float32, torch.device("cpu"), backend
    )
    method.weight, scale = quantize_fp8_rows_ref(0.05 * torch.randn(24, 32))
    method.weight_scale = scale.view(-1)
    x = torch.randn(m, 32)
    got = method.apply(None, x, None)  # type: ignore[arg-type]
    weight_only = fp8_weight_only_ref(x, method.weight, method.weight_scale)
    w8a8 = fp8_gemm_ref(x, method.weight, method.weight_scale)
    assert not torch.equal(weight_only, w8a8)  # the two are distinguishable on these inputs
    assert torch.equal(got, weight_only if m <= FP8_WEIGHT_ONLY_MAX_M else w8a8)
