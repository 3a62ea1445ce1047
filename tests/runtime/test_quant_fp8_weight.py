"""Load-time fp8 weight scales (quant/fp8_weight.py): the per-channel scale of least rounding error."""

from __future__ import annotations

import pytest
import torch
from kvpilot.runtime.kernels.quant_reference import FP8_MAX
from kvpilot.runtime.quant import fp8_weight
from kvpilot.runtime.quant.fp8_weight import quantize_fp8_weight


def _row_errors(w: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return ((q.float() * scale.view(-1, 1) - w) ** 2).sum(dim=1)


def _absmax(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = w.abs().amax(dim=1) / FP8_MAX
    return (w / scale.view(-1, 1)).to(torch.float8_e4m3fn), scale


@pytest.mark.parametrize("dist", ["normal", "heavy-tailed"])
def test_no_row_is_worse_than_absmax_and_the_whole_is_better(dist: str) -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(96, 320, generator=gen) * 0.02
    if dist == "heavy-tailed":
        w = w * torch.exp(torch.randn(96, 320, generator=gen))
    q, scale = quantize_fp8_weight(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape and scale.shape == (96,)
    assert q.float().abs().max() <= FP8_MAX
    ours, base = _row_errors(w, q, scale), _row_errors(w, *_absmax(w))
    assert bool((ours <= base).all())
    assert ours.sum() < 0.97 * base.sum()  # measured ~0.9 on SmolLM2's weights


def test_a_row_already_on_the_fp8_grid_keeps_its_absmax_scale() -> None:
    grid = torch.tensor([448.0, -448.0, 0.0, 1.0, -0.5, 3.25, 96.0, 0.015625])
    w = torch.stack([grid * 0.01, grid * 3.0])
    q, scale = quantize_fp8_weight(w)
    torch.testing.assert_close(scale, w.abs().amax(dim=1) / FP8_MAX)
    torch.testing.assert_close(q.float() * scale.view(-1, 1), w, atol=0, rtol=0)


def test_rows_searched_in_chunks_give_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    w = torch.randn(37, 64, generator=torch.Generator().manual_seed(1)).bfloat16()
    whole_q, whole_s = quantize_fp8_weight(w)
    monkeypatch.setattr(fp8_weight, "CHUNK_ELEMENTS", 5 * 64)  # 8 chunks, the last of 2 rows
    part_q, part_s = quantize_fp8_weight(w)
    torch.testing.assert_close(part_s, whole_s, atol=0, rtol=0)
    assert torch.equal(part_q.view(torch.uint8), whole_q.view(torch.uint8))


def test_the_triton_kernel_scores_candidates_as_the_reference() -> None:
    # CPU under TRITON_INTERPRET (tests/conftest.py), the GPU path's kernel against the torch scoring: rows
    # of mixed magnitudes (some in e4m3's subnormal range at their scale), exact ties between two fp8
    # values (1.0625 lies halfway between 1.0 and 1.125: to even, 1.0), K not a multiple of the block
    from kvpilot.runtime.kernels.fp8_scale_search_triton import candidate_errors_triton
    from kvpilot.runtime.quant.fp8_weight import candidate_errors_ref, candidate_scales

    gen = torch.Generator().manual_seed(2)
    w = torch.randn(7, 1100, generator=gen) * torch.logspace(-4, 1, 7).view(-1, 1)
    w[0, :4] = torch.tensor([448.0, 1.0625, -1.0625, 3.25]) * 0.01  # row 0's absmax scale is 0.01
    scales = candidate_scales(w.abs().amax(dim=1) / 448.0, 8, 0.5)
    want = candidate_errors_ref(w, scales)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # the GPU itself where there is one
    got = candidate_errors_triton(w.to(device), scales.to(device)).cpu()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-12)
    assert torch.equal(got.argmin(dim=0), want.argmin(dim=0))


@pytest.mark.gpu
def test_the_gpu_picks_the_scales_the_cpu_picks() -> None:
    # The perplexity rows are measured on the CPU; a GPU load must quantize to the same bytes.
    w = torch.randn(256, 4096, generator=torch.Generator().manual_seed(3)).bfloat16()
    q_cpu, s_cpu = quantize_fp8_weight(w)
    q_gpu, s_gpu = quantize_fp8_weight(w.cuda())
    torch.testing.assert_close(s_gpu.cpu(), s_cpu, atol=0, rtol=0)
    assert torch.equal(q_gpu.cpu().view(torch.uint8), q_cpu.view(torch.uint8))
