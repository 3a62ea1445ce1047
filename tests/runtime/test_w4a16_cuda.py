"""w4a16_gemv.cu, the int4 weight-only GEMM for 1-16 tokens on mma.sync: its launch choice (CPU), its
offline sm_90 compile (CPU: NVRTC + ptxas), and on the GPU its output against the reference GEMM on the
dequantized weight (quant_reference.int_gemm_ref) over token counts, groups, zero points and layer shapes,
also as int_gemm dispatches it and inside a CUDA graph."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import pytest
import torch
from kvpilot.runtime.kernels.quant_reference import int_gemm_ref
from kvpilot.runtime.kernels.w4a16_cuda import (
    SOURCE,
    W4Launch,
    W4Spec,
    dispatched_launch,
    launch_for,
    max_tiles,
    preferred,
    unsupported,
)
from kvpilot.runtime.quant.int_weight import quantize_rtn

from tests.runtime.nvrtc_offline import ptx, sm90_resources
from tests.runtime.w4a16_cases import int4_case

Greedy = list[tuple[list[int], list[Any]]]  # per prompt: token ids, logprobs


def test_launch_slices_k_until_the_gpu_holds_three_ctas_per_sm() -> None:
    # Qwen3-8B at one token on 132 SMs: o_proj's 64 column blocks in 6 slices; gate_up's 384 fill the GPU
    # unsliced; down's 64 in 6; 16 tokens stage 8 tiles per CTA, so down needs 12 slices
    assert launch_for(1, 4096, 4096, 128, 132) == W4Launch(W4Spec(4, 1, 1), 6)
    assert launch_for(1, 24576, 4096, 128, 132) == W4Launch(W4Spec(4, 1, 1), 1)
    assert launch_for(1, 4096, 12288, 128, 132) == W4Launch(W4Spec(4, 1, 1), 6)
    assert launch_for(16, 4096, 12288, 4096, 132) == W4Launch(W4Spec(4, 2, 32), 12)
    assert launch_for(1, 64, 256, 256, 132).slices == 2  # never more slices than K tiles
    assert launch_for(1, 64, 256, 256, 132, stages=3).spec.stages == 3
    assert max_tiles(1) == 128 and max_tiles(16) == 8  # 32 KB of staged x


def test_preferred_up_to_eight_tokens_in_one_wave() -> None:
    # Qwen3-8B (qkv, o, gate_up, down as N x K) on the H200's 132 SMs, as the eighth session's sweep found
    layers = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}
    for m in (1, 4):
        assert all(preferred(m, n, k, 128, 132) for n, k in layers.values())
    # 8 tokens: gate_up's staged x forces a second wave of CTAs (it lost there); the others still fit
    assert [preferred(8, n, k, 128, 132) for n, k in layers.values()] == [True, True, False, True]
    assert not any(preferred(9, n, k, 128, 132) for n, k in layers.values())


def test_the_dispatch_clusters_fewer_slices_where_it_measured_faster() -> None:
    # Qwen3-8B on the H200's 132 SMs (the sixteenth session's sweep): qkv (3 slices) and o (4) at 1-4 tokens
    # in a cluster, register build; not down (16 tiles a slice), gate_up (one slice), 8 tokens, or a GPU
    # without clusters
    layers = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (24576, 4096), "down": (4096, 12288)}

    def clustered(m: int, layer: str, hopper: bool = True) -> int:
        plan = dispatched_launch(m, *layers[layer], 128, 132, hopper)
        return plan.slices if plan.spec.cluster_reduce else 0

    assert [clustered(m, "qkv") for m in (1, 2, 4)] == [3, 3, 3]
    assert [clustered(m, "o") for m in (1, 2, 4)] == [4, 4, 4]
    assert not any(clustered(m, layer) for m in (1, 4) for layer in ("gate_up", "down"))
    assert not clustered(8, "qkv") and not clustered(1, "qkv", hopper=False)


def test_unsupported_names_the_reason() -> None:
    x = torch.zeros(1, 256, dtype=torch.bfloat16)
    w = quantize_rtn(torch.randn(64, 256), 4, 128, sym=False)
    assert unsupported(x, w.qweight, w.scales.bfloat16(), 4) == "needs a CUDA device"


@pytest.mark.parametrize(("warps", "nt"), [(4, 1), (4, 2), (8, 1)])
def test_compiles_for_sm90_without_spills(warps: int, nt: int, tmp_path: Path) -> None:
    spec = W4Spec(warps, nt, 1)
    registers, spills, report = sm90_resources(ptx(SOURCE, spec.macros()), tmp_path)
    assert spills == 0, report
    # 3 CTAs of 4 warps per SM at one token tile (the default build); the others only must not spill
    assert registers <= (168 if (warps, nt) == (4, 1) else 255), report


@pytest.mark.parametrize("cluster", [False, True])
def test_the_register_build_fits_three_ctas_per_sm_with_or_without_a_cluster(
    cluster: bool, tmp_path: Path
) -> None:
    # the dispatched builds, the cluster's header included: <= 168 registers (3 CTAs of 4 warps)
    spec = W4Spec(4, 1, 1, cluster_reduce=cluster)
    registers, spills, report = sm90_resources(ptx(SOURCE, spec.macros()), tmp_path)
    assert spills == 0 and registers <= 168, report
    assert (b"ld.shared::cluster" in ptx(SOURCE, spec.macros())) == cluster


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 3, 8, 9, 16])
@pytest.mark.parametrize(
    ("n", "k", "group"), [(4096, 4096, 128), (960, 576 * 2, 128), (64, 256, 256), (1536, 1024, -1)]
)
@pytest.mark.parametrize("sym", [False, True], ids=["zero-point", "sym"])
def test_matches_the_reference(m: int, n: int, k: int, group: int, sym: bool) -> None:
    from kvpilot.runtime.kernels.w4a16_cuda import w4a16_gemv

    x, qweight, scales, zeros = int4_case(m, n, k, group, sym, seed=m * 7 + n)
    assert unsupported(x, qweight, scales, 4) is None
    counters = torch.zeros(n // 64, device="cuda", dtype=torch.int32)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    ref = int_gemm_ref(x, qweight, scales, zeros, 4)
    for _ in range(2):  # the split launches leave the counters zero for the next one
        out = w4a16_gemv(x, qweight, scales, zeros, sms, counters)
        torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
        assert int(counters.abs().sum()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 5, 16])
@pytest.mark.parametrize("early", [False, True])
def test_either_release_point_computes_the_same_gemm(m: int, early: bool) -> None:
    import dataclasses

    from kvpilot.runtime.kernels.w4a16_cuda import w4a16_gemv

    n, k, group = 1024, 4096, 256  # 4 K slices: the split fixup runs under either release
    x, qweight, scales, zeros = int4_case(m, n, k, group, False, seed=m)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    plan = launch_for(m, n, k, group, sms)
    plan = dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, early_release=early))
    want = int_gemm_ref(x, qweight, scales, zeros, 4).float()
    out = w4a16_gemv(x, qweight, scales, zeros, sms, plan=plan)
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "slices"), [(1, 2), (8, 2), (1, 5), (1, 6), (8, 6), (16, 4), (16, 8)])
def test_a_cluster_adds_the_slices_as_the_workspace_does(m: int, slices: int) -> None:
    # Same partial sums, added in the same slice order: the outputs agree bit for bit, and both match the
    # reference; in a graph replayed twice (the workspace's counters must come back to zero).
    import dataclasses

    from kvpilot.runtime.kernels.w4a16_cuda import w4a16_gemv

    n, k, group = 1024, 4096, 128
    x, qweight, scales, zeros = int4_case(m, n, k, group, False, seed=slices)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    base = dataclasses.replace(launch_for(m, n, k, group, sms), slices=slices)
    cluster = dataclasses.replace(base, spec=dataclasses.replace(base.spec, cluster_reduce=True))
    counters = torch.zeros(n // 64, device="cuda", dtype=torch.int32)
    outs = [w4a16_gemv(x, qweight, scales, zeros, sms, counters, plan) for plan in (base, cluster)]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = [w4a16_gemv(x, qweight, scales, zeros, sms, counters, plan) for plan in (base, cluster)]
    for _ in range(2):
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(replayed[0], replayed[1]) and torch.equal(replayed[1], outs[1])
    assert torch.equal(outs[0], outs[1])
    want = int_gemm_ref(x, qweight, scales, zeros, 4).float()
    torch.testing.assert_close(outs[1].float(), want, atol=2e-2, rtol=2e-2)
    assert int(counters.abs().sum()) == 0


def test_clusters_take_two_to_eight_slices() -> None:
    # o_proj at one token: 6 slices meet in a cluster; down at 16 tokens: 12 slices use the workspace
    assert launch_for(1, 4096, 4096, 128, 132, clusters=True).spec.cluster_reduce
    assert not launch_for(1, 4096, 4096, 128, 132).spec.cluster_reduce
    assert not launch_for(16, 4096, 12288, 4096, 132, clusters=True).spec.cluster_reduce
    assert not launch_for(1, 24576, 4096, 128, 132, clusters=True).spec.cluster_reduce  # one slice


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 5, 8, 16])
@pytest.mark.parametrize("stages", [2, 3])
@pytest.mark.parametrize(("n", "k", "group", "ctas"), [(1024, 4096, 256, 2.0), (960, 576 * 2, 128, 1.0)])
def test_any_register_ring_depth_computes_the_same_gemm(
    m: int, stages: int, n: int, k: int, group: int, ctas: float
) -> None:
    # Warps with fewer tiles than stages, more (the ring refills), and none (9 tiles over 4 warps); split K
    # (4096: several slices) and one slice.
    from kvpilot.runtime.kernels.w4a16_cuda import w4a16_gemv

    x, qweight, scales, zeros = int4_case(m, n, k, group, False, seed=m + stages)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    plan = launch_for(m, n, k, group, sms, ctas, stages=stages)
    counters = torch.zeros(n // 64, device="cuda", dtype=torch.int32)
    want = int_gemm_ref(x, qweight, scales, zeros, 4).float()
    for _ in range(2):
        out = w4a16_gemv(x, qweight, scales, zeros, sms, counters, plan)
        torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
        assert int(counters.abs().sum()) == 0


@pytest.mark.gpu
def test_int_gemm_dispatches_here_when_asked_and_replays_in_a_graph() -> None:
    from kvpilot.runtime.kernels import nvrtc
    from kvpilot.runtime.kernels.w4a16_triton import int_gemm

    x, qweight, scales, zeros = int4_case(4, 4096, 4096, 128, False, seed=5)
    info = nvrtc.compile_cuda.cache_info()
    out = int_gemm(x, qweight, scales, zeros, 4, cuda_kernel=True)
    after = nvrtc.compile_cuda.cache_info()
    assert after.hits + after.misses > info.hits + info.misses  # it went through an NVRTC kernel
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = int_gemm(x, qweight, scales, zeros, 4, cuda_kernel=True)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.testing.assert_close(out, int_gemm(x, qweight, scales, zeros, 4, cuda_kernel=True), atol=0, rtol=0)
    torch.testing.assert_close(
        out.float(), int_gemm_ref(x, qweight, scales, zeros, 4).float(), atol=2e-2, rtol=2e-2
    )


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16])
def test_a_chain_reads_its_predecessors_output_under_pdl(m: int) -> None:
    # The second GEMM's x is the first's y: launched with programmatic dependent launch, it starts while
    # the first drains (the first releases it before its stores), so it must wait before staging x.
    from kvpilot.runtime.kernels.w4a16_cuda import w4a16_gemv

    x, q1, s1, z1 = int4_case(m, 4096, 2048, 128, False, seed=11)
    _, q2, s2, z2 = int4_case(m, 24576, 4096, 128, False, seed=12)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    graph = torch.cuda.CUDAGraph()
    w4a16_gemv(w4a16_gemv(x, q1, s1, z1, sms), q2, s2, z2, sms)  # compile outside the capture
    with torch.cuda.graph(graph):
        out = w4a16_gemv(w4a16_gemv(x, q1, s1, z1, sms), q2, s2, z2, sms)
    for seed in range(3):
        x.copy_(torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)).bfloat16())
        graph.replay()
        want = int_gemm_ref(int_gemm_ref(x, q1, s1, z1, 4), q2, s2, z2, 4)
        torch.testing.assert_close(out.float(), want.float(), atol=1e-1, rtol=2e-2)


@pytest.mark.gpu
def test_a_misaligned_x_goes_to_the_triton_kernels() -> None:
    from kvpilot.runtime.kernels.w4a16_triton import int_gemm

    x, qweight, scales, zeros = int4_case(2, 256, 1024, 128, False, seed=3)
    shifted = torch.empty(2, 1025, device="cuda", dtype=torch.bfloat16)
    shifted[:, 1:].copy_(x)
    view = shifted[:, 1:]  # rows start 2 bytes past a 16-byte boundary
    assert "16-byte aligned" in (unsupported(view, qweight, scales, 4) or "")
    out = int_gemm(view, qweight, scales, zeros, 4, cuda_kernel=True)
    torch.testing.assert_close(
        out.float(), int_gemm_ref(x, qweight, scales, zeros, 4).float(), atol=2e-2, rtol=2e-2
    )


def greedy_and_logprobs(path: Path, quantization: str = "int4") -> Greedy:
    from kvpilot.runtime.llm import LLM
    from kvpilot.runtime.sampling_params import SamplingParams

    llm = LLM(
        str(path),
        device="cuda",
        dtype="bfloat16",
        quantization=quantization,
        kernel_backend="triton",
        max_model_len=128,
        gpu_memory_utilization=0.3,
    )
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, logprobs=2)
    outs = llm.generate(["the cat sat on", "a quick brown fox"], params)
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return [(o.token_ids, o.logprobs or []) for o in outs]


@pytest.mark.gpu
def test_a_bf16_int4_engine_gives_the_tokens_of_the_triton_kernels(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Shapes this kernel takes (K a multiple of 128, N of 64), bf16: the decode steps run every projection
    # here; the same engine with the kernel declined runs the Triton int4 kernels. Only the GEMMs differ:
    # this kernel scales fp32 sums per group, the Triton ones round each dequantized weight to bf16, and
    # in a bf16 engine logprobs came 0.06 apart on the H200. A wrong column, scale or zero moves them by
    # whole units, so tokens agree up to a near-tie and logprobs within 0.15 (the fp8 engine test's margin).
    from kvpilot.runtime.kernels import w4a16_cuda, w4a16_resident

    assert not w4a16_resident.DISPATCHED  # (dispatched, it has its own engine test: test_w4a16_resident.py)
    path = tiny_int4_checkpoint(tmp_path)
    launches = spy_on(monkeypatch, w4a16_cuda, "w4a16_gemv")
    cuda = greedy_and_logprobs(path)
    assert launches and max(launches) <= 8
    monkeypatch.setattr(w4a16_cuda, "preferred", lambda *args: False)
    launches.clear()
    triton = greedy_and_logprobs(path)
    assert not launches
    assert_tokens_agree(cuda, triton)


def spy_on(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[int]:
    """The token counts of every call of module.name (x its first argument) from now on, as they happen."""
    launches: list[int] = []
    launch = getattr(module, name)

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        launches.append(args[0].shape[0])
        return launch(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return launches


def tiny_int4_checkpoint(tmp_path: Path) -> Path:
    """A tiny Qwen3 checkpoint whose projections the int4 CUDA kernels take (K a multiple of 128, N of 64)."""
    from kvpilot.runtime.fixtures import make_tiny_checkpoint

    return make_tiny_checkpoint(
        tmp_path / "m",
        "qwen3",
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        num_hidden_layers=2,
    )


def assert_tokens_agree(got: Greedy, ref: Greedy) -> None:
    """Greedy tokens agree up to a near-tie (top two within 0.15) and their logprobs within 0.15."""
    compared = 0
    for (ids, lps), (ref_ids, ref_lps) in zip(got, ref, strict=True):
        for a, b, lp, want in zip(ids, ref_ids, lps, ref_lps, strict=True):
            top = [v for _, v in want.top_logprobs]
            if a != b:
                assert top[0] - top[1] < 0.15, (a, b, want.top_logprobs)
                break
            assert lp.logprob == pytest.approx(want.logprob, abs=0.15)
            compared += 1
    assert compared >= 8
