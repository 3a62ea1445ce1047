"""The block-wise fp8 GEMM (kernels/fp8_block_gemm_triton.py) against its reference (dequantize, then
matmul). Without CUDA it runs under TRITON_INTERPRET=1 at tiny shapes in float32; tests marked `gpu` run
Qwen3-8B's layer shapes in bf16, at decode and prefill token counts."""

from __future__ import annotations

import pytest
import torch
from kvpilot.runtime.kernels.triton_utils import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before anything imports triton

from kvpilot.runtime.kernels.fp8_block_gemm_triton import (  # noqa: E402
    SPLIT_MAX_M,
    block_k_for,
    fp8_block_gemm,
    launch_shape,
)
from kvpilot.runtime.kernels.quant_reference import fp8_block_gemm_ref  # noqa: E402
from kvpilot.runtime.kernels.split_k_triton import split_counters  # noqa: E402
from kvpilot.runtime.quant.fp8_block import quantize_fp8_blocks  # noqa: E402

DEVICE = torch.device("cpu" if INTERPRET else "cuda")


def block_weight(n: int, k: int, bn: int, bk: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """An fp8 weight [N, K] and its row-expanded block scales [N, ceil(K / bk)], with block scales that
    differ by orders of magnitude (a kernel that applied the wrong block's scale could not pass)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen)
    rows, cols = -(-n // bn), -(-k // bk)
    w *= (
        torch.logspace(-3, 1, rows * cols)[torch.randperm(rows * cols, generator=gen)]
        .view(rows, cols)
        .repeat_interleave(bn, 0)[:n]
        .repeat_interleave(bk, 1)[:, :k]
    )
    q, scale = quantize_fp8_blocks(w, bn, bk)
    return q.to(DEVICE), scale.repeat_interleave(bn, dim=0)[:n].contiguous().to(DEVICE)


@pytest.mark.parametrize(
    ("m", "n", "k", "bn", "bk"),
    [
        (1, 48, 96, 32, 32),  # decode: 16-row tiles, split over K
        (3, 80, 96, 48, 48),  # ragged blocks, K tiles of 16 inside 48-column blocks
        (20, 40, 64, 128, 128),  # one ragged block; 64-row tiles
        (70, 130, 64, 16, 64),  # prefill tiles, N past a tile
    ],
)
def test_matches_reference(m: int, n: int, k: int, bn: int, bk: int) -> None:
    w, scale = block_weight(n, k, bn, bk)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    got = fp8_block_gemm(x, w, scale, bk)
    torch.testing.assert_close(got, fp8_block_gemm_ref(x, w, scale, bk), rtol=1e-4, atol=1e-4)


def test_launch_shapes_split_decode_only() -> None:
    """Decode sizes split K (the weight stream needs the whole GPU); prefill tiles take whole K."""
    assert block_k_for(128) == 128 and block_k_for(48) == 16 and block_k_for(64) == 64
    block_m, _, split, _ = launch_shape(1, 6144, 4096, 128, 132)
    assert block_m == 16 and split > 1
    assert launch_shape(SPLIT_MAX_M, 4096, 12288, 128, 132)[2] > 1
    assert launch_shape(SPLIT_MAX_M + 1, 4096, 12288, 128, 132) == (64, 128, 1, 4)
    assert launch_shape(512, 4096, 12288, 128, 132) == (128, 128, 1, 8)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 4, 16, 64, 65, 300])
@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288)])
def test_qwen3_8b_shapes_bf16(m: int, n: int, k: int) -> None:
    w, scale = block_weight(n, k, 128, 128)
    x = (0.1 * torch.randn(m, k, device=DEVICE)).bfloat16()
    counters = split_counters(n, DEVICE)
    for _ in range(2):  # the fixup counters are back at zero after a call
        got = fp8_block_gemm(x, w, scale, 128, counters).float()
        want = fp8_block_gemm_ref(x.float(), w, scale, 128)
        assert float((got - want).norm() / want.norm()) < 1e-2, (m, n, k)
