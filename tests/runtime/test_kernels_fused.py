"""Triton KV-cache store, RMSNorm (+ residual), rotary and SiLU-and-mul vs their references.

Interpreted on CPU (float32, small shapes) without CUDA, compiled on the GPU otherwise; `gpu` tests use
Qwen3-8B shapes in bf16.
"""

from __future__ import annotations

import pytest
import torch
from kvpilot.runtime.kernels.triton_utils import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before anything imports triton

from kvpilot.runtime.kernels.activation import silu_and_mul_ref  # noqa: E402
from kvpilot.runtime.kernels.activation_triton import silu_and_mul_triton  # noqa: E402
from kvpilot.runtime.kernels.norm import rms_norm_ref  # noqa: E402
from kvpilot.runtime.kernels.norm_triton import rms_norm_triton  # noqa: E402

DEVICE = "cpu" if INTERPRET else "cuda"
F32_TOL = {"atol": 1e-5, "rtol": 1e-5}
BF16_TOL = {"atol": 1e-3, "rtol": 1.6e-2}  # both sides compute in fp32 and round once: <= 1 bf16 ulp apart


def randn(
    *shape: int, dtype: torch.dtype = torch.float32, device: str = DEVICE, seed: int = 0
) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(*shape, generator=gen, device=device, dtype=dtype)


def cos_sin_cache(max_pos: int, head_dim: int, theta: float, device: str = DEVICE) -> torch.Tensor:
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)  # [max_pos, head_dim // 2]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(device)


# ---------------------------------------------------------------- KV-cache store


@pytest.mark.parametrize("hidden", [48, 64])
def test_rms_norm_without_residual(hidden: int) -> None:
    x, w = randn(5, hidden, seed=1), randn(hidden, seed=2)
    torch.testing.assert_close(rms_norm_triton(x, w, 1e-6), rms_norm_ref(x, w, 1e-6), **F32_TOL)


def test_rms_norm_with_residual_returns_normed_and_sum() -> None:
    x, r, w = randn(6, 40, seed=3), randn(6, 40, seed=4), randn(40, seed=5)
    out, new_residual = rms_norm_triton(x, w, 1e-5, residual=r)
    ref_out, ref_residual = rms_norm_ref(x, w, 1e-5, residual=r)
    torch.testing.assert_close(out, ref_out, **F32_TOL)
    torch.testing.assert_close(new_residual, ref_residual, **F32_TOL)


def test_rms_norm_per_head_on_a_3d_view() -> None:
    """Qwen3's q/k norm: normalise each head of [tokens, heads, head_dim], here a strided view."""
    qkv = randn(3, 7, 16, seed=6)
    q = qkv[:, :4]
    w = randn(16, seed=7)
    torch.testing.assert_close(rms_norm_triton(q, w, 1e-6), rms_norm_ref(q, w, 1e-6), **F32_TOL)


def test_rms_norm_rejects_wrong_weight() -> None:
    with pytest.raises(ValueError, match="weight"):
        rms_norm_triton(randn(2, 8), randn(7), 1e-6)


# ---------------------------------------------------------------- rotary


@pytest.mark.parametrize(("num_tokens", "inter"), [(3, 5), (2, 1100)])  # odd width; two column blocks
def test_silu_and_mul_matches_reference(num_tokens: int, inter: int) -> None:
    x = randn(num_tokens, 2 * inter, seed=inter)
    torch.testing.assert_close(silu_and_mul_triton(x), silu_and_mul_ref(x), **F32_TOL)


# ---------------------------------------------------------------- GPU, Qwen3-8B shapes, bf16


@pytest.mark.gpu
def test_gpu_fused_kernels_qwen3_8b_bf16() -> None:
    bf16 = {"dtype": torch.bfloat16, "device": "cuda"}
    tokens, hidden, inter = 333, 4096, 12288
    x, r = randn(tokens, hidden, seed=1, **bf16), randn(tokens, hidden, seed=2, **bf16)
    w = randn(hidden, seed=3, **bf16)
    out, res = rms_norm_triton(x, w, 1e-6, residual=r)
    ref_out, ref_res = rms_norm_ref(x, w, 1e-6, residual=r)
    torch.testing.assert_close(out, ref_out, **BF16_TOL)
    assert torch.equal(res, ref_res)
    torch.testing.assert_close(rms_norm_triton(x, w, 1e-6), rms_norm_ref(x, w, 1e-6), **BF16_TOL)

    gate_up = randn(tokens, 2 * inter, seed=5, **bf16)
    torch.testing.assert_close(silu_and_mul_triton(gate_up), silu_and_mul_ref(gate_up), **BF16_TOL)
