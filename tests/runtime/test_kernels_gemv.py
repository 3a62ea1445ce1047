"""The bf16 decode GEMV (kernels/gemv_triton.py) and its fused prologues vs the references (kernels/gemv.py),
and the decoder layer's fused decode path vs its unfused one.

Interpreted on CPU without CUDA (tiny shapes, float32: exact up to summation order; one bf16 case), compiled
on the GPU otherwise. Every multiply path and split-K reduction is covered.
"""

from __future__ import annotations

import pytest
import torch
from kvpilot.runtime.kernels.triton_utils import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before anything imports triton

from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import torch.nn.functional as F  # noqa: E402
from kvpilot.runtime.engine.batch import SeqChunk, StepBatch  # noqa: E402
from kvpilot.runtime.engine.engine_args import EngineArgs  # noqa: E402
from kvpilot.runtime.engine.model_runner import ModelRunner  # noqa: E402
from kvpilot.runtime.kernels import gemv_dispatch  # noqa: E402
from kvpilot.runtime.kernels.gemv import norm_linear_ref, silu_linear_ref  # noqa: E402
from kvpilot.runtime.kernels.gemv_triton import (  # noqa: E402
    GemvBf16Config,
    default_gemv_bf16_config,
    gemv_bf16,
    norm_gemv_bf16,
    silu_gemv_bf16,
)

DEVICE = "cpu" if INTERPRET else "cuda"
F32_TOL = {"atol": 1e-4, "rtol": 1e-4}
# Whole-model logits, fused vs unfused on the GPU in float32: split-K partials and the norm's 1/rms applied
# after the dot sum in another order than cuBLAS (H200: up to 2.5e-4 on the tiny checkpoints' logits)
MODEL_F32_TOL = {"atol": 1e-3, "rtol": 1e-3}
# (multiply path, columns, K tile, split-K, reduction): fma and dot, ragged N, both deterministic reductions
CONFIGS = [  # multiply-adds take M = 1 (block_n 4), 2 (block_n 8) and 3 rows (prefetch); dots M = 3
    GemvBf16Config(block_n=4, block_k=16),
    GemvBf16Config(block_n=8, block_k=32, split_k=2),
    GemvBf16Config(block_n=4, block_k=16, prefetch=True),
    GemvBf16Config(block_n=16, block_k=16, split_k=2, use_dot=True, reduce="workspace"),
    # programmatic dependent launch: compiled GPU runs only (the interpreter has no grid dependency control)
    *([] if INTERPRET else [GemvBf16Config(block_n=8, block_k=16, pdl=True)]),
]


def _rows(cfg: GemvBf16Config) -> int:
    return 3 if cfg.use_dot or cfg.prefetch else cfg.block_n // 4


def randn(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    return torch.randn(*shape, generator=gen, device=DEVICE, dtype=dtype)


@pytest.mark.parametrize("cfg", CONFIGS)
def test_plain_gemv_matches_linear(cfg: GemvBf16Config) -> None:
    m = _rows(cfg)
    x, w = randn(m, 64, seed=1), randn(36, 64, seed=2)  # N = 36: the last column block is partial
    torch.testing.assert_close(gemv_bf16(x, w, cfg), F.linear(x, w), **F32_TOL)


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("with_residual", [True, False])
def test_norm_gemv_matches_rmsnorm_then_linear(cfg: GemvBf16Config, with_residual: bool) -> None:
    m = _rows(cfg)
    hidden, w, nw = randn(m, 64, seed=3), randn(20, 64, seed=4), randn(64, seed=5)
    residual = randn(m, 64, seed=6) if with_residual else None
    y, h = norm_gemv_bf16(hidden, residual, nw, 1e-6, w, cfg)
    y_ref, h_ref = norm_linear_ref(hidden, residual, nw, 1e-6, w)
    torch.testing.assert_close(y, y_ref, **F32_TOL)
    torch.testing.assert_close(h, h_ref, **F32_TOL)


@pytest.mark.parametrize("cfg", CONFIGS)
def test_silu_gemv_matches_silu_and_mul_then_linear(cfg: GemvBf16Config) -> None:
    gate_up, w = randn(_rows(cfg), 128, seed=7), randn(24, 64, seed=8)
    torch.testing.assert_close(silu_gemv_bf16(gate_up, w, cfg), silu_linear_ref(gate_up, w), **F32_TOL)


def test_bf16_fused_norm_within_bf16_tolerance() -> None:
    """bf16: the kernel scales by 1 / rms after the sum (the reference rounds the normed input first)."""
    hidden, residual = randn(1, 64, seed=9, dtype=torch.bfloat16), randn(1, 64, seed=10, dtype=torch.bfloat16)
    w, nw = randn(16, 64, seed=11, dtype=torch.bfloat16), randn(64, seed=12, dtype=torch.bfloat16)
    y, h = norm_gemv_bf16(hidden, residual, nw, 1e-6, w, GemvBf16Config(block_n=8, block_k=32))
    y_ref, h_ref = norm_linear_ref(hidden, residual, nw, 1e-6, w)
    err = (y.float() - y_ref.float()).norm() / y_ref.float().norm()
    assert err < 1e-2, err  # per element: bf16 rounding of the inputs meets cancellation in the sum
    # one bf16 add on both sides; the interpreter rounds float32 -> bf16 toward zero: within 1 ulp
    torch.testing.assert_close(h, h_ref, atol=0, rtol=2**-7)


def test_default_config_fills_the_gpu() -> None:
    """Qwen3-0.6B's o_proj (N = 1024) needs split-K to give every SM programs; Qwen3-8B's gate_up does not."""
    small, big = default_gemv_bf16_config(1, 1024, 2048, 132), default_gemv_bf16_config(1, 24576, 4096, 132)
    assert -(-1024 // small.block_n) * small.split_k >= 264 and small.split_k > 1
    assert big.split_k == 1


def test_rejects_launches_that_do_not_fit() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        gemv_bf16(randn(1, 48, seed=0), randn(8, 48, seed=1), GemvBf16Config(split_k=5))
    with pytest.raises(ValueError, match="at most 4 rows"):
        gemv_bf16(randn(5, 48, seed=0), randn(8, 48, seed=1), GemvBf16Config(use_dot=False))


# ---------------------------------------------------------------- the model's fused decode path


def _runner(ckpt: Path, fused: bool) -> ModelRunner:
    runner = ModelRunner(
        EngineArgs(
            model=str(ckpt),
            block_size=4,
            num_kv_blocks=8,
            device=DEVICE,
            dtype="float32",
            kernel_backend="triton",
            enforce_eager=True,  # graphs captured before the switch below would hold the fused path
        )
    )
    for layer in runner.model.model.layers:
        layer.fused_gemv = fused
    return runner


@pytest.mark.parametrize("family", ["qwen3", "qwen2"])  # qwen2: q/k/v bias, so only the MLP fuses
def test_fused_decode_path_matches_unfused(
    family: str, tiny_checkpoint_factory: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefill (11 tokens: unfused in both runners), then single-token decode steps (GEMV_MAX_M): the
    fused runner's logits and KV cache equal the unfused runner's, and its GEMV kernels ran."""
    calls = {"norm": 0, "silu": 0}
    norm_gemv, silu_gemv = gemv_dispatch.norm_gemv_bf16, gemv_dispatch.silu_gemv_bf16

    def count(kind: str, fn: Callable[..., object]) -> Callable[..., object]:
        def counted(*args: object, **kwargs: object) -> object:
            calls[kind] += 1
            return fn(*args, **kwargs)

        return counted

    monkeypatch.setattr(gemv_dispatch, "norm_gemv_bf16", count("norm", norm_gemv))
    monkeypatch.setattr(gemv_dispatch, "silu_gemv_bf16", count("silu", silu_gemv))
    ckpt = tiny_checkpoint_factory(family, num_key_value_heads=2)
    fused, unfused = _runner(ckpt, True), _runner(ckpt, False)
    steps = [
        StepBatch(
            [
                SeqChunk(0, [5, 9, 17, 33, 2, 8], 0, [3, 0], True),
                SeqChunk(1, [7, 7, 100, 250, 3], 0, [1, 2], True),
            ]
        ),
        StepBatch([SeqChunk(0, [12], 6, [3, 0], True)]),
        StepBatch([SeqChunk(1, [77], 5, [1, 2], True)]),
        StepBatch([SeqChunk(0, [40], 7, [3, 0], True)]),
    ]
    for i, step in enumerate(steps):
        if i == 1:
            assert calls == {"norm": 0, "silu": 0}  # the prefill step took the unfused path
        torch.testing.assert_close(fused.execute(step), unfused.execute(step), **MODEL_F32_TOL)
    layers = len(fused.model.model.layers)
    sites = 2 if family == "qwen3" else 1  # norm fusions per layer: qkv and gate_up (qwen2: gate_up only)
    assert calls == {"norm": 3 * sites * layers, "silu": 3 * layers}
    for got, ref in zip(fused.kv_caches, unfused.kv_caches, strict=True):
        torch.testing.assert_close(got[0], ref[0], **MODEL_F32_TOL)
        torch.testing.assert_close(got[1], ref[1], **MODEL_F32_TOL)
