"""The one-launch group offsets (kernels/group_offsets_triton.py) against their torch reference
(quant/int_weight.add_offsets). Without CUDA under TRITON_INTERPRET=1 at small shapes."""

from __future__ import annotations

import pytest
import torch
from kvpilot.runtime.kernels.triton_utils import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before anything imports triton

from kvpilot.runtime.kernels.group_offsets_triton import add_offsets_triton  # noqa: E402
from kvpilot.runtime.quant.int_weight import add_offsets  # noqa: E402

DEVICE = torch.device("cpu" if INTERPRET else "cuda")
# bf16 on a GPU; the interpreter's bf16 dot is not numpy's (the other kernels' CPU tests use float16 too)
DTYPES = [torch.float32, torch.float16] if INTERPRET else [torch.float32, torch.bfloat16]


@pytest.mark.parametrize(
    ("m", "k", "n", "group"),
    [(1, 576, 96, 32), (5, 512, 64, 64), (19, 320, 130, 32)],  # 18 groups: a ragged step of 16; 130: ragged N
)
@pytest.mark.parametrize("dtype", DTYPES)
def test_offsets_kernel_matches_the_reference(m: int, k: int, n: int, group: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=gen).to(DEVICE, dtype)
    y = torch.randn(m, n, generator=gen).to(DEVICE, dtype)
    offsets = (0.01 * torch.randn(k // group, n, generator=gen)).to(DEVICE, dtype)
    y0 = y.clone()
    want = add_offsets(y0, x, offsets).float()
    got = add_offsets_triton(y, x, offsets)
    assert got.data_ptr() == y.data_ptr()  # in place
    exact = (x.float().unflatten(-1, (k // group, group)).sum(-1) @ offsets.float()) + y0.float()
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)
    torch.testing.assert_close(got.float(), exact, rtol=tol, atol=tol)


def test_offsets_that_do_not_fit_are_refused() -> None:
    x = torch.randn(2, 96, device=DEVICE)
    with pytest.raises(ValueError, match="do not fit"):
        add_offsets_triton(
            torch.zeros(2, 8, device=DEVICE), x, torch.zeros(4, 8, device=DEVICE)
        )  # 24 a group


@pytest.mark.parametrize("m", [1, 5, 40])
@pytest.mark.parametrize("group", [32, 64])
def test_the_int_dispatch_adds_the_offsets(m: int, group: int) -> None:
    from kvpilot.runtime.kernels.w4a16_mma_triton import int_gemm_mma
    from kvpilot.runtime.kernels.w4a16_triton import int_gemm
    from kvpilot.runtime.quant.int_weight import dense_weight, quantize_rtn

    gen = torch.Generator().manual_seed(m + group)
    k, n = 256, 128
    dtype = DTYPES[1]  # 16-bit: w4a16_gemm.cu takes bf16 on a GPU (fused there), the Triton paths else
    w = quantize_rtn(torch.randn(n, k, generator=gen) * 0.05, 4, group, sym=False)
    w.offsets = (0.005 * torch.randn(k // group, n, generator=gen)).to(dtype)
    q, s, z, o = (t.to(DEVICE) for t in (w.qweight, w.scales.to(dtype), w.zeros.to(dtype), w.offsets))
    x = torch.randn(m, k, generator=gen).to(DEVICE, dtype)
    exact = x.float() @ dense_weight(w).float().to(DEVICE)  # the weight with its offsets, in float32
    for gemm in (int_gemm, int_gemm_mma):
        if gemm is int_gemm_mma and m < 17:
            continue  # the tensor-core GEMM's buckets start past the GEMV's tokens
        plain = gemm(x, q, s, z, 4).float()
        got = gemm(x, q, s, z, 4, offsets=o).float()
        torch.testing.assert_close(got, exact, rtol=2e-2, atol=2e-2)
        assert (got - plain).abs().max() > 0.01  # the offsets moved the result
