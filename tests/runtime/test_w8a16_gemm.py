"""w4a16_gemm.cu's int8 builds (BITS 8: load-time int8, GPTQ / compressed-tensors 8-bit, GGUF Q8_0 / Q5 grids
kept under int8): the build and dispatch rules on CPU, the sm_90 builds through NVRTC + ptxas offline, and
the GEMM against the reference on the GPU (marked gpu)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from kvpilot.runtime.kernels.quant_reference import dequantize_int_ref
from kvpilot.runtime.kernels.w4a16_gemm_cuda import SOURCE, unsupported
from kvpilot.runtime.kernels.w4a16_gemm_plan import (
    TILE,
    GemmSpec,
    launch_for,
    preferred,
    stage_bytes,
    warm_up_ms,
)

from tests.runtime.nvrtc_offline import ptx, sm90_resources
from tests.runtime.test_w4a16_cuda import (
    assert_tokens_agree,
    greedy_and_logprobs,
    spy_on,
    tiny_int4_checkpoint,
)
from tests.runtime.w4a16_cases import assert_every_plan_computes, int4_case, reference_gemm, sms, with_wait


def test_int8_builds_stage_twice_the_words_and_never_bias() -> None:
    for m in (1, 8, 16, 24, 64, 256):
        plan = launch_for(m, 6144, 4096, 4096, 132, True, wgmma_from=3, bits=8)
        assert plan.spec.bits == 8 and not plan.spec.biased and plan.spec.macros()["BITS"] == 8
        int4 = launch_for(m, 6144, 4096, 128, 132, True, wgmma_from=3)
        assert plan.spec.wgmma == (m > 16)  # warpgroup mmas from 17 tokens
        assert int4.spec.wgmma == (m > 8)  # int4 also at 9-16 tokens (sixteen_token_wgmma: 8 warps)
    words = stage_bytes(4, 1, bits=8) - stage_bytes(4, 1, bits=4)
    assert words == 128 * 64  # 128 columns x 128 K rows x 4 bits more
    assert launch_for(1, 6144, 4096, 4096, 132, True, bits=8).spec.stages == 3  # 21 KB a stage in 75 KB


def test_int8_splits_a_long_k_within_a_portable_cluster() -> None:
    def slices(m: int, bits: int, group: int = 128) -> int:
        return launch_for(m, 4096, 12288, group, 132, True, wgmma_from=3, bits=bits).slices

    assert [slices(m, 4) for m in (40, 64)] == [16, 16]  # int4: slices of 6 tiles
    # int8 at 3 CTAs an SM: 32 column blocks x 16 slices = 512 CTAs would not fit 396 slots in one wave
    assert [slices(m, 8, group) for m in (40, 64) for group in (32, 128, 12288)] == [8] * 6


def test_int8_takes_the_gemm_from_one_token() -> None:
    assert [preferred(m, 4096, True, 4096, bits=8) for m in (1, 2, 256, 257)] == [True, True, True, False]
    assert not preferred(1, 4096, True, 128, bits=4)  # int4 at group 128: the decode GEMV
    assert not preferred(1, 4096, False, 4096, bits=8)  # only measured on sm_90
    assert warm_up_ms(64, 4096, True, 4096, bits=8) == [8, 16, 24, 32, 40, 48, 56, 64]


def test_the_int8_builds_compile_for_sm90_without_spills(tmp_path: Path) -> None:
    for spec, arch in [
        (GemmSpec(4, 1, 32, 3, True, bits=8), "90"),
        (GemmSpec(4, 2, 1, 3, True, groups_per_tile=4, offsets=True, bits=8), "90"),
        (GemmSpec(4, 8, 1, 2, True, wgmma=True, groups_per_tile=4, offsets=True, bits=8), "90a"),
    ]:
        code = ptx(SOURCE, spec.macros(), arch=arch)
        registers, spills, report = sm90_resources(code, tmp_path, arch=arch)
        assert spills == 0 and registers <= 200, report  # 2 CTAs of 4 warps an SM at least
        # each byte becomes fp32 2^23 + u (a prmt against 0x4B000000 = 1258291200) less 2^23 + z: two exact
        # subtractions, then one bf16x2 FMA a pair (scale and offset)
        assert b"1258291200" in code
        assert code.count(b"sub.f32") == 2 * code.count(b"fma.rn.bf16x2") > 0


def test_the_bytes_become_exact_bf16_through_fp32_two_to_the_23() -> None:
    """The arithmetic w8a16_dequant.cuh relies on, emulated bit for bit on the CPU: byte u in the low mantissa
    byte of fp32 2^23 (0x4B0000uu), minus 2^23 + z in fp32, truncated to its upper 16 bits, is bf16(u - z)
    for every byte and whole zero point."""
    u = torch.arange(256, dtype=torch.int32).view(-1, 1)
    z = torch.arange(256, dtype=torch.float32).view(1, -1)
    magic = (u | 0x4B000000).view(torch.float32)  # [256, 1]: 2^23 + u
    diff = magic - (8388608.0 + z)  # [256, 256], one fp32 subtraction
    upper = (diff.view(torch.int32) >> 16).to(torch.int16).view(torch.bfloat16)
    want = (u.float() - z).bfloat16()
    assert torch.equal(upper.view(torch.int16), want.view(torch.int16))
    assert torch.equal(want.float(), u.float() - z)  # and bf16 holds u - z exactly


def test_int8_waits_where_a_cta_takes_64_tokens_to_fit_three_an_sm() -> None:
    def wait_steps(m: int, group: int, bits: int = 8) -> int:
        spec = launch_for(m, 6144, 4096, group, 132, True, wgmma_from=3, bits=bits).spec
        assert spec.macros()["WGMMA_WAIT_STEPS"] == spec.wait_steps
        return spec.wait_steps

    assert [wait_steps(m, 32) for m in (16, 32, 33, 64, 128, 256)] == [0, 0, 2, 2, 2, 2]  # a group: 2 k-steps
    assert [wait_steps(64, group) for group in (64, 128, 4096)] == [4, 4, 0]  # clustered per channel fits
    gate_up = [launch_for(128, 24576, 4096, g, 132, True, wgmma_from=3, bits=8).spec for g in (64, 128, 4096)]
    assert [(spec.cluster_reduce, spec.wait_steps) for spec in gate_up] == [
        (False, 4),
        (False, 2),
        (False, 2),
    ]
    assert wait_steps(64, 32, bits=4) == 0  # int4 lost with it
    held = launch_for(48, 4096, 4096, 32, 132, True, held=lambda spec, s: 64, wgmma_from=3, bits=8)
    assert held.spec.wait_steps == 2 and held.spec.stages == 3  # deep_split's extra stage keeps it


@pytest.mark.parametrize("group", [32, 64, 128, 4096])
@pytest.mark.parametrize("n", [6144, 24576])  # qkv: K slices in a cluster; gate_up: one K slice
def test_every_int8_build_at_64_tokens_a_cta_fits_three_an_sm(tmp_path: Path, group: int, n: int) -> None:
    spec = launch_for(128, n, 4096, group, 132, True, wgmma_from=3, bits=8).spec
    assert spec.token_tiles == 8 and spec.cluster_reduce == (n == 6144)
    code = ptx(SOURCE, spec.macros(), arch="90a")
    registers, spills, report = sm90_resources(code, tmp_path, arch="90a")
    assert spills == 0 and registers <= 168, report  # 168: 3 CTAs of 4 warps an SM
    waits = TILE // 16 // spec.wait_steps + 1 if spec.wait_steps else 1  # after every wait_steps, the tile's
    assert code.count(b"wgmma.wait_group") == waits
    if spec.wait_steps:  # and the wait is what fits it: without, 2 CTAs an SM
        plain = ptx(SOURCE, dataclasses.replace(spec, wait_steps=0).macros(), arch="90a")
        assert sm90_resources(plain, tmp_path, arch="90a")[0] > 168


def test_a_wait_other_than_2_or_4_k_steps_does_not_build() -> None:
    spec = GemmSpec(4, 8, 32, 2, True, wgmma=True, bits=8)  # int8 per channel, 64 tokens
    with pytest.raises(AssertionError, match="WGMMA_WAIT_STEPS 0"):
        ptx(SOURCE, dataclasses.replace(spec, wait_steps=3).macros(), arch="90a")


def test_an_int8_build_refuses_the_biased_mmas() -> None:
    with pytest.raises(AssertionError, match="BITS 4, or 8 in dequantizing builds"):
        ptx(SOURCE, GemmSpec(4, 1, 32, biased=True, bits=8).macros())


def test_unsupported_names_int4_and_int8() -> None:
    x = torch.zeros(1, 4096, dtype=torch.bfloat16)
    scales = torch.zeros(1, 4096, dtype=torch.bfloat16)
    assert "CUDA" in (unsupported(x, torch.zeros(1024, 4096, dtype=torch.int32), scales, 8) or "")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 5, 8, 16, 17, 40, 64, 100, 200])
@pytest.mark.parametrize(("n", "k"), [(2048, 4096), (1024, 1152)])
@pytest.mark.parametrize("group", [-1, 32, 128])
@pytest.mark.parametrize("sym", [False, True], ids=["zero-point", "sym"])
def test_int8_matches_the_reference(m: int, n: int, k: int, group: int, sym: bool) -> None:
    from kvpilot.runtime.kernels.w4a16_gemm_cuda import w4a16_gemm

    x, qweight, scales, zeros = int4_case(m, n, k, group, sym, seed=m * 7 + n + group, bits=8)
    assert qweight.shape[0] == k // 4 and unsupported(x, qweight, scales, 8) is None
    out = w4a16_gemm(x, qweight, scales, zeros, sms())
    want = reference_gemm(x, qweight, scales, zeros)  # the bf16 dequantized weight, as the mmas take it
    torch.testing.assert_close(out.float(), want, atol=1e-2, rtol=1e-2)
    assert torch.equal(w4a16_gemm(x, qweight, scales, zeros, sms()), out)  # deterministic


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 16, 48, 64])
@pytest.mark.parametrize("group", [32, 4096], ids=["g32", "per-channel"])
def test_every_int8_build_computes_the_same_gemm(m: int, group: int) -> None:
    case = int4_case(m, 2048, 4096, group, False, seed=m, bits=8)
    hopper = torch.cuda.get_device_capability() >= (9, 0)
    plans = [launch_for(m, 2048, 4096, group, sms(), hopper, warps=w, bits=8) for w in (4, 8)]
    plans += [launch_for(m, 2048, 4096, group, sms(), hopper, stages=s, bits=8) for s in (2, 4)]
    if torch.cuda.get_device_capability() == (9, 0):
        wgmma = launch_for(m, 2048, 4096, group, sms(), True, wgmma_from=1, bits=8)
        plans += [wgmma, with_wait(wgmma, 2), with_wait(wgmma, 4)]
    assert_every_plan_computes(reference_gemm(*case), case, plans)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 64])
def test_int8_offsets_are_added_inside_the_gemm(m: int) -> None:
    from kvpilot.runtime.kernels.w4a16_gemm_cuda import w4a16_gemm

    x, qweight, scales, zeros = int4_case(m, 2048, 4096, 32, False, seed=m, bits=8)
    gen = torch.Generator().manual_seed(m)
    offsets = (0.002 * torch.randn(scales.shape, generator=gen)).bfloat16().cuda()
    got = w4a16_gemm(x, qweight, scales, zeros, sms(), offsets=offsets).float()
    exact = dequantize_int_ref(qweight, scales.float(), zeros.float(), 8)
    exact += offsets.float().repeat_interleave(32, 0)
    torch.testing.assert_close(got, x.float() @ exact.bfloat16().float(), atol=2e-2, rtol=2e-2)
    assert (got - w4a16_gemm(x, qweight, scales, zeros, sms()).float()).abs().max() > 0.05


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 2, 16, 17, 64, 256])
@pytest.mark.parametrize("group", [-1, 32])
def test_the_int8_dispatch_sends_its_weights_here_from_one_token(m: int, group: int) -> None:
    from kvpilot.runtime.kernels.w4a16_gemm_cuda import w4a16_gemm
    from kvpilot.runtime.kernels.w4a16_mma_triton import int_gemm_mma, mma_dispatched
    from kvpilot.runtime.kernels.w4a16_triton import int_gemm

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("dispatched on sm_90 (clusters)")
    x, qweight, scales, zeros = int4_case(m, 6144, 4096, group, True, seed=m + group, bits=8)
    direct = w4a16_gemm(x, qweight, scales, zeros, sms())
    gemm = int_gemm_mma if mma_dispatched(m, 4096, 4096 // scales.shape[0], 8) else int_gemm
    assert torch.equal(gemm(x, qweight, scales, zeros, 8), direct)
    triton = gemm(x, qweight, scales, zeros, 8, cuda_kernel=False)  # what ran here before
    # outputs of ~3: a bf16 step there is 0.016, and the Triton GEMVs round the weight differently
    torch.testing.assert_close(direct.float(), triton.float(), atol=6e-2, rtol=2e-2)


@pytest.mark.gpu
def test_the_int8_warm_up_compiles_every_build_the_dispatch_then_takes() -> None:
    from kvpilot.runtime.kernels.nvrtc import compile_cuda
    from kvpilot.runtime.kernels.split_k_triton import split_counters
    from kvpilot.runtime.kernels.w4a16_mma_triton import int_gemm_mma, mma_dispatched, warm_up_mma
    from kvpilot.runtime.kernels.w4a16_triton import int_gemm, warm_up_int_gemm

    n, k = 3072, 1024
    x, qweight, scales, zeros = int4_case(384, n, k, -1, True, seed=5, bits=8)
    counters = split_counters(n, x.device)
    warm_up_int_gemm(qweight, scales, zeros, 8, torch.bfloat16, counters)
    warm_up_mma(qweight, scales, zeros, 8, torch.bfloat16, counters)
    builds = compile_cuda.cache_info().misses
    for m in range(1, 385):
        gemm = int_gemm_mma if mma_dispatched(m, k, k, 8) else int_gemm
        gemm(x[:m], qweight, scales, zeros, 8, None, counters)
    assert compile_cuda.cache_info().misses == builds, "NVRTC builds after the warm-up"


@pytest.mark.gpu
def test_a_bf16_int8_engine_decodes_here_with_the_tokens_of_the_triton_kernels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every projection of this checkpoint has K a multiple of 128 and N of 128: its prefill (<= 16 tokens)
    # and decode steps run here; with int8 kept off this kernel (BITS) the Triton int8 kernels run. Both
    # round each weight to bf16 the same way and differ in summation order only.
    from kvpilot.runtime.kernels import w4a16_gemm_cuda

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("dispatched on sm_90 (clusters)")
    path = tiny_int4_checkpoint(tmp_path)
    launches = spy_on(monkeypatch, w4a16_gemm_cuda, "w4a16_gemm")
    cuda = greedy_and_logprobs(path, "int8")
    assert launches and min(launches) == 1
    monkeypatch.setattr(w4a16_gemm_cuda, "BITS", (4,))
    launches.clear()
    triton = greedy_and_logprobs(path, "int8")
    assert not launches
    assert_tokens_agree(cuda, triton)
