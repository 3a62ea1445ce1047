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
from kvpilot.runtime.kernels.kv_cache import store_kv_cache_ref  # noqa: E402
from kvpilot.runtime.kernels.kv_cache_triton import store_kv_cache_triton  # noqa: E402
from kvpilot.runtime.kernels.norm import rms_norm_ref  # noqa: E402
from kvpilot.runtime.kernels.norm_triton import rms_norm_triton  # noqa: E402
from kvpilot.runtime.kernels.rotary import apply_rotary_ref  # noqa: E402
from kvpilot.runtime.kernels.rotary_triton import apply_rotary_triton  # noqa: E402

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


@pytest.mark.parametrize("block_size", [4, 8, 16])
def test_store_kv_cache_matches_reference_and_skips_minus_one(block_size: int) -> None:
    num_tokens, kv_heads, head_dim, num_blocks = 9, 3, 12, 5
    # K and V as strided views into one fused qkv projection, as the attention layer produces them
    qkv = randn(num_tokens, 4 + 2 * kv_heads, head_dim, seed=block_size)
    key, value = qkv[:, 4 : 4 + kv_heads], qkv[:, 4 + kv_heads :]
    gen = torch.Generator().manual_seed(block_size)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[[2, 5]] = -1  # padding tokens
    slot_mapping = slots.to(DEVICE)
    caches = [randn(num_blocks, block_size, kv_heads, head_dim, seed=100 + i) for i in range(2)]
    k_ref, v_ref = caches[0].clone(), caches[1].clone()
    store_kv_cache_ref(key, value, k_ref, v_ref, slot_mapping)
    k_tri, v_tri = caches[0].clone(), caches[1].clone()
    store_kv_cache_triton(key, value, k_tri, v_tri, slot_mapping)
    assert torch.equal(k_tri, k_ref) and torch.equal(v_tri, v_ref)
    assert not torch.equal(k_tri, caches[0])  # something was written


def test_store_kv_cache_rejects_mismatched_shapes() -> None:
    key, cache = randn(4, 2, 8), randn(3, 4, 2, 16)
    slots = torch.zeros(4, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="shape mismatch"):
        store_kv_cache_triton(key, key, cache, cache.clone(), slots)


# ---------------------------------------------------------------- RMSNorm


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


@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(4, 2, 16), (3, 1, 8), (2, 2, 12)])
def test_rotary_matches_reference(num_heads: int, num_kv_heads: int, head_dim: int) -> None:
    num_tokens = 7
    qkv = randn(num_tokens, num_heads + 2 * num_kv_heads, head_dim, seed=head_dim)
    q, k = qkv[:, :num_heads], qkv[:, num_heads : num_heads + num_kv_heads]  # strided views
    cache = cos_sin_cache(64, head_dim, 10_000.0)
    positions = torch.tensor([0, 1, 5, 17, 63, 2, 40], device=DEVICE)
    q_out, k_out = apply_rotary_triton(positions, q, k, cache)
    q_ref, k_ref = apply_rotary_ref(positions, q, k, cache)
    torch.testing.assert_close(q_out, q_ref, **F32_TOL)
    torch.testing.assert_close(k_out, k_ref, **F32_TOL)


def test_rotary_rejects_cache_of_wrong_width() -> None:
    q, k = randn(2, 2, 8), randn(2, 1, 8)
    with pytest.raises(ValueError, match="cos_sin_cache"):
        apply_rotary_triton(torch.zeros(2, dtype=torch.int64, device=DEVICE), q, k, cos_sin_cache(4, 6, 1e4))


# ---------------------------------------------------------------- SiLU-and-mul


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

    qkv = randn(tokens, 48, 128, seed=4, **bf16)  # 32 q heads, 8 k heads, 8 v heads
    q, k = qkv[:, :32], qkv[:, 32:40]
    cache = cos_sin_cache(40_960, 128, 1_000_000.0, device="cuda")  # Qwen3's theta
    positions = torch.randint(0, 40_960, (tokens,), device="cuda")
    got, want = apply_rotary_triton(positions, q, k, cache), apply_rotary_ref(positions, q, k, cache)
    torch.testing.assert_close(got[0], want[0], **BF16_TOL)
    torch.testing.assert_close(got[1], want[1], **BF16_TOL)

    gate_up = randn(tokens, 2 * inter, seed=5, **bf16)
    torch.testing.assert_close(silu_and_mul_triton(gate_up), silu_and_mul_ref(gate_up), **BF16_TOL)

    k_cache, v_cache = randn(64, 16, 8, 128, seed=6, **bf16), randn(64, 16, 8, 128, seed=7, **bf16)
    slots = torch.randperm(64 * 16, device="cuda")[:tokens]
    slots[::7] = -1
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    store_kv_cache_ref(k, qkv[:, 40:], k_ref, v_ref, slots)
    store_kv_cache_triton(k, qkv[:, 40:], k_cache, v_cache, slots)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
