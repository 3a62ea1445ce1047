"""The fused qkv_prepare kernel (q/k norm + rotary + KV-cache store in one launch) vs the reference
composition rms_norm_ref per head -> apply_rotary_ref -> store_kv_cache_ref.

Interpreted on CPU (tiny shapes, float32) without CUDA, compiled on the GPU otherwise; `gpu` tests use
Qwen3-8B shapes in bf16. bf16 is checked only compiled: the interpreter truncates fp32 -> bf16 where the GPU
rounds to nearest, so an interpreted bf16 comparison would measure the interpreter.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from kvpilot.runtime.kernels.triton_utils import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before anything imports triton

from kvpilot.runtime.kernels.qkv_prepare import qkv_prepare_ref  # noqa: E402
from kvpilot.runtime.kernels.qkv_prepare_triton import qkv_prepare_triton  # noqa: E402
from kvpilot.runtime.layers.rotary import rope_cos_sin_cache  # noqa: E402

DEVICE = "cpu" if INTERPRET else "cuda"
F32_TOL = {"atol": 1e-5, "rtol": 1e-5}
BF16_TOL = {"atol": 1e-3, "rtol": 1.6e-2}  # fp32 math, one rounding on both sides: <= 1 bf16 ulp apart
# With q/k norm a head is rounded twice (after the norm, after rotary), on both sides. Sums in another order
# can put a normed value on the neighbouring bf16 number (1 ulp, ~1e-2 at |x| ~ 2), and rotary carries that
# absolute difference into outputs near 0. Such flips must stay rare.
BF16_NORM_TOL = {"atol": 2e-2, "rtol": 1.6e-2}


def assert_bf16_close(got: torch.Tensor, want: torch.Tensor, with_norm: bool) -> None:
    torch.testing.assert_close(got, want, **(BF16_NORM_TOL if with_norm else BF16_TOL))
    beyond_one_rounding = (got.float() - want.float()).abs() > 1e-3 + 1.6e-2 * want.float().abs()
    assert beyond_one_rounding.float().mean().item() < 0.02, "normed heads round differently too often"


def randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32, device: str = DEVICE) -> torch.Tensor:
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(*shape, generator=gen, device=device, dtype=dtype)


def sequence_slots(block_table: list[int], start: int, count: int, block_size: int) -> list[int]:
    """Slots of positions [start, start + count) of a sequence laid out over `block_table`."""
    return [block_table[p // block_size] * block_size + p % block_size for p in range(start, start + count)]


def run_both(
    qkv: torch.Tensor,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    caches: list[torch.Tensor],
    slots: torch.Tensor,
    norm: dict,
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """(q, k_cache, v_cache) from the reference and from the kernel, each on its own copy of the caches."""
    ref_k, ref_v = caches[0].clone(), caches[1].clone()
    ref_q = qkv_prepare_ref(qkv, positions, cos_sin, ref_k, ref_v, slots, **norm)
    got_k, got_v = caches[0].clone(), caches[1].clone()
    got_q = qkv_prepare_triton(qkv, positions, cos_sin, got_k, got_v, slots, **norm)
    return (ref_q, ref_k, ref_v), (got_q, got_k, got_v)


def qk_norm(on: bool, head_dim: int, dtype: torch.dtype = torch.float32, device: str = DEVICE) -> dict:
    if not on:
        return {}
    return {
        "q_norm_weight": randn(head_dim, seed=11, dtype=dtype, device=device),
        "k_norm_weight": randn(head_dim, seed=12, dtype=dtype, device=device),
        "eps": 1e-6,
    }


@pytest.mark.parametrize("block_size", [4, 16])
@pytest.mark.parametrize("with_norm", [False, True], ids=["no-norm", "qk-norm"])
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads"), [(2, 2), (4, 2), (8, 2), (3, 1)], ids=["mha", "gqa2", "gqa4", "mqa"]
)
def test_matches_reference_composition(
    num_heads: int, num_kv_heads: int, with_norm: bool, block_size: int
) -> None:
    head_dim, num_blocks = 8, 6
    # Two sequences, 7 tokens (odd): one crosses block boundaries, one padding token (slot -1) between.
    first = sequence_slots([3, 0, 5], block_size - 2, 4, block_size)
    second = sequence_slots([2, 4], 2 * block_size - 3, 2, block_size)
    slots = torch.tensor([*first, -1, *second], device=DEVICE)
    positions = torch.tensor([14, 15, 16, 17, 0, 29, 30], device=DEVICE)
    width = (num_heads + 2 * num_kv_heads) * head_dim
    qkv = randn(7, width + 5, seed=num_heads)[:, :width]  # a row stride wider than the row
    caches = [randn(num_blocks, block_size, num_kv_heads, head_dim, seed=20 + i) for i in range(2)]
    cos_sin = rope_cos_sin_cache(head_dim, 32, 10_000.0, None, DEVICE)
    (ref_q, ref_k, ref_v), (q, k, v) = run_both(qkv, positions, cos_sin, caches, slots, qk_norm(with_norm, 8))
    assert q.shape == (7, num_heads, head_dim) and q.is_contiguous()
    torch.testing.assert_close(q, ref_q, **F32_TOL)
    torch.testing.assert_close(k, ref_k, **F32_TOL)
    assert torch.equal(v, ref_v)  # v is copied, never computed
    written = torch.zeros(num_blocks * block_size, dtype=torch.bool)
    written[first + second] = True  # every other slot, the padding token's included, is left alone
    flat = k.view(num_blocks * block_size, -1).cpu()
    assert torch.equal(flat[~written], caches[0].view(num_blocks * block_size, -1).cpu()[~written])
    assert not torch.equal(flat[written], caches[0].view(num_blocks * block_size, -1).cpu()[written])


@pytest.mark.parametrize("with_norm", [False, True], ids=["no-norm", "qk-norm"])
def test_k_to_qkv_leaves_the_steps_k_rows_in_qkv(with_norm: bool) -> None:
    """k_to_qkv: qkv's k columns then hold each stored token's k exactly as its cache slot does (the
    prefill attention's step_kv reads them); q, the cache and v's columns are as without it."""
    num_heads, num_kv_heads, head_dim, block_size = 4, 2, 8, 4
    slots = torch.tensor(sequence_slots([2, 0], 0, 6, block_size), device=DEVICE)
    positions = torch.arange(6, device=DEVICE)
    width = (num_heads + 2 * num_kv_heads) * head_dim
    qkv = randn(6, width, seed=3)
    caches = [randn(3, block_size, num_kv_heads, head_dim, seed=30 + i) for i in range(2)]
    cos_sin = rope_cos_sin_cache(head_dim, 32, 10_000.0, None, DEVICE)
    norm = qk_norm(with_norm, head_dim)
    (ref_q, ref_k, ref_v), _ = run_both(qkv, positions, cos_sin, caches, slots, norm)
    inplace = qkv.clone()
    k_cache, v_cache = caches[0].clone(), caches[1].clone()
    q = qkv_prepare_triton(inplace, positions, cos_sin, k_cache, v_cache, slots, **norm, k_to_qkv=True)
    torch.testing.assert_close(q, ref_q, **F32_TOL)
    torch.testing.assert_close(k_cache, ref_k, **F32_TOL)
    assert torch.equal(v_cache, ref_v)
    k_cols = slice(num_heads * head_dim, (num_heads + num_kv_heads) * head_dim)
    cached_k = k_cache.view(-1, num_kv_heads, head_dim)[slots]  # [tokens, kv_heads, head_dim]
    assert torch.equal(inplace[:, k_cols].reshape(6, num_kv_heads, head_dim), cached_k)
    assert torch.equal(inplace[:, : k_cols.start], qkv[:, : k_cols.start])  # q columns untouched
    assert torch.equal(inplace[:, k_cols.stop :], qkv[:, k_cols.stop :])  # v columns untouched


def test_no_tokens_returns_empty_q_and_leaves_the_cache() -> None:
    cache = torch.ones(2, 4, 1, 8, device=DEVICE)
    empty = torch.zeros(0, dtype=torch.int64, device=DEVICE)
    q = qkv_prepare_triton(
        torch.zeros(0, 24, device=DEVICE), empty, torch.ones(4, 8, device=DEVICE), cache, cache, empty
    )
    assert q.shape == (0, 1, 8) and torch.equal(cache, torch.ones_like(cache))


@pytest.mark.parametrize("op", [qkv_prepare_ref, qkv_prepare_triton])
def test_rejects_bad_inputs(op: Callable[..., torch.Tensor]) -> None:
    cache, pos = torch.zeros(2, 4, 2, 8, device=DEVICE), torch.zeros(3, dtype=torch.int64, device=DEVICE)
    cos_sin = torch.ones(4, 8, device=DEVICE)
    with pytest.raises(ValueError, match="qkv width"):
        op(torch.zeros(3, 40, device=DEVICE), pos, cos_sin, cache, cache.clone(), pos)  # 1 q head for 2 kv
    with pytest.raises(ValueError, match="both q_norm_weight and k_norm_weight"):
        op(
            torch.zeros(3, 64, device=DEVICE),
            pos,
            cos_sin,
            cache,
            cache.clone(),
            pos,
            q_norm_weight=torch.ones(8, device=DEVICE),
        )


def test_kernel_rejects_mismatched_metadata() -> None:
    cache, pos = torch.zeros(2, 4, 2, 8, device=DEVICE), torch.zeros(3, dtype=torch.int64, device=DEVICE)
    qkv = torch.zeros(3, 64, device=DEVICE)
    with pytest.raises(ValueError, match="slot_mapping"):
        qkv_prepare_triton(qkv, pos, torch.ones(4, 8, device=DEVICE), cache, cache.clone(), pos[:2])
    with pytest.raises(ValueError, match="cos_sin_cache"):
        qkv_prepare_triton(qkv, pos, torch.ones(4, 6, device=DEVICE), cache, cache.clone(), pos)


# ---------------------------------------------------------------- GPU, Qwen3-8B shapes, bf16


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1024, 1, 7])  # a prefill chunk, one decode token, a decode batch
@pytest.mark.parametrize("with_norm", [True, False], ids=["qwen3", "llama"])
def test_gpu_qwen3_8b_bf16(num_tokens: int, with_norm: bool) -> None:
    bf16, heads, kv_heads, head_dim, block_size, num_blocks = torch.bfloat16, 32, 8, 128, 16, 128
    qkv = randn(num_tokens, (heads + 2 * kv_heads) * head_dim, seed=1, dtype=bf16, device="cuda")
    caches = [
        randn(num_blocks, block_size, kv_heads, head_dim, seed=2 + i, dtype=bf16, device="cuda")
        for i in range(2)
    ]
    gen = torch.Generator().manual_seed(num_tokens)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[1::9] = -1
    positions = torch.randint(0, 40_960, (num_tokens,), generator=gen)
    cos_sin = rope_cos_sin_cache(head_dim, 40_960, 1_000_000.0, None, "cuda")  # Qwen3's theta
    norm = qk_norm(with_norm, head_dim, dtype=bf16, device="cuda")
    (ref_q, ref_k, ref_v), (q, k, v) = run_both(qkv, positions.cuda(), cos_sin, caches, slots.cuda(), norm)
    assert_bf16_close(q, ref_q, with_norm)
    assert_bf16_close(k, ref_k, with_norm)
    assert torch.equal(v, ref_v)
