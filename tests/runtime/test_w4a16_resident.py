"""w4a16_resident.cu, the int4 GEMV whose CTAs hold their whole weight in shared memory: which shapes it
takes (CPU), its offline sm_90 compile (CPU: NVRTC + ptxas), and on the GPU its output against the reference
GEMM on the dequantized weight, also chained under programmatic dependent launch in a CUDA graph."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from kvpilot.runtime.kernels.quant_reference import int_gemm_ref
from kvpilot.runtime.kernels.w4a16_resident import SOURCE, ResidentSpec, grid_ctas, resident_spec

from tests.runtime.nvrtc_offline import ptx, sm90_resources
from tests.runtime.test_w4a16_cuda import (
    assert_tokens_agree,
    greedy_and_logprobs,
    spy_on,
    tiny_int4_checkpoint,
)
from tests.runtime.w4a16_cases import int4_case

QKV, OUT, GATE_UP, DOWN = (6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)  # Qwen3-8B, N x K


def test_not_dispatched_unless_asked() -> None:
    # W3 int4 was 4% slower with it dispatched (the fifteenth session): int_gemm keeps the cluster GEMV
    from kvpilot.runtime.kernels import w4a16_resident

    assert not w4a16_resident.DISPATCHED


def test_qkv_and_o_fit_two_grids_to_the_h200s_shared_memory() -> None:
    # qkv: 384 blocks of 16 columns over 132 CTAs, at most 3 a CTA (110 KB); o: at most 2 (68 KB + 8 KB of
    # x a token)
    assert resident_spec(1, *QKV, 128, 132) == ResidentSpec(3, 1, 1)
    assert ResidentSpec(3, 1, 1).shared_bytes(1, 4096, 128) == 98304 + 6144 + 8192 + 256
    assert resident_spec(2, *QKV, 128, 132) is None  # a second token's x is past half an SM
    assert resident_spec(5, *OUT, 128, 132) == ResidentSpec(2, 1, 1)
    assert resident_spec(6, *OUT, 128, 132) is None
    assert resident_spec(1, *GATE_UP, 128, 132) is None and resident_spec(1, *DOWN, 128, 132) is None
    # 960 columns = 60 blocks: on 16 SMs 3 or 4 a CTA; on 132, 60 CTAs of one
    assert resident_spec(1, 960, 1152, 128, 16) == ResidentSpec(4, 1, 1)
    assert grid_ctas(960, 16) == 16 and grid_ctas(960, 132) == 60
    assert resident_spec(16, 960, 1152, 128, 132) == ResidentSpec(1, 2, 1)
    assert resident_spec(17, 960, 1152, 128, 132) is None
    # a short K: the warps' sums at the end (8 x 16 x 48 fp32) outgrow the inputs they replace
    assert ResidentSpec(3, 2, 1).shared_bytes(16, 128, 128) == 8 * 16 * 48 * 4


@pytest.mark.parametrize(("blocks", "nt"), [(2, 1), (3, 1), (3, 2)])
def test_compiles_for_sm90_within_two_ctas_per_sm(blocks: int, nt: int, tmp_path: Path) -> None:
    # two CTAs of 8 warps per SM (this grid's and the next one's): at most 128 registers, no spills
    spec = ResidentSpec(blocks, nt, 1)
    code = ptx(SOURCE, spec.macros())
    registers, spills, report = sm90_resources(code, tmp_path)
    assert spills == 0 and registers <= 128, report
    assert b"cp.async.cg.shared.global" in code and b"griddepcontrol.wait" in code


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("m", "n", "k", "group"),
    [
        (1, *QKV, 128),
        (1, *OUT, 128),
        (5, *OUT, 256),
        (3, 960, 1152, 128),  # one block a CTA, 9 tiles over 8 warps (one warp takes two)
        (2, 6144 - 16 * 7, 1024, 128),  # 377 blocks: 2 or 3 a CTA
        (16, 960, 1152, 384),  # two token tiles, a group of 3 tiles
        (8, 1024, 2048, -1),  # one group
        (16, 6144, 128, 128),  # one tile: the warps' sums outgrow the inputs' shared memory (not yet run)
    ],
)
@pytest.mark.parametrize("sym", [False, True], ids=["zero-point", "sym"])
def test_matches_the_reference(m: int, n: int, k: int, group: int, sym: bool) -> None:
    from kvpilot.runtime.kernels.w4a16_resident import unsupported, w4a16_resident

    x, qweight, scales, zeros = int4_case(m, n, k, group, sym, seed=m * 7 + n)
    assert unsupported(x, qweight, scales, 4) is None
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    want = int_gemm_ref(x, qweight, scales, zeros, 4).float()
    out = w4a16_resident(x, qweight, scales, zeros, sms)
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_a_chain_reads_its_predecessors_output_under_pdl() -> None:
    # Three o-shaped GEMMs, each x the previous y, replayed in a graph: every launch starts at once beside
    # its predecessor (released at entry), so each must wait before staging its x.
    from kvpilot.runtime.kernels.w4a16_resident import w4a16_resident

    x, *w1 = int4_case(1, *OUT, 128, False, seed=1)
    ws = [w1] + [int4_case(1, *OUT, 128, False, seed=s)[1:] for s in (2, 3)]
    sms = torch.cuda.get_device_properties(0).multi_processor_count

    def chain(x: torch.Tensor) -> torch.Tensor:
        for w in ws:
            x = w4a16_resident(x, *w, sms)
        return x

    chain(x)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(x)
    for seed in range(3):
        x.copy_(torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)).bfloat16())
        graph.replay()
        torch.cuda.synchronize()
        step, want = x, x
        for w in ws:  # one launch at a time: nothing to overlap, so what the graph gives must be the same
            step = w4a16_resident(step, *w, sms)
            torch.cuda.synchronize()
            want = int_gemm_ref(want, *w, 4)
        assert torch.equal(out, step)
        assert float((out.float() - want.float()).norm() / want.float().norm()) < 2e-2


@pytest.mark.gpu
def test_a_bf16_int4_engine_decodes_here_with_the_tokens_of_the_cluster_gemv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Dispatched, with two prompts: the decode steps (1-2 tokens) run every projection here; the same engine
    # with this kernel declined runs w4a16_gemv.cu. Both add fp32 sums scaled per group, in different orders.
    from kvpilot.runtime.kernels import w4a16_resident

    monkeypatch.setattr(w4a16_resident, "DISPATCHED", True)  # off by default (W3, the fifteenth session)
    path = tiny_int4_checkpoint(tmp_path)
    launches = spy_on(monkeypatch, w4a16_resident, "w4a16_resident")
    resident = greedy_and_logprobs(path)
    assert launches and max(launches) <= 2
    monkeypatch.setattr(w4a16_resident, "takes", lambda *args: False)
    launches.clear()
    cluster = greedy_and_logprobs(path)
    assert not launches
    assert_tokens_agree(resident, cluster)
