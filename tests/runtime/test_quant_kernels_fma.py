"""The multiply-add decode GEMVs against their torch references: kernels/int_gemv_fma_triton.py (int4 and
int8, 1-4 tokens) and the fp8 weight-only GEMV's multiply-add path at other K tiles. Without CUDA they run
under TRITON_INTERPRET=1 at tiny shapes."""

from __future__ import annotations

import pytest
import torch
from kvpilot.runtime.kernels.triton_utils import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before anything imports triton

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from kvpilot.runtime.kernels import int_gemv_fma_triton as fma_kernels  # noqa: E402
from kvpilot.runtime.kernels.fp8_gemv_triton import fp8_gemv  # noqa: E402
from kvpilot.runtime.kernels.int_gemv_fma_triton import (  # noqa: E402
    FmaConfig,
    default_fma_split,
    int_gemv_fma,
)
from kvpilot.runtime.kernels.int_gemv_triton import GemvConfig  # noqa: E402
from kvpilot.runtime.kernels.quant_reference import (  # noqa: E402
    fp8_weight_only_ref,
    int_gemm_ref,
    quantize_fp8_rows_ref,
)
from kvpilot.runtime.quant.int_weight import quantize_rtn  # noqa: E402

DEVICE = torch.device("cpu" if INTERPRET else "cuda")
TOL = {"rtol": 1e-4, "atol": 1e-4}

CONFIGS = [
    FmaConfig(block_n=32, tiles=1, split_k=2),  # prefetch, fixup
    FmaConfig(block_n=16, tiles=2, split_k=1, prefetch=False),
    FmaConfig(block_n=32, tiles=1, split_k=2, reduce="atomic_f32"),
    FmaConfig(block_n=64, tiles=1, split_k=2, reduce="workspace", num_warps=2),
    FmaConfig(block_n=16, tiles=1, split_k=2, reduce="fixup_wide"),
    FmaConfig(block_n=32, tiles=1, split_k=1, l2_ahead=2),  # the L2 prefetch: a no-op asm here
]


@pytest.mark.parametrize("split_k", [2, 6])  # 6: the last round trip of four loads half masked
def test_fixup_wide_sums_the_same_partials_as_fixup(split_k: int) -> None:
    """split_k_triton's fixup_wide: the same float32 sums in the same order as fixup, bit for bit."""
    gen = torch.Generator().manual_seed(split_k)
    w = quantize_rtn(torch.randn(32, 768, generator=gen), 4, 128, sym=False)
    q, s, z = w.qweight.to(DEVICE), w.scales.to(DEVICE), w.zeros.to(DEVICE)
    x = torch.randn(2, 768, generator=gen).to(DEVICE)
    a, b = (int_gemv_fma(x, q, s, z, 4, FmaConfig(16, 1, split_k, reduce=r)) for r in ("fixup", "fixup_wide"))
    assert torch.equal(a, b)
    torch.testing.assert_close(a, int_gemm_ref(x, q, s, z, 4), **TOL)


@triton.jit
def _prefetch_nothing(at):
    """The interpreter runs no inline PTX and has no L2: the prefetch's addresses are computed, no more."""
    tl.static_assert(len(at.shape) == 3)


@pytest.mark.parametrize(
    "config", CONFIGS, ids=lambda c: f"bn{c.block_n}-t{c.tiles}-{c.reduce}-l2{c.l2_ahead}"
)
@pytest.mark.parametrize(("bits", "group"), [(4, 128), (4, 32), (8, -1), (8, 64)])
@pytest.mark.parametrize("m", [1, 3])
def test_fma_gemv_matches_reference(
    monkeypatch: pytest.MonkeyPatch, config: FmaConfig, bits: int, group: int, m: int
) -> None:
    """N = 48 (masked columns), K = 256 (two pack tiles); group 32 / 64 < the 128-row tile: zero points
    and scales per value slot; m = 3: tokens in their own accumulators, the fourth slot reading row 2."""
    if INTERPRET:
        monkeypatch.setattr(fma_kernels, "_prefetch_l2", _prefetch_nothing)
    n, k = 48, 256
    gen = torch.Generator().manual_seed(bits * 10 + m)
    w = quantize_rtn(torch.randn(n, k, generator=gen), bits, group, sym=bits == 8)
    qweight, scales, zeros = w.qweight.to(DEVICE), w.scales.to(DEVICE), w.zeros.to(DEVICE)
    x = torch.randn(m, k, generator=gen).to(DEVICE)
    got = int_gemv_fma(x, qweight, scales, zeros, bits, config)
    torch.testing.assert_close(got, int_gemm_ref(x, qweight, scales, zeros, bits), **TOL)


def test_fma_gemv_rejects_what_it_cannot_run() -> None:
    w = quantize_rtn(torch.randn(16, 256), 4, 128, sym=False)
    q, s, z = w.qweight.to(DEVICE), w.scales.to(DEVICE), w.zeros.to(DEVICE)
    with pytest.raises(ValueError, match="does not fit"):
        int_gemv_fma(torch.ones(5, 256, device=DEVICE), q, s, z, 4, FmaConfig())  # 5 > FMA_MAX_M tokens
    with pytest.raises(ValueError, match="does not fit"):
        int_gemv_fma(torch.ones(1, 256, device=DEVICE), q, s, z, 4, FmaConfig(split_k=4))


def test_default_fma_split_fills_the_sms() -> None:
    # Qwen3-8B on an H200: qkv (96 blocks of 64 columns) needs 4 splits for 2 programs per SM; gate_up none
    assert default_fma_split(6144, 4096, 4, FmaConfig(), 132) == 4
    assert default_fma_split(24576, 4096, 4, FmaConfig(), 132) == 1
    assert default_fma_split(4096, 12288, 8, FmaConfig(tiles=2), 132, per_sm=4) == 12


@pytest.mark.parametrize(("block_n", "block_k", "warps"), [(8, 64, 4), (4, 128, 1), (16, 32, 2)])
def test_fp8_gemv_multiply_adds_at_other_k_tiles(block_n: int, block_k: int, warps: int) -> None:
    gen = torch.Generator().manual_seed(block_k)
    weight, scale = quantize_fp8_rows_ref(torch.randn(40, 256, generator=gen))
    weight, scale = weight.to(DEVICE), scale.view(-1).to(DEVICE)
    x = torch.randn(1, 256, generator=gen).to(DEVICE)
    cfg = GemvConfig(False, block_n, 2, num_warps=warps, num_stages=1, block_m=1, block_k=block_k)
    torch.testing.assert_close(fp8_gemv(x, weight, scale, cfg), fp8_weight_only_ref(x, weight, scale), **TOL)


def test_int_gemm_sends_int8_at_one_token_to_the_fma_gemv() -> None:
    """The dispatch (w4a16_triton.int_gemm): int8 at M = 1 through the multiply-add GEMV, whose default
    shape is the H200 sweep's (64 columns, split-K for 2 programs per SM), and the same numbers as the
    reference; at M = 2 the tensor-core GEMV."""
    from kvpilot.runtime.kernels.int_gemv_fma_triton import default_fma_config
    from kvpilot.runtime.kernels.w4a16_triton import int_gemm

    cfg = default_fma_config(4096, 4096, 8, 132)
    assert (cfg.block_n, cfg.tiles, cfg.prefetch, cfg.num_warps, cfg.split_k) == (64, 1, True, 4, 8)
    w = quantize_rtn(torch.randn(48, 256), 8, -1, sym=True)
    q, s, z = w.qweight.to(DEVICE), w.scales.to(DEVICE), w.zeros.to(DEVICE)
    for m in (1, 2):
        x = torch.randn(m, 256).to(DEVICE)
        torch.testing.assert_close(int_gemm(x, q, s, z, 8), int_gemm_ref(x, q, s, z, 8), **TOL)
