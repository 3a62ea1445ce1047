"""w4a16_gemm.cu's SCALE_AFTER builds (GemmSpec.scale_after): int4 builds whose mmas take q - z exactly and
whose group sums are scaled in fp32 (biased builds, without x sums; WGMMA builds at 16 tokens a CTA, with one
FMA a pair in place of two). The rule and the sm_90 build on CPU (offline); the GEMM against the exact
reference and the x-sum build on the GPU (marked gpu)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from kvpilot.runtime.kernels.w4a16_gemm_cuda import SOURCE
from kvpilot.runtime.kernels.w4a16_gemm_plan import GemmSpec, launch_for

from tests.runtime.nvrtc_offline import ptx, sm90_resources
from tests.runtime.w4a16_cases import int4_case, reference_gemm, sms


def test_biased_builds_and_16_token_wgmma_builds_without_offsets_scale_after() -> None:
    def after(m: int, wgmma_from: int = 3, offsets: bool = False, bits: int = 4, group: int = 128) -> bool:
        plan = launch_for(
            m,
            4096,
            4096,
            group,
            132,
            True,
            wgmma_from=wgmma_from,
            offsets=offsets,
            bits=bits,
            scale_after=True,
        )
        return plan.spec.scale_after

    assert [after(m) for m in (3, 8, 16, 17, 64)] == [True, True, True, False, False]  # biased: <= 16 tokens
    assert not after(8, offsets=True)  # an offset needs the x sums
    assert not after(8, bits=8)  # int8 is never biased
    assert not launch_for(8, 4096, 4096, 128, 132, True, scale_after=False).spec.scale_after
    assert after(16, wgmma_from=2)  # 16-token WGMMA CTAs in one group a tile
    assert not after(16, wgmma_from=2, group=32)
    assert not after(16, wgmma_from=2, bits=8)  # its pairs are int4's


QWEN3_8B = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}


@pytest.mark.parametrize("m", [9, 12, 16])
def test_9_to_16_tokens_take_16_token_wgmma_ctas_where_k_slices_are_long_or_the_output_wide(m: int) -> None:
    def plan(layer: str, group: int = 128, **kw: Any) -> GemmSpec:
        n, k = QWEN3_8B[layer]
        return launch_for(m, n, k, group, 132, True, **{"wgmma_from": 3, **kw}).spec

    # gate_up: 2 K slices of 16 tiles, down: 8 of 12 (4 warps); qkv: 8 warps, as its biased build
    for layer, warps in (("gate_up", 4), ("down", 4), ("qkv", 8)):
        spec = plan(layer)
        assert spec.wgmma and spec.scale_after and spec.token_tiles == 2 and spec.warps == warps, layer
        assert not spec.biased and spec.stages == 5 - 2 * (warps == 8), layer  # 2 CTAs an SM in 8 warps
    spec = plan("o")  # 8 slices of 4 tiles in 4 warps: the biased build
    assert spec.biased and spec.scale_after and not spec.wgmma
    # only where the measured build applies: not groups of 32, offsets, int8, x-sum builds or mma.sync GPUs
    assert plan("gate_up", group=32).biased
    assert plan("down", offsets=True).biased
    assert not plan("down", bits=8).wgmma
    assert plan("gate_up", scale_after=False).biased
    assert not plan("gate_up", wgmma_from=0).wgmma
    assert plan("down", group=12288).wgmma  # per channel: one group of all K rows


def test_the_8_warp_16_token_wgmma_build_fits_2_ctas_an_sm(tmp_path: Path) -> None:
    spec = launch_for(16, 6144, 4096, 128, 132, True, wgmma_from=3).spec
    assert spec.warps == 8 and spec.wgmma and spec.scale_after
    registers, spills, report = sm90_resources(ptx(SOURCE, spec.macros(), arch="90a"), tmp_path, arch="90a")
    assert spills == 0 and registers <= 128, report  # 256 threads x 128 registers: 2 CTAs an SM


@pytest.mark.parametrize(("nt", "per_tile", "warps"), [(1, 1, 4), (2, 1, 8), (2, 4, 4), (1, 2, 4)])
def test_compiles_for_sm90_with_one_fma_a_pair_and_no_ones_mma(
    nt: int, per_tile: int, warps: int, tmp_path: Path
) -> None:
    spec = GemmSpec(warps, nt, 1, 3, True, biased=True, groups_per_tile=per_tile, scale_after=True)
    code = ptx(SOURCE, spec.macros())
    registers, spills, report = sm90_resources(code, tmp_path)
    assert spills == 0 and registers <= (128 if warps == 8 else 168), report  # 2 / 3 CTAs an SM
    x_sums = ptx(SOURCE, dataclasses.replace(spec, scale_after=False).macros())
    # a k-step's A pairs: 8 FMAs (q - z), and NT weight mmas a column block with no ones-mma beside them
    assert code.count(b"fma.rn.bf16x2") > 0 == x_sums.count(b"fma.rn.bf16x2")
    assert code.count(b"mma.sync.aligned") < x_sums.count(b"mma.sync.aligned")


def test_the_16_token_wgmma_build_compiles_with_one_fma_a_pair(tmp_path: Path) -> None:
    spec = GemmSpec(4, 2, 1, 5, True, wgmma=True, scale_after=True)
    code = ptx(SOURCE, spec.macros(), arch="90a")
    registers, spills, report = sm90_resources(code, tmp_path, arch="90a")
    assert spills == 0 and registers <= 168, report
    dequantizing = ptx(SOURCE, dataclasses.replace(spec, scale_after=False).macros(), arch="90a")
    assert 2 * code.count(b"fma.rn.bf16x2") == dequantizing.count(b"fma.rn.bf16x2") > 0
    assert code.count(b"wgmma.mma_async") == dequantizing.count(b"wgmma.mma_async") > 0


def test_an_offsets_build_refuses_scale_after() -> None:
    spec = GemmSpec(4, 1, 1, biased=True, offsets=True, scale_after=True)
    with pytest.raises(AssertionError, match="SCALE_AFTER: biased builds, or WGMMA at 16 tokens"):
        ptx(SOURCE, spec.macros())


@pytest.mark.gpu
@pytest.mark.parametrize("m", [3, 8, 13, 16])
@pytest.mark.parametrize(("n", "k", "group"), [(6144, 4096, 128), (2048, 4096, 32), (1024, 2048, -1)])
@pytest.mark.parametrize("sym", [False, True], ids=["zero-point", "sym"])
def test_matches_the_exact_reference_and_the_x_sum_build(
    m: int, n: int, k: int, group: int, sym: bool
) -> None:
    from kvpilot.runtime.kernels.w4a16_gemm_cuda import w4a16_gemm

    x, qweight, scales, zeros = int4_case(m, n, k, group, sym, seed=m + n)
    g = k if group == -1 else group
    after, x_sums = (launch_for(m, n, k, g, sms(), True, scale_after=s) for s in (True, False))
    assert after.spec.scale_after and after.spec.biased and not x_sums.spec.scale_after
    exact = reference_gemm(x, qweight, scales, zeros, biased=True)
    for slices in (1, 4):
        out = w4a16_gemm(x, qweight, scales, zeros, sms(), after.sliced(slices)).float()
        torch.testing.assert_close(out, exact, atol=1e-2, rtol=1e-2)
        other = w4a16_gemm(x, qweight, scales, zeros, sms(), x_sums.sliced(slices)).float()
        torch.testing.assert_close(out, other, atol=1e-2, rtol=1e-2)
    assert torch.equal(
        w4a16_gemm(x, qweight, scales, zeros, sms(), after),
        w4a16_gemm(x, qweight, scales, zeros, sms(), after),
    )


@pytest.mark.gpu
@pytest.mark.parametrize("m", [9, 16])
@pytest.mark.parametrize(("n", "k", "group"), [(6144, 4096, 128), (1024, 2048, -1)])
@pytest.mark.parametrize("sym", [False, True], ids=["zero-point", "sym"])
def test_the_16_token_wgmma_build_matches_the_exact_reference(
    m: int, n: int, k: int, group: int, sym: bool
) -> None:
    from kvpilot.runtime.kernels.w4a16_gemm_cuda import w4a16_gemm

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("warpgroup mmas need sm_90")
    x, qweight, scales, zeros = int4_case(m, n, k, group, sym, seed=m + n)
    plan = launch_for(m, n, k, k if group == -1 else group, sms(), True, wgmma_from=2, scale_after=True)
    assert plan.spec.wgmma and plan.spec.scale_after and plan.spec.token_tiles == 2
    exact = reference_gemm(x, qweight, scales, zeros, biased=True)
    biased = launch_for(m, n, k, k if group == -1 else group, sms(), True, scale_after=True)  # mma.sync
    assert biased.spec.biased and biased.spec.scale_after and not biased.spec.wgmma
    for slices in (1, 4):
        out = w4a16_gemm(x, qweight, scales, zeros, sms(), plan.sliced(slices)).float()
        torch.testing.assert_close(out, exact, atol=1e-2, rtol=1e-2)
        other = w4a16_gemm(x, qweight, scales, zeros, sms(), biased.sliced(slices)).float()
        torch.testing.assert_close(out, other, atol=1e-2, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [9, 16])
# 8 slices of 12 tiles, 3 of 10, 8 warps (qkv's width)
@pytest.mark.parametrize(("n", "k"), [(1024, 12288), (12288, 4096), (6144, 4096)])
def test_the_dispatch_takes_16_token_wgmma_ctas_where_k_slices_are_long_or_the_output_wide(
    m: int, n: int, k: int
) -> None:
    from kvpilot.runtime.kernels.w4a16_gemm_cuda import w4a16_gemm

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("warpgroup mmas are sm_90a's")
    x, qweight, scales, zeros = int4_case(m, n, k, 128, False, seed=m + k)
    assert launch_for(m, n, k, 128, sms(), True, wgmma_from=3).spec.wgmma
    out = w4a16_gemm(x, qweight, scales, zeros, sms())  # the dispatch's launch
    exact = reference_gemm(x, qweight, scales, zeros, biased=True)
    torch.testing.assert_close(out.float(), exact, atol=1e-2, rtol=1e-2)
    biased = launch_for(m, n, k, 128, sms(), True)  # mma.sync only
    assert biased.spec.biased
    other = w4a16_gemm(x, qweight, scales, zeros, sms(), biased)
    torch.testing.assert_close(out.float(), other.float(), atol=1e-2, rtol=1e-2)
