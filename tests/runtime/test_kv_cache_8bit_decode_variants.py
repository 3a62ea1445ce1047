"""The selectable 8-bit decode paths (DecodeConfig.v_widen, qk_dot) against the reference on the dequantized
cache, and what a native QK dot costs in precision (q rounded per row to the cache's 8-bit type).

Under the CPU interpreter v_widen="tile" widens V by a cast (the interpreter runs no PTX); the inline-PTX
widening itself is checked by the gpu tests here and by every gpu test that runs the 8-bit defaults.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from kvpilot.runtime.kernels.triton_utils import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before anything imports triton

from kvpilot.runtime.kernels.decode_attention_triton import (  # noqa: E402
    DecodeConfig,
    DecodePlan,
    default_decode_config,
    paged_decode_attention_triton,
)

from tests.runtime.test_kv_cache_8bit import EIGHT_BIT, IDS, TOL, _ref, quantized_batch  # noqa: E402

SMALL = DecodeConfig(block_n=16, min_partition=16)
# max |error| a native QK dot adds, on unit-variance q/K/V (outputs ~0.1-1): q rounded to int8 keeps
# 1/254 of its row maximum per element, to e4m3 1/16 of each element (measured on this data: ~0.007 and
# ~0.08 at head_dim 128).
QK_NATIVE_TOL = {torch.int8: 0.03, torch.float8_e4m3fn: 0.2}


def _decode(b: dict[str, torch.Tensor], cfg: DecodeConfig, plan: DecodePlan | None = None) -> torch.Tensor:
    return paged_decode_attention_triton(
        b["q"],
        b["k_cache"],
        b["v_cache"],
        b["context_lens"],
        b["block_tables"],
        _scale(b),
        config=cfg,
        plan=plan,
        k_scale=b["k_scale"],
        v_scale=b["v_scale"],
    )


def _scale(b: dict[str, torch.Tensor]) -> float:
    return b["q"].shape[-1] ** -0.5


@pytest.mark.parametrize("dtype", EIGHT_BIT, ids=IDS)
@pytest.mark.parametrize("v_widen", ["tile", "operand"])
@pytest.mark.parametrize("splits", [1, 3])
def test_v_widen_paths_match_the_reference(dtype: torch.dtype, v_widen: str, splits: int) -> None:
    b = quantized_batch([37, 5, 48], [1, 1, 1], 6, 2, 16, 4, dtype, seed=11 + splits)
    out = _decode(b, replace(SMALL, v_widen=v_widen), DecodePlan(splits, 16))
    torch.testing.assert_close(out, _ref(b, _scale(b)), **TOL)


@pytest.mark.parametrize("dtype", EIGHT_BIT, ids=IDS)
def test_native_qk_dot_costs_only_the_rounding_of_q(dtype: torch.dtype) -> None:
    # head_dim 32: the smallest K of an 8-bit tensor-core dot (below it the kernel widens instead)
    b = quantized_batch([37, 5, 48, 20], [1, 1, 1, 1], 8, 2, 32, 4, dtype, seed=12)
    ref = _ref(b, _scale(b))
    widened = _decode(b, SMALL)
    native = _decode(b, replace(SMALL, qk_dot="native"))
    torch.testing.assert_close(widened, ref, **TOL)
    err = (native - ref).abs().max().item()
    assert err < QK_NATIVE_TOL[dtype], err
    # the error is q's rounding, not a broken dot: q already on the 8-bit grid of its row gives no error
    q = b["q"]
    qmax = 127.0 if dtype == torch.int8 else 448.0
    row_scale = q.abs().amax(-1, keepdim=True) / qmax
    on_grid = (q / row_scale).round() if dtype == torch.int8 else (q / row_scale).to(dtype).float()
    b_grid = {**b, "q": on_grid * row_scale}
    torch.testing.assert_close(
        _decode(b_grid, replace(SMALL, qk_dot="native")), _ref(b_grid, _scale(b)), **TOL
    )


def test_config_rejects_unknown_modes() -> None:
    with pytest.raises(ValueError, match="qk_dot"):
        DecodeConfig(qk_dot="fp4")
    with pytest.raises(ValueError, match="v_widen"):
        DecodeConfig(v_widen="maybe")
    with pytest.raises(ValueError, match="block_n"):
        DecodeConfig(block_n=48)


def test_8bit_defaults_are_the_measured_fastest() -> None:
    """H200, 64 x 4k (benchmarks/sweep_kv8.py, decode_plan.py): int8: the kv8 kernel's int8 x int8 QK dot
    with V widened by the magic number, 128 x 2 stages; e4m3: the shared kernel's operand widening."""
    int8 = default_decode_config(torch.int8)
    assert int8.kv8 is not None
    assert (int8.kv8.cvt, int8.kv8.qk, int8.kv8.swap, int8.block_n, int8.num_stages) == (
        "ptx",
        "native",
        False,
        128,
        2,
    )
    fp8 = default_decode_config(torch.float8_e4m3fn)
    assert (fp8.kv8, fp8.v_widen, fp8.qk_dot, fp8.block_n, fp8.num_stages) == (
        None,
        "operand",
        "widen",
        128,
        2,
    )


# ---- GPU: Qwen3-8B heads, bf16 activations: every variant the sweep times is correct -------------------
GPU_VARIANTS = {  # the variants benchmarks/sweep_attention.py times (the default first)
    "operand": DecodeConfig(block_n=128, v_widen="operand"),
    "tile": DecodeConfig(block_n=128, v_widen="tile"),
    "qk_native": DecodeConfig(block_n=128, qk_dot="native", v_widen="tile"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", EIGHT_BIT, ids=IDS)
@pytest.mark.parametrize("variant", list(GPU_VARIANTS))
@pytest.mark.parametrize(("num_seqs", "ctx"), [(8, 4096), (3, 1000)])
def test_gpu_decode_variants(dtype: torch.dtype, variant: str, num_seqs: int, ctx: int) -> None:
    ctx_lens = [ctx - 37 * i for i in range(num_seqs)]
    b = quantized_batch(ctx_lens, [1] * num_seqs, 32, 8, 128, 16, dtype, act_dtype=torch.bfloat16)
    out = _decode(b, GPU_VARIANTS[variant]).float()
    ref = _ref({**b, "q": b["q"].float()}, 128**-0.5)
    if variant.startswith("qk_native"):
        assert (out - ref).abs().max().item() < QK_NATIVE_TOL[dtype]
    else:
        torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)
