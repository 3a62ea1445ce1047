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
from kvpilot.runtime.kernels.fp8_quant_triton import quantize_fp8_groups_triton  # noqa: E402
from kvpilot.runtime.kernels.quant_reference import (  # noqa: E402
    fp8_block_gemm_ref,
    fp8_block_w8a8_ref,
    quantize_fp8_groups_ref,
)
from kvpilot.runtime.kernels.split_k_triton import split_counters  # noqa: E402
from kvpilot.runtime.quant.fp8_block import block_scaled_mm, quantize_fp8_blocks, runs_w8a8  # noqa: E402

DEVICE = torch.device("cpu" if INTERPRET else "cuda")


def block_weight(n: int, k: int, bn: int, bk: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """An fp8 weight [N, K] and its block scales [ceil(N / bn), ceil(K / bk)], which differ by orders of
    magnitude (a kernel that applied the wrong block's scale could not pass)."""
    gen = torch.Generator().manual_seed(seed)
    rows, cols = -(-n // bn), -(-k // bk)
    spread = torch.logspace(-3, 1, rows * cols)[torch.randperm(rows * cols, generator=gen)].view(rows, cols)
    w = torch.randn(n, k, generator=gen) * spread.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    q, scale = quantize_fp8_blocks(w, bn, bk)
    return q.to(DEVICE), scale.to(DEVICE)


@pytest.mark.parametrize("expanded", [False, True], ids=["blocks", "rows"])
@pytest.mark.parametrize(
    ("m", "n", "k", "bn", "bk"),
    [
        (1, 48, 96, 32, 32),  # decode: 16-row tiles, split over K
        (3, 80, 96, 48, 48),  # ragged blocks, K tiles of 16 inside 48-column blocks
        (20, 40, 64, 128, 128),  # one ragged block; 64-row tiles
        (70, 130, 64, 16, 64),  # prefill tiles, N past a tile
    ],
)
def test_matches_reference(m: int, n: int, k: int, bn: int, bk: int, expanded: bool) -> None:
    """Scales as the checkpoint's blocks, or each block row repeated over its rows (fused shards that do
    not start on a block row)."""
    w, scale = block_weight(n, k, bn, bk)
    block = (bn, bk)
    if expanded:
        scale, block = scale.repeat_interleave(bn, dim=0)[:n].contiguous(), (1, bk)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    got = fp8_block_gemm(x, w, scale, block)
    torch.testing.assert_close(got, fp8_block_gemm_ref(x, w, scale, block), rtol=1e-4, atol=1e-4)


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
        got = fp8_block_gemm(x, w, scale, (128, 128), counters).float()
        want = fp8_block_gemm_ref(x.float(), w, scale, (128, 128))
        assert float((got - want).norm() / want.norm()) < 1e-2, (m, n, k)


def test_group_quantizer_matches_reference() -> None:
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    x[3, 130] = 40.0  # an outlier sets (token 3, group 1)'s scale alone
    values, scales = quantize_fp8_groups_triton(x, rows=8)
    assert scales.stride() == (1, 8)  # column-major, as torch._scaled_mm's 1 x 128 scaling takes it
    assert not bool(values[5:].float().any())  # padding rows: zeros
    values, scales = values[:5], scales[:5]
    want_values, want_scales = quantize_fp8_groups_ref(x)
    torch.testing.assert_close(scales, want_scales)
    got, want = values.float(), want_values.float()
    wrong = got != want
    if INTERPRET:  # the interpreter's float8 cast (see test_quant_kernels): a few values off by rounding
        assert float(wrong.float().mean()) < 0.05 and bool((got[wrong] / want[wrong]).abs().le(2).all())
    else:
        assert not bool(wrong.any())


def test_w8a8_only_for_aligned_128_blocks() -> None:
    assert runs_w8a8((128, 128), 4096, [4096, 1024, 1024])
    assert runs_w8a8((128, 128), 512, [384])
    assert not runs_w8a8((128, 128), 256, [384])  # 2 blocks along K: cuBLASLt's scales go wrong
    assert not runs_w8a8((128, 128), 4096, [4096, 1000, 1024])  # a shard off the block rows
    assert not runs_w8a8((128, 128), 4000, [4096])
    assert not runs_w8a8((64, 128), 4096, [4096])


@pytest.mark.gpu
@pytest.mark.parametrize("m", [17, 64, 301])
@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (4096, 12288), (384, 512)])
def test_block_scaled_mm_matches_w8a8_reference(m: int, n: int, k: int) -> None:
    """Above decode sizes 128 x 128 blocks run torch._scaled_mm's block scaling (cuBLASLt), W8A8."""
    assert runs_w8a8((128, 128), k, [n])
    w, scale = block_weight(n, k, 128, 128)
    x = (0.1 * torch.randn(m, k, device=DEVICE)).bfloat16()
    got = block_scaled_mm(x, w, scale).float()
    want = fp8_block_w8a8_ref(x.float(), w, scale).float()
    assert float((got - want).norm() / want.norm()) < 1e-2, (m, n, k)
