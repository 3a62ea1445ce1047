"""The 8-bit decode kernel (kernels/kv8_decode_triton.py, DecodeConfig.kv8) against the reference on the
dequantized cache: every widening (cast / ptx / bias), the native 8-bit QK dot, the swapped dots, single
pass and split-KV.

Under the CPU interpreter (no PTX) the "ptx" and "bias" widenings produce their values by casts, so with
16-bit activations these tests check each path's algebra (the fp16 q normalisation, the +1152 int8 bias
and its corrections, the e4m3 / 256 factor folded into the scales); the PTX itself runs in the gpu tests.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from kvpilot.runtime.kernels.triton_utils import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before anything imports triton

from kvpilot.runtime.kernels.decode_attention_triton import (  # noqa: E402
    DecodePlan,
    default_decode_config,
)
from kvpilot.runtime.kernels.kv8_path import Kv8Path  # noqa: E402

from tests.runtime.test_kv_cache_8bit import EIGHT_BIT, IDS, TOL, _ref, quantized_batch  # noqa: E402
from tests.runtime.test_kv_cache_8bit_decode_variants import QK_NATIVE_TOL, SMALL, _decode  # noqa: E402

# bf16 activations: q and the output are rounded to bf16 (outputs ~0.1-1), the dots run in fp16
BF16_TOL = {"atol": 2e-2, "rtol": 2e-2}


def _ref32(b: dict[str, torch.Tensor]) -> torch.Tensor:
    return _ref({**b, "q": b["q"].float()}, b["q"].shape[-1] ** -0.5)


@pytest.mark.parametrize("dtype", EIGHT_BIT, ids=IDS)
@pytest.mark.parametrize("cvt", ["cast", "ptx", "bias"])
@pytest.mark.parametrize("swap", [False, True], ids=["m16", "swap"])
def test_widening_paths_match_the_reference(dtype: torch.dtype, cvt: str, swap: bool) -> None:
    """bf16 activations (fp16 dots); single pass for the M = 16 dots, 3 splits for the swapped ones."""
    b = quantized_batch([37, 5, 48], [1, 1, 1], 8, 2, 32, 4, dtype, seed=21, act_dtype=torch.bfloat16)
    cfg = replace(SMALL, kv8=Kv8Path(cvt=cvt, swap=swap))
    out = _decode(b, cfg, DecodePlan(3, 16) if swap else DecodePlan(1, 64))
    torch.testing.assert_close(out.float(), _ref32(b), **BF16_TOL)


@pytest.mark.parametrize("dtype", EIGHT_BIT, ids=IDS)
@pytest.mark.parametrize("qk", ["widen", "native"])
def test_fp32_activations_are_exact(dtype: torch.dtype, qk: str) -> None:
    """fp32 activations (the CPU engine's dtype) widen to fp32, the native QK dot included: the
    reference's precision."""
    b = quantized_batch([37, 5, 48], [1, 1, 1], 8, 2, 32, 4, dtype, seed=22)
    out = _decode(b, replace(SMALL, kv8=Kv8Path(cvt="bias", qk=qk, swap=True)), DecodePlan(3, 16))
    torch.testing.assert_close(out, _ref(b, 32**-0.5), **TOL)


@pytest.mark.parametrize("dtype", EIGHT_BIT, ids=IDS)
@pytest.mark.parametrize("swap", [False, True], ids=["m16", "swap"])
def test_native_qk_dot_costs_only_the_rounding_of_q(dtype: torch.dtype, swap: bool) -> None:
    b = quantized_batch([37, 5, 48, 20], [1, 1, 1, 1], 8, 2, 32, 4, dtype, seed=23, act_dtype=torch.bfloat16)
    out = _decode(b, replace(SMALL, kv8=Kv8Path(cvt="bias", qk="native", swap=swap)), DecodePlan(3, 16))
    err = (out.float() - _ref32(b)).abs().max().item()
    assert err < QK_NATIVE_TOL[dtype], err


def test_zero_context_rows_give_zeros() -> None:
    """Padding rows (context 0, as in a CUDA graph's unused slots) write zeros, not NaN."""
    b = quantized_batch([20, 1], [1, 1], 4, 2, 16, 4, torch.int8, seed=24, act_dtype=torch.bfloat16)
    b["context_lens"] = torch.tensor([20, 0], dtype=torch.int32, device=b["q"].device)
    out = _decode(b, replace(SMALL, kv8=Kv8Path(cvt="bias", swap=True)), DecodePlan(1, 32))
    assert bool((out[1] == 0).all())
    torch.testing.assert_close(out[0].float(), _ref32(b)[0], **BF16_TOL)


@pytest.mark.parametrize(("splits", "kv8_used"), [(1, True), (3, False)])
def test_int8_default_takes_the_kv8_kernel_for_single_pass_plans_only(
    splits: int, kv8_used: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """decode_plan.INT8_DECODE: split-KV plans keep the shared kernel (Kv8Path.split_plans False)."""
    from kvpilot.runtime.kernels import kv8_decode_triton

    calls = []
    real = kv8_decode_triton.kv8_kernel
    monkeypatch.setattr(kv8_decode_triton, "kv8_kernel", lambda *a: calls.append(a) or real(*a))
    # fp32 activations: the interpreter's bf16 dots (the shared kernel's, for int8) are broken
    b = quantized_batch([37, 5, 48], [1, 1, 1], 8, 2, 32, 4, torch.int8, seed=25)
    cfg = replace(default_decode_config(torch.int8), block_n=16, min_partition=16)
    out = _decode(b, cfg, DecodePlan(splits, 16 if splits > 1 else 64))
    assert bool(calls) == kv8_used
    torch.testing.assert_close(out, _ref(b, 32**-0.5), **TOL)


def test_path_rejects_unknown_modes() -> None:
    with pytest.raises(ValueError, match="cvt"):
        Kv8Path(cvt="lut")
    with pytest.raises(ValueError, match="qk"):
        Kv8Path(qk="fp4")
    with pytest.raises(ValueError, match="diag"):
        Kv8Path(diag="all")


# ---- GPU: Qwen3-8B heads, bf16 activations: the PTX widenings and the wgmma (swapped) dots -------------
GPU_PATHS = {  # 128-position tiles, 2 stages; "default" is default_decode_config's (int8: m16 native ptx)
    "default": None,
    "m16 native ptx": Kv8Path(cvt="ptx", qk="native"),
    "m16 widen auto": Kv8Path(),
    "swap native bias": Kv8Path(cvt="bias", qk="native", swap=True),
    "swap widen auto": Kv8Path(swap=True),
}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", EIGHT_BIT, ids=IDS)
@pytest.mark.parametrize("path", list(GPU_PATHS))
@pytest.mark.parametrize(("num_seqs", "ctx"), [(8, 4096), (3, 1000)])
def test_gpu_kv8_paths(dtype: torch.dtype, path: str, num_seqs: int, ctx: int) -> None:
    ctx_lens = [ctx - 37 * i for i in range(num_seqs)]
    b = quantized_batch(ctx_lens, [1] * num_seqs, 32, 8, 128, 16, dtype, act_dtype=torch.bfloat16)
    cfg = default_decode_config(dtype)
    cfg = cfg if GPU_PATHS[path] is None else replace(cfg, block_n=128, num_stages=2, kv8=GPU_PATHS[path])
    out = _decode(b, cfg).float()
    if cfg.kv8 is not None and cfg.kv8.qk == "native":
        assert (out - _ref32(b)).abs().max().item() < QK_NATIVE_TOL[dtype]
    else:
        torch.testing.assert_close(out, _ref32(b), atol=2e-2, rtol=2e-2)
