"""w4a16_gemm.cu (the int4 GEMM for 3+ tokens): its launch rule and its sm_90 build on CPU (NVRTC + ptxas,
offline); against the reference on the GPU (marked gpu)."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import pytest
import torch
from kvpilot.runtime.kernels.quant_reference import dequantize_int_ref
from kvpilot.runtime.kernels.w4a16_gemm_cuda import SOURCE, unsupported
from kvpilot.runtime.kernels.w4a16_gemm_plan import GemmSpec, launch_for

from tests.runtime.nvrtc_offline import ptx, sm90_resources
from tests.runtime.w4a16_cases import h200_held, int4_case, reference_gemm, sms


@pytest.mark.parametrize(
    ("m", "tiles", "blocks"),
    [(17, 3, 1), (24, 3, 1), (64, 8, 1), (65, 5, 2), (100, 7, 2), (128, 8, 2), (129, 6, 3), (256, 8, 4)],
)
def test_token_tiles_cover_m_in_balanced_blocks_of_at_most_64(m: int, tiles: int, blocks: int) -> None:
    plan = launch_for(m, 4096, 4096, 128, 132, hopper=True)
    assert (plan.spec.token_tiles, plan.token_blocks) == (tiles, blocks)
    assert plan.spec.block_m * plan.token_blocks >= m


def test_k_slices_fill_the_gpu_within_a_cluster_on_hopper_only() -> None:
    qkv = launch_for(64, 6144, 4096, 128, 132, hopper=True)  # 48 column blocks: 290 / 48 -> 6 slices
    assert (qkv.slices, qkv.spec.cluster_reduce, qkv.grid(6144)) == (6, True, (48, 6, 1))
    o = launch_for(64, 4096, 4096, 128, 132, hopper=True)  # 32 blocks: 9 slices wanted, a cluster holds 8
    assert o.slices == 8
    assert (o.sliced(1).spec.cluster_reduce, o.sliced(4).spec.cluster_reduce, o.sliced(4).grid(4096)) == (
        False, True, (32, 4, 1),
    )  # fmt: skip
    gate_up = launch_for(64, 24576, 4096, 128, 132, hopper=True)  # 192 blocks: 2 slices
    assert (gate_up.slices, gate_up.spec.cluster_reduce) == (2, True)
    wide = launch_for(64, 65536, 4096, 128, 132, hopper=True)  # 512 blocks: one slice, no cluster
    assert (wide.slices, wide.spec.cluster_reduce) == (1, False)
    short = launch_for(64, 128, 512, 128, 132, hopper=True)  # 4 tiles: at most 2 slices of 2
    assert short.slices == 2
    assert launch_for(64, 6144, 4096, 128, 132, hopper=False).slices == 1
    # a long K (down, 96 tiles) at 33-64 tokens: slices of 6 tiles, a non-portable cluster of 16
    assert [launch_for(m, 4096, 12288, 128, 132, True).slices for m in (32, 40, 64, 65)] == [8, 16, 16, 5]
    assert launch_for(64, 4096, 65536, 128, 132, True).slices == 16  # never past sm_90's largest cluster
    assert launch_for(64, 6144, 4096, 4096, 132, hopper=True).spec.tiles_per_group == 32


def test_25_to_64_tokens_take_a_stage_more_and_the_most_slices_held_in_one_wave() -> None:
    def plan(m: int, n: int, k: int = 4096) -> tuple[int, int]:
        launch = launch_for(m, n, k, 128, 132, True, held=h200_held)
        return launch.slices, launch.spec.stages

    assert [plan(m, 6144) for m in (32, 64)] == [(4, 5), (4, 4)]  # qkv: 48 clusters; 5 slices held 47
    assert [plan(m, 4096) for m in (25, 33, 64)] == [(7, 5), (7, 4), (7, 4)]  # o: 32 clusters, 7 held 32
    assert plan(64, 24576) == (2, 3)  # gate_up: 192 clusters, none of 4+ slices in one wave: the rule's
    assert plan(64, 4096, 12288) == (16, 3)  # down, a long K: its own slices
    assert plan(24, 6144) == (6, 4)  # 3 token tiles: the budget's stages and the rule's slices
    assert plan(80, 6144) == (launch_for(80, 6144, 4096, 128, 132, True).slices, 3)  # two token blocks
    assert launch_for(64, 6144, 4096, 128, 132, True).slices == 6  # not asked (held None): the 3-stage rule
    assert launch_for(64, 6144, 4096, 128, 132, True, stages=3, held=h200_held).spec.stages == 3  # explicit


def test_shared_memory_holds_the_stages_or_the_split_sums() -> None:
    spec = GemmSpec(4, 8, 1, stages=3)  # x 16 KB + weight 8 KB + scales and zeros 512 B per stage
    assert spec.shared_bytes() == 3 * (16384 + 8192 + 512)
    for warps in (4, 8):
        for nt in range(1, 9):
            for stages in (2, 3, 4):
                spec = GemmSpec(warps, nt, 1, stages)
                assert spec.shared_bytes() >= spec.block_m * (spec.block_n + 4) * 4  # the split sums fit


def test_preferred_from_3_or_5_to_384_tokens() -> None:
    from kvpilot.runtime.kernels.w4a16_gemm_plan import preferred, warm_up_ms

    ms = (1, 2, 3, 4, 5, 8, 16, 17, 64, 128, 129, 384, 385, 1024)
    assert [m for m in ms if preferred(m, 4096)] == [3, 4, 5, 8, 16, 17, 64, 128, 129, 384]
    assert [m for m in ms if preferred(m, 12288)] == [5, 8, 16, 17, 64, 128, 129, 384]  # a long K: GEMV to 4
    assert not preferred(64, 4096, hopper=False)  # measured on sm_90 only (clusters)
    # the warm-up compiles every build the dispatch can take up to 384 tokens, for every width of Qwen3-8B
    for n, (k, first), held, wgmma in itertools.product(
        (4096, 6144, 24576), ((4096, 3), (12288, 5)), (None, h200_held), (0, 3)
    ):  # held: the GPU's cluster occupancy (the deep builds at 33-64); wgmma: sm_90's builds from 17 tokens

        def build(m: int) -> GemmSpec:
            return launch_for(m, n, k, 128, 132, True, held=held, wgmma_from=wgmma).spec  # noqa: B023

        assert {build(m) for m in warm_up_ms(384, k)} == {build(m) for m in range(first, 385)}
    assert warm_up_ms(384, 4096, hopper=False) == []


def test_unsupported_names_the_reason() -> None:
    x = torch.zeros(32, 4096, dtype=torch.bfloat16)
    qweight = torch.zeros(512, 4096, dtype=torch.int32)
    assert "CUDA" in (unsupported(x, qweight, torch.zeros(32, 4096, dtype=torch.bfloat16), 4) or "")


@pytest.mark.parametrize(
    ("nt", "cluster", "biased"),
    [(8, False, False), (8, True, False), (3, True, False), (1, False, True), (2, True, True)],
)
def test_compiles_for_sm90_without_spills(nt: int, cluster: bool, biased: bool, tmp_path: Path) -> None:
    spec = GemmSpec(4, nt, 1, cluster_reduce=cluster, biased=biased)
    code = ptx(SOURCE, spec.macros())
    registers, spills, report = sm90_resources(code, tmp_path)
    assert spills == 0 and registers <= 168, report  # 3 CTAs of 4 warps per SM
    for op in (b"ldmatrix.sync.aligned.m8n8.x4", b"cp.async.cg.shared.global"):
        assert op in code
    assert (b"fma.rn.bf16x2" in code) != biased  # biased builds never dequantize in bf16
    assert (b"ld.shared::cluster.v4.f32" in code) == cluster


def test_from_17_tokens_sm90_ctas_take_32_or_64_tokens_on_warpgroup_mmas() -> None:
    def build(m: int, **kw: int) -> tuple[int, bool]:
        spec = launch_for(m, 4096, 4096, 128, 132, True, wgmma_from=3, **kw).spec
        return spec.token_tiles, spec.wgmma

    tiles = [(2, False), (4, True), (4, True), (4, True), *[(8, True)] * 5]
    assert [build(m) for m in (16, 17, 24, 32, 33, 40, 64, 65, 128)] == tiles
    assert build(40, warps=8) == (8, True) and build(40, max_token_tiles=4) == (3, False)
    assert build(200, max_token_tiles=16) == (16, True)  # 128 tokens a CTA where asked (the sweep's tt=16)
    with pytest.raises(ValueError, match="builds take at most 8"):
        launch_for(200, 4096, 4096, 128, 132, True, max_token_tiles=16)  # no wgmma: no 128-token CTAs
    plain = launch_for(40, 4096, 4096, 128, 132, True).spec  # not sm_90: mma.sync, 40 tokens in 5 tiles
    assert (plain.token_tiles, plain.wgmma) == (5, False)
    padded = launch_for(64, 4096, 4096, 128, 132, True, wgmma_from=3).spec
    assert launch_for(9, 4096, 4096, 128, 132, True, wgmma_from=2).spec.token_tiles == 2  # 16, not biased
    assert not launch_for(9, 4096, 4096, 128, 132, True, wgmma_from=2).spec.biased
    assert padded.shared_bytes() == dataclasses.replace(padded, wgmma=False).shared_bytes() + 1024


@pytest.mark.parametrize(
    ("nt", "warps", "most"), [(2, 4, 168), (2, 8, 168), (4, 4, 168), (8, 4, 168), (16, 4, 240)]
)
def test_the_wgmma_build_compiles_for_sm90a_without_spills(
    nt: int, warps: int, most: int, tmp_path: Path
) -> None:
    spec = GemmSpec(warps, nt, 1, stages=4, cluster_reduce=True, wgmma=True)
    code = ptx(SOURCE, spec.macros(), arch="90a")
    registers, spills, report = sm90_resources(code, tmp_path, arch="90a")
    # up to 64 tokens 3 CTAs of 4 warps per SM where the stages fit; 128 tokens: 128 fp32 sums a thread
    assert spills == 0 and registers <= most, report
    assert f"wgmma.mma_async.sync.aligned.m64n{8 * nt}k16.f32.bf16.bf16".encode() in code
    assert b"mma.sync" not in code and b"ldmatrix" not in code  # x goes to the tensor cores from the stage


def test_the_mmas_take_128_plus_q_up_to_16_tokens_a_cta() -> None:
    assert all(launch_for(m, 4096, 4096, 128, 132, True).spec.biased for m in (1, 8, 9, 16))
    assert not any(launch_for(m, 4096, 4096, 128, 132, True).spec.biased for m in (17, 64, 65, 128))
    assert not launch_for(16, 4096, 4096, 128, 132, True, biased_max_token_tiles=0).spec.biased


def test_eight_warps_for_mid_width_outputs_at_the_biased_token_counts() -> None:
    def warps(m: int, n: int, hopper: bool = True) -> int:
        return launch_for(m, n, 4096, 128, 132, hopper).spec.warps

    assert [warps(m, 6144) for m in (5, 16, 17, 64)] == [8, 8, 4, 4]  # qkv-wide: 48 blocks of 128 columns
    assert [warps(16, n) for n in (4096, 24576)] == [4, 4]  # o, down (32 blocks) and gate_up (192)
    assert warps(16, 6144, hopper=False) == 4
    assert warps(8, 41 * 128) == 4  # 8 warps would leave N's last 128 columns to no CTA
    assert launch_for(16, 6144, 4096, 128, 132, True, warps=4).spec.warps == 4  # explicit warps stay


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 8, 12, 17, 24, 32, 40, 64, 65, 100, 128, 200])
@pytest.mark.parametrize(("n", "k", "group"), [(4096, 4096, 128), (1024, 1152, 128), (256, 2048, -1)])
@pytest.mark.parametrize("sym", [False, True], ids=["zero-point", "sym"])
def test_matches_the_reference(m: int, n: int, k: int, group: int, sym: bool) -> None:
    from kvpilot.runtime.kernels.w4a16_gemm_cuda import w4a16_gemm

    x, qweight, scales, zeros = int4_case(m, n, k, group, sym, seed=m * 5 + n)
    assert unsupported(x, qweight, scales, 4) is None
    spec = launch_for(m, n, k, k if group == -1 else group, sms(), True).spec
    want = reference_gemm(x, qweight, scales, zeros, spec.biased or spec.scale_after)  # exact products
    out = w4a16_gemm(x, qweight, scales, zeros, sms())
    torch.testing.assert_close(out.float(), want, atol=1e-2, rtol=1e-2)
    assert torch.equal(w4a16_gemm(x, qweight, scales, zeros, sms()), out)  # deterministic


@pytest.mark.gpu
@pytest.mark.parametrize("m", [8, 16])
@pytest.mark.parametrize("sym", [False, True], ids=["zero-point", "sym"])
def test_biased_and_dequantizing_builds_compute_the_same_gemm(m: int, sym: bool) -> None:
    from kvpilot.runtime.kernels.w4a16_gemm_cuda import w4a16_gemm

    x, qweight, scales, zeros = int4_case(m, 6144, 4096, 128, sym, seed=m)  # qkv-wide: biased at 8 warps
    plans = [launch_for(m, 6144, 4096, 128, sms(), True, biased_max_token_tiles=b) for b in (0, 2)]
    assert [(plan.spec.biased, plan.spec.warps) for plan in plans] == [(False, 4), (True, 8)]
    dequantizing, biased = (w4a16_gemm(x, qweight, scales, zeros, sms(), plan).float() for plan in plans)
    exact = reference_gemm(x, qweight, scales, zeros, biased=True)
    torch.testing.assert_close(dequantizing, reference_gemm(x, qweight, scales, zeros), atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(biased, exact, atol=1e-2, rtol=1e-2)
    # the bf16 rounding of each weight is the dequantizing build's only extra error (H200: 0.0052 vs 0.0036)
    assert (biased - exact).abs().mean() < (dequantizing - exact).abs().mean()


@pytest.mark.gpu
@pytest.mark.parametrize("slices", [1, 2, 5, 8, 12, 16])  # past 8: a non-portable cluster
@pytest.mark.parametrize(("warps", "stages"), [(4, 2), (4, 4), (8, 3)])
@pytest.mark.parametrize("m", [5, 16, 48])  # 5, 16: biased builds
def test_every_build_and_slicing_computes_the_same_gemm(m: int, slices: int, warps: int, stages: int) -> None:
    from kvpilot.runtime.kernels.w4a16_gemm_cuda import w4a16_gemm

    x, qweight, scales, zeros = int4_case(m, 2048, 4096, 128, False, seed=slices)
    plan = launch_for(m, 2048, 4096, 128, sms(), True, warps, stages)
    plan = plan.sliced(slices)
    out = w4a16_gemm(x, qweight, scales, zeros, sms(), plan)
    want = reference_gemm(x, qweight, scales, zeros, biased=plan.spec.biased)
    torch.testing.assert_close(out.float(), want, atol=1e-2, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("m", "slices", "stages"),
    [
        (9, 8, 6),
        (16, 2, 6),
        (17, 4, 5),
        (32, 1, 3),
        (33, 1, 3),
        (48, 4, 4),
        (64, 7, 4),
        (64, 16, 3),
        (100, 2, 3),
    ],
)
def test_the_wgmma_build_computes_the_mma_sync_builds_gemm(m: int, slices: int, stages: int) -> None:
    from kvpilot.runtime.kernels.w4a16_gemm_cuda import w4a16_gemm

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("warpgroup mmas are sm_90a's")
    x, qweight, scales, zeros = int4_case(m, 2048, 4096, 128, False, seed=m + slices)
    # the dequantizing builds (16-token CTAs with scale_after take exact products, which differ from the bf16
    # dequantized weight by more than this tolerance: test_w4a16_gemm_scale_after.py checks them)
    plan = launch_for(m, 2048, 4096, 128, sms(), True, stages=stages, wgmma_from=2, scale_after=False)
    plan = plan.sliced(slices)
    assert plan.spec.wgmma and plan.spec.token_tiles == (2 if m <= 16 else 4 if m <= 32 else 8)
    sync = dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, wgmma=False))
    out = w4a16_gemm(x, qweight, scales, zeros, sms(), plan)
    want = reference_gemm(x, qweight, scales, zeros)
    torch.testing.assert_close(out.float(), want, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(out, w4a16_gemm(x, qweight, scales, zeros, sms(), sync), atol=1e-2, rtol=1e-2)
    assert torch.equal(w4a16_gemm(x, qweight, scales, zeros, sms(), plan), out)  # deterministic


@pytest.mark.gpu
def test_a_graph_replay_reads_its_predecessors_output_under_pdl() -> None:
    from kvpilot.runtime.kernels.w4a16_gemm_cuda import w4a16_gemm

    x, qweight, scales, zeros = int4_case(64, 4096, 4096, 128, False, seed=3)
    x2 = torch.empty_like(x)
    graph = torch.cuda.CUDAGraph()
    w4a16_gemm(x, qweight, scales, zeros, sms())  # compiled outside the capture
    with torch.cuda.graph(graph):
        x2.copy_(x * 2)  # the predecessor writes x2 right before the GEMM reads it
        out = w4a16_gemm(x2, qweight, scales, zeros, sms())
    for scale in (1.0, -3.0):
        x.mul_(scale)
        graph.replay()
        want = reference_gemm(x * 2, qweight, scales, zeros)
        torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=1e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [3, 5, 8, 12, 40, 100, 129, 256, 384])
def test_the_int4_dispatch_takes_it_from_3_to_384_tokens(m: int) -> None:
    from kvpilot.runtime.kernels.w4a16_gemm_cuda import w4a16_gemm
    from kvpilot.runtime.kernels.w4a16_mma_triton import int_gemm_mma, mma_dispatched
    from kvpilot.runtime.kernels.w4a16_triton import int_gemm

    x, qweight, scales, zeros = int4_case(m, 2048, 4096, 128, False, seed=m)
    direct = w4a16_gemm(x, qweight, scales, zeros, sms())
    # as quant/methods.IntWeightMethod dispatches: the Triton GEMM's buckets at 17-128 tokens, else int_gemm
    mma = m > 16 and mma_dispatched(m, 4096, 128, 4)
    dispatched = int_gemm_mma(x, qweight, scales, zeros, 4) if mma else int_gemm(x, qweight, scales, zeros, 4)
    assert torch.equal(dispatched, direct)
    if m > 128:  # what ran there before: dequantize + cuBLAS, within bf16 rounding
        dense = x @ dequantize_int_ref(qweight, scales, zeros, 4).to(x.dtype)
        torch.testing.assert_close(direct.float(), dense.float(), atol=2e-2, rtol=2e-2)
    triton = int_gemm_mma(x, qweight, scales, zeros, 4, cuda_kernel=False) if mma else None
    if triton is not None:  # the Triton GEMM it replaces at 17-128 tokens agrees within bf16 rounding
        torch.testing.assert_close(direct.float(), triton.float(), atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "slices", "stages"), [(100, 1, 2), (129, 3, 2), (256, 5, 3), (300, 1, 4)])
def test_128_token_ctas_compute_the_64_token_ctas_gemm(m: int, slices: int, stages: int) -> None:
    from kvpilot.runtime.kernels.w4a16_gemm_cuda import w4a16_gemm
    from kvpilot.runtime.kernels.w4a16_gemm_plan import WGMMA_MAX_TOKEN_TILES

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("warpgroup mmas are sm_90a's")
    x, qweight, scales, zeros = int4_case(m, 2048, 4096, 128, False, seed=m + slices)
    wide = launch_for(m, 2048, 4096, 128, sms(), True, stages=stages, wgmma_from=3, max_token_tiles=16)
    wide = wide.sliced(slices)
    assert wide.spec.token_tiles == WGMMA_MAX_TOKEN_TILES and wide.token_blocks == -(-m // 128)
    out = w4a16_gemm(x, qweight, scales, zeros, sms(), wide)
    torch.testing.assert_close(out.float(), reference_gemm(x, qweight, scales, zeros), atol=1e-2, rtol=1e-2)
    narrow = w4a16_gemm(x, qweight, scales, zeros, sms())  # the dispatch's 64-token CTAs
    torch.testing.assert_close(out, narrow, atol=1e-2, rtol=1e-2)
    assert torch.equal(w4a16_gemm(x, qweight, scales, zeros, sms(), wide), out)  # deterministic


@pytest.mark.gpu
@pytest.mark.parametrize(("slices", "stages"), [(4, 4), (6, 3), (16, 3)])
def test_the_gpu_says_how_many_clusters_it_holds(slices: int, stages: int) -> None:
    # bounded by the CTA slots: at most 3 CTAs of 4 warps per SM within the stage budget, 2 at 4 stages
    from kvpilot.runtime.kernels.nvrtc import allow_cluster, allow_shared_memory, max_active_clusters
    from kvpilot.runtime.kernels.w4a16_gemm_cuda import compiled

    sm_count = sms()
    spec = launch_for(64, 6144, 4096, 128, sm_count, True, stages=stages).spec
    spec = dataclasses.replace(spec, cluster_reduce=True)
    kernel = compiled(spec)
    allow_shared_memory(kernel, spec.shared_bytes())
    allow_cluster(kernel, slices)
    held = max_active_clusters(kernel, (spec.warps * 32, 1, 1), spec.shared_bytes(), (1, slices, 1))
    per_sm = 2 if stages == 4 else 3
    assert held >= 1 and held * slices <= per_sm * sm_count
