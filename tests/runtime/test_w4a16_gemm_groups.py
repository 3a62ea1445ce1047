"""w4a16_gemm.cu with groups of 32 or 64 K rows (AWQ / GPTQ g32 / g64, GGUF grids kept under int4): the
build and dispatch rules on CPU, the sm_90 builds through NVRTC + ptxas offline, and the GEMM against the
reference on the GPU (marked gpu)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from kvpilot.runtime.kernels import w4a16_cuda
from kvpilot.runtime.kernels.quant_reference import dequantize_int_ref
from kvpilot.runtime.kernels.w4a16_gemm_cuda import SOURCE, unsupported
from kvpilot.runtime.kernels.w4a16_gemm_plan import GemmSpec, launch_for, preferred, stage_bytes, warm_up_ms

from tests.runtime.nvrtc_offline import ptx, sm90_resources
from tests.runtime.w4a16_cases import (
    assert_every_plan_computes,
    h200_held,
    int4_case,
    reference_gemm,
    sms,
    with_wait,
)


@pytest.mark.parametrize(("group", "per_tile"), [(32, 4), (64, 2), (128, 1), (256, 1), (4096, 1)])
def test_a_tile_stages_the_scales_and_zeros_of_each_of_its_groups(group: int, per_tile: int) -> None:
    for m in (1, 16, 64):
        spec = launch_for(m, 4096, 4096, group, 132, hopper=True, wgmma_from=3).spec
        assert spec.groups_per_tile == per_tile and spec.tiles_per_group == max(1, group // 128)
        assert spec.macros()["GROUPS_PER_TILE"] == per_tile
    # 4 bytes a column a group (a bf16 scale and zero): 512 bytes at 128 columns for group 128, 2 KB at 32
    assert stage_bytes(4, 8, 4) - stage_bytes(4, 8, 1) == 3 * 512
    spec = GemmSpec(4, 8, 1, stages=3, groups_per_tile=4)
    assert spec.shared_bytes() == 3 * (16384 + 8192 + 2048)


def test_small_groups_take_the_gemm_from_one_token_where_the_decode_gemv_cannot() -> None:
    for k in (4096, 12288):  # a long K waits for 5 tokens at group 128 (the decode GEMV is faster there)
        assert [m for m in (1, 2, 3, 4, 5) if preferred(m, k, group=128)] == ([3, 4, 5] if k == 4096 else [5])
        for group in (32, 64):
            assert [m for m in (1, 2, 384, 385) if preferred(m, k, group=group)] == [1, 2, 384]
            assert not preferred(1, k, hopper=False, group=group)  # measured on sm_90 only
            # the warm-up's M of 8 compiles the 1-8 token build the decode steps take
            assert warm_up_ms(384, k, group=group)[0] == 8
            build = {launch_for(m, 6144, k, group, 132, True).spec for m in (1, 2, 8)}
            assert len(build) == 1


def test_the_gemm_takes_groups_of_32_and_64_and_says_what_it_takes() -> None:
    from kvpilot.runtime.kernels.w4a16_gemm_plan import COLS_PER_WARP, SMALL_GROUPS, WARPS

    def gemm(group: int) -> str | None:
        return w4a16_cuda.shape_unsupported(1, 4096, 4096, group, COLS_PER_WARP * WARPS, None, SMALL_GROUPS)

    def gemv(group: int) -> str | None:
        return w4a16_cuda.shape_unsupported(1, 4096, 4096, group, w4a16_cuda.COLS, w4a16_cuda.MAX_M)

    assert [group for group in (16, 32, 48, 64, 128, 256, 4096) if gemm(group) is None] == [
        32,
        64,
        128,
        256,
        4096,
    ]
    assert "group 16 (of 128 or 32 or 64)" in (gemm(16) or "")
    assert gemv(32) is not None and gemv(64) is not None and gemv(128) is None  # the decode GEMV: whole tiles
    x = torch.zeros(1, 4096, dtype=torch.bfloat16)  # CPU tensors: refused for the device first
    scales = torch.zeros(128, 4096, dtype=torch.bfloat16)
    assert "CUDA" in (unsupported(x, torch.zeros(512, 4096, dtype=torch.int32), scales, 4) or "")


@pytest.mark.parametrize(
    ("per_tile", "nt", "biased", "wgmma"),
    [
        (4, 1, True, False),
        (2, 2, True, False),
        (4, 3, False, False),
        (2, 8, False, False),
        (4, 4, False, True),
        (4, 8, False, True),
    ],
)
def test_the_small_group_builds_compile_for_sm90_without_spills(
    per_tile: int, nt: int, biased: bool, wgmma: bool, tmp_path: Path
) -> None:
    spec = GemmSpec(
        4, nt, 1, stages=3, cluster_reduce=True, biased=biased, wgmma=wgmma, groups_per_tile=per_tile
    )
    arch = "90a" if wgmma else "90"
    code = ptx(SOURCE, spec.macros(), arch=arch)
    registers, spills, report = sm90_resources(code, tmp_path, arch=arch)
    assert spills == 0 and registers <= 168, report  # 3 CTAs of 4 warps per SM, as at group 128
    assert (b"fma.rn.bf16x2" in code) != biased  # biased builds never dequantize in bf16


def test_a_small_group_build_refuses_a_tile_per_group_above_one() -> None:
    spec = GemmSpec(4, 1, 2, biased=True, groups_per_tile=4)
    with pytest.raises(AssertionError, match="TILES_PER_GROUP 1"):
        ptx(SOURCE, spec.macros())


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 5, 8, 16, 17, 40, 64, 100, 200])
@pytest.mark.parametrize(("n", "k"), [(2048, 4096), (1024, 1152)])
@pytest.mark.parametrize("group", [32, 64])
@pytest.mark.parametrize("sym", [False, True], ids=["zero-point", "sym"])
def test_small_groups_match_the_reference(m: int, n: int, k: int, group: int, sym: bool) -> None:
    from kvpilot.runtime.kernels.w4a16_gemm_cuda import w4a16_gemm

    x, qweight, scales, zeros = int4_case(m, n, k, group, sym, seed=m * 7 + group)
    assert unsupported(x, qweight, scales, 4) is None
    assert w4a16_cuda.unsupported(x[:1], qweight, scales, 4) is not None  # the decode GEMV: group 128 only
    hopper = torch.cuda.get_device_capability() >= (9, 0)
    plan = launch_for(m, n, k, group, sms(), hopper, wgmma_from=3 if hopper else 0)
    assert plan.spec.groups_per_tile == 128 // group
    out = w4a16_gemm(x, qweight, scales, zeros, sms())
    want = reference_gemm(x, qweight, scales, zeros, plan.spec.biased)
    torch.testing.assert_close(out.float(), want, atol=1e-2, rtol=1e-2)
    assert torch.equal(w4a16_gemm(x, qweight, scales, zeros, sms()), out)  # deterministic


@pytest.mark.gpu
@pytest.mark.parametrize("m", [8, 16, 48])
def test_every_small_group_build_computes_the_same_gemm(m: int) -> None:
    case = int4_case(m, 2048, 4096, 32, False, seed=m)
    hopper = torch.cuda.get_device_capability() >= (9, 0)
    plans = [launch_for(m, 2048, 4096, 32, sms(), hopper, biased_max_token_tiles=b) for b in (0, 2)]
    if torch.cuda.get_device_capability() == (9, 0):
        wgmma = launch_for(m, 2048, 4096, 32, sms(), True, wgmma_from=1)
        plans += [wgmma, with_wait(wgmma, 2)]
    assert_every_plan_computes(reference_gemm(*case, biased=False), case, plans)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 4, 16, 64, 256])
@pytest.mark.parametrize("group", [32, 64])
def test_the_int4_dispatch_sends_small_groups_here_from_one_token(m: int, group: int) -> None:
    from kvpilot.runtime.kernels.w4a16_gemm_cuda import w4a16_gemm
    from kvpilot.runtime.kernels.w4a16_triton import int_gemm

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("dispatched on sm_90 (clusters)")
    x, qweight, scales, zeros = int4_case(m, 6144, 4096, group, False, seed=m + group)
    direct = w4a16_gemm(x, qweight, scales, zeros, sms())
    assert torch.equal(int_gemm(x, qweight, scales, zeros, 4), direct)
    triton = int_gemm(x, qweight, scales, zeros, 4, cuda_kernel=False)  # what ran here before
    torch.testing.assert_close(direct.float(), triton.float(), atol=2e-2, rtol=2e-2)


def test_eight_warps_only_where_their_registers_leave_two_ctas_an_sm() -> None:
    def warps(m: int, group: int) -> int:
        return launch_for(m, 6144, 4096, group, 132, True).spec.warps  # qkv-wide: 8 warps at group 128

    assert [warps(m, 128) for m in (1, 8, 16)] == [8, 8, 8]
    assert [warps(m, 32) for m in (1, 8, 16)] == [8, 8, 4]  # 9-16 tokens: 150 registers at 8 warps
    assert [warps(m, 64) for m in (1, 8, 16)] == [8, 8, 4]


def test_the_stage_budget_leaves_three_ctas_an_sm_with_the_wgmma_pad() -> None:
    sm_bytes, reserved = 228 * 1024, 1024  # sm_90's shared memory an SM, and what the GPU keeps per CTA
    for group in (32, 64, 128):
        for m in (1, 8, 16, 24, 32, 64):
            for wgmma in (0, 3):
                spec = launch_for(m, 4096, 4096, group, 132, True, warps=4, wgmma_from=wgmma).spec
                if spec.stages > 2:  # 2 stages is the floor, whatever they take
                    assert 3 * (spec.shared_bytes() + reserved) <= sm_bytes, (group, m, spec)
    # groups of 64 at 64 tokens: 3 stages and the pad took 77,824 bytes, two CTAs an SM; now 2 stages
    assert launch_for(64, 24576, 4096, 64, 132, True, wgmma_from=3).spec.stages == 2


@pytest.mark.parametrize(
    ("m", "n", "k", "group", "stages"),
    [
        (256, 4096, 4096, 128, 4),  # o: 128 clusters, held 132 at 4 stages (2 CTAs an SM) against 198
        (256, 4096, 12288, 128, 4),  # down, the same
        (256, 6144, 4096, 128, 3),  # qkv: 192 clusters, 4 stages would leave a second wave
        (384, 4096, 4096, 128, 3),  # o at 6 token blocks: 192 clusters
        (129, 6144, 4096, 32, 2),  # qkv, groups of 32: 144 clusters, 3 stages hold 132
        (256, 4096, 4096, 32, 3),  # o, groups of 32: 128 clusters
        (256, 24576, 4096, 128, 3),  # gate_up: one K slice, no cluster: the budget's
    ],
)
def test_several_token_blocks_take_the_stages_whose_wave_spreads_evenly(
    m: int, n: int, k: int, group: int, stages: int
) -> None:
    plan = launch_for(m, n, k, group, 132, True, held=h200_held, wgmma_from=3)
    assert plan.spec.stages == stages
    clusters = plan.grid(n)[0] * plan.grid(n)[2]
    if plan.spec.cluster_reduce:
        assert clusters <= h200_held(plan.spec, plan.slices)  # one wave
    unasked = launch_for(m, n, k, group, 132, True, wgmma_from=3)  # no occupancy known: the budget's
    assert unasked.spec.stages == (3 if group == 128 else 2)


@pytest.mark.parametrize(
    ("per_tile", "nt", "biased", "wgmma"), [(4, 1, True, False), (4, 3, False, False), (1, 8, False, True)]
)
def test_the_offsets_builds_compile_without_spills(
    per_tile: int, nt: int, biased: bool, wgmma: bool, tmp_path: Path
) -> None:
    spec = GemmSpec(4, nt, 1, 3, True, biased, wgmma, per_tile, offsets=True)
    arch = "90a" if wgmma else "90"
    code = ptx(SOURCE, spec.macros(), arch=arch)
    registers, spills, report = sm90_resources(code, tmp_path, arch=arch)
    assert spills == 0 and registers <= 168, report
    plain = ptx(SOURCE, dataclasses.replace(spec, offsets=False).macros(), arch=arch)
    assert code.count(b"cp.async.cg") == plain.count(b"cp.async.cg") + 3  # the offsets' chunk, 3 call sites
    # 2 bytes a column a group more: 256 B a group at 128 columns
    assert spec.shared_bytes() - dataclasses.replace(spec, offsets=False).shared_bytes() == 3 * 256 * per_tile


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 8, 16, 17, 64, 200])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_the_offsets_are_added_inside_the_gemm(m: int, group: int) -> None:
    from kvpilot.runtime.kernels.w4a16_gemm_cuda import takes, w4a16_gemm

    x, qweight, scales, zeros = int4_case(m, 2048, 4096, group, False, seed=m + group)
    gen = torch.Generator().manual_seed(m)
    offsets = (0.002 * torch.randn(scales.shape, generator=gen)).bfloat16().cuda()
    plan = launch_for(m, 2048, 4096, group, sms(), True, offsets=True)
    assert plan.spec.offsets and takes(x, qweight, scales, offsets) == (m >= 3 or group < 128)
    got = w4a16_gemm(x, qweight, scales, zeros, sms(), offsets=offsets).float()
    # the reference: each weight (q - z) s + o as the build's mmas take it: exact in the biased builds,
    # rounded to bf16 once in the dequantizing ones (one FMA)
    exact = dequantize_int_ref(qweight, scales.float(), zeros.float(), 4)
    exact += offsets.float().repeat_interleave(exact.shape[0] // offsets.shape[0], 0)
    want = x.float() @ (exact if plan.spec.biased else exact.bfloat16().float())
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    plain = w4a16_gemm(x, qweight, scales, zeros, sms()).float()
    assert (got - plain).abs().max() > 0.05  # the offsets moved it
    with pytest.raises(ValueError, match="offsets"):
        w4a16_gemm(x, qweight, scales, zeros, sms(), plan)  # a build with offsets, a call without


@pytest.mark.gpu
@pytest.mark.parametrize("with_offsets", [False, True], ids=["whole-zeros", "offsets"])
def test_the_warm_up_compiles_every_build_the_dispatch_then_takes(with_offsets: bool) -> None:
    """As quant/methods.IntWeightMethod warms up and then dispatches, at every M up to 384 tokens."""
    from kvpilot.runtime.kernels.nvrtc import compile_cuda
    from kvpilot.runtime.kernels.split_k_triton import split_counters
    from kvpilot.runtime.kernels.w4a16_mma_triton import int_gemm_mma, mma_dispatched, warm_up_mma
    from kvpilot.runtime.kernels.w4a16_triton import int_gemm, warm_up_int_gemm

    n, k = 3072, 1024
    x, qweight, scales, zeros = int4_case(384, n, k, 32, False, seed=5)
    offsets = (0.002 * torch.randn(scales.shape)).bfloat16().cuda() if with_offsets else None
    counters = split_counters(n, x.device)
    warm_up_int_gemm(qweight, scales, zeros, 4, torch.bfloat16, counters, offsets)
    warm_up_mma(qweight, scales, zeros, 4, torch.bfloat16, counters, offsets)
    builds = compile_cuda.cache_info().misses
    for m in range(1, 385):
        gemm = int_gemm_mma if mma_dispatched(m, k, 32, 4) else int_gemm
        gemm(x[:m], qweight, scales, zeros, 4, None, counters, offsets=offsets)
    assert compile_cuda.cache_info().misses == builds, "NVRTC builds after the warm-up"
