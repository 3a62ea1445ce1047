"""The int4 tensor-core GEMV kernel (kernels/int4_mma_gemv_triton.py) itself under TRITON_INTERPRET=1:
its Triton code (operand construction, prefetch, token sets, split-K, the epilogue's offsets) runs as
written, with the one row set's inline PTX (which the interpreter cannot run) replaced by what it
computes, written in Triton ops on whole [R, 128] tensors: element j stands for lane j / 4 (g = j / 16,
t = j / 4 % 4) and block c = j % 4, as in the kernel. test_int4_mma_gemv.py checks that the PTX computes
exactly this, lane by lane."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from kvpilot.runtime.kernels import int4_mma_gemv_triton as mma
from kvpilot.runtime.kernels.quant_reference import dequantize_int_ref
from kvpilot.runtime.quant.int_weight import quantize_rtn


@triton.jit
def _dequant(words, zz, ss, VALUE: tl.constexpr, DTYPE: tl.constexpr, OFFSET: tl.constexpr):
    """Value VALUE of every word as the asm's bf16 / fp16 weight: ((OFFSET + q) - (OFFSET + z)) * s,
    rounded to DTYPE (zz, ss: the pair operands, the value in each half)."""
    offset_z = (zz & 0xFFFF).to(tl.int16).to(DTYPE, bitcast=True).to(tl.float32)
    s = (ss & 0xFFFF).to(tl.int16).to(DTYPE, bitcast=True).to(tl.float32)
    q = ((words >> (4 * VALUE)) & 15).to(tl.float32)
    return ((q + OFFSET - offset_z) * s).to(DTYPE).to(tl.float32)


@triton.jit
def _to_lanes(t, E: tl.constexpr):
    """[R, 8 g, 4 c, 8 tokens] -> [R, 128]: element (g, t, c) holds token 2t + E, the D register layout."""
    R: tl.constexpr = t.shape[0]
    lo, hi = tl.split(tl.reshape(t, (R, 8, 4, 4, 2)))  # tokens as (t, parity)
    return tl.reshape(tl.permute(lo if E == 0 else hi, (0, 1, 3, 2)), (R, 128))


@triton.jit
def _row_set_emulated(d0, d1, d2, d3, w_lo, w_hi, z_lo, z_hi, s_lo, s_hi, x_at, valid, FP16: tl.constexpr):
    """mma.m16n8k16 over one row set: D[column (g, c), token n] += sum over (t, value i) of the weight
    of lane (g, t) and x[n] at that lane's K row of value i (B's token n lives in lane (n, t))."""
    R: tl.constexpr = w_lo.shape[0]
    DTYPE: tl.constexpr = tl.float16 if FP16 else tl.bfloat16
    OFFSET: tl.constexpr = 1024.0 if FP16 else 128.0
    acc_lo = tl.zeros((R, 8, 4, 8), dtype=tl.float32)
    acc_hi = tl.zeros((R, 8, 4, 8), dtype=tl.float32)
    for i in tl.static_range(8):
        x = tl.load(x_at + 16 * i, mask=valid != 0, other=0.0).to(tl.float32)  # [R, 128]
        x = tl.max(tl.reshape(x, (R, 8, 4, 4)), axis=3)  # [R, 8 tokens, 4 t]: the copies over c agree
        x = tl.reshape(tl.permute(x, (0, 2, 1)), (R, 1, 4, 1, 8))  # [R, 1, t, 1, tokens]
        lo = tl.reshape(_dequant(w_lo, z_lo, s_lo, i, DTYPE, OFFSET), (R, 8, 4, 4, 1))  # [R, g, t, c, 1]
        hi = tl.reshape(_dequant(w_hi, z_hi, s_hi, i, DTYPE, OFFSET), (R, 8, 4, 4, 1))
        acc_lo += tl.sum(lo * x, axis=2)
        acc_hi += tl.sum(hi * x, axis=2)
    return (
        d0 + _to_lanes(acc_lo, 0),
        d1 + _to_lanes(acc_lo, 1),
        d2 + _to_lanes(acc_hi, 0),
        d3 + _to_lanes(acc_hi, 1),
    )


@triton.jit
def _row_set2_emulated(
    d0, d1, d2, d3, e0, e1, e2, e3, w_lo, w_hi, z_lo, z_hi, s_lo, s_hi, x_at, valid, x_at2, valid2,
    FP16: tl.constexpr,
):  # fmt: skip
    d0, d1, d2, d3 = _row_set_emulated(d0, d1, d2, d3, w_lo, w_hi, z_lo, z_hi, s_lo, s_hi, x_at, valid, FP16)
    e0, e1, e2, e3 = _row_set_emulated(
        e0, e1, e2, e3, w_lo, w_hi, z_lo, z_hi, s_lo, s_hi, x_at2, valid2, FP16
    )
    return d0, d1, d2, d3, e0, e1, e2, e3


CONFIGS = [
    None,  # the default: as many splits as tiles here
    mma.MmaConfig(split_k=2, reduce="fixup"),
    mma.MmaConfig(split_k=2, prefetch=False, reduce="fixup_wide"),
    mma.MmaConfig(split_k=1, tiles=2),
    mma.MmaConfig(split_k=2, reduce="workspace"),
    mma.MmaConfig(split_k=1, l2_ahead=2),  # the L2 prefetch (a no-op here) and its clamped address
]


@triton.jit
def _prefetch_nothing(at):
    """The interpreter has no L2 to prefetch into; the address arithmetic still runs."""
    tl.static_assert(len(at.shape) == 2)


@pytest.mark.parametrize(
    "config",
    CONFIGS,
    ids=lambda c: "default" if c is None else f"s{c.split_k}-t{c.tiles}-p{int(c.prefetch)}-{c.reduce}",
)
@pytest.mark.parametrize(("m", "dtype"), [(1, torch.bfloat16), (3, torch.float16), (11, torch.bfloat16)])
def test_int4_mma_kernel_matches_reference(
    monkeypatch: pytest.MonkeyPatch, config: mma.MmaConfig | None, m: int, dtype: torch.dtype
) -> None:
    """N = 96: a full and a half-masked block of 64 columns; K = 512: four pack tiles (1-4 splits, two
    tiles per step); m = 11: both token sets."""
    monkeypatch.setattr(mma, "_row_set", _row_set_emulated)
    monkeypatch.setattr(mma, "_row_set2", _row_set2_emulated)
    monkeypatch.setattr(mma, "_prefetch_l2", _prefetch_nothing)
    gen = torch.Generator().manual_seed(m)
    n, k = 96, 512
    w = quantize_rtn(0.02 * torch.randn(n, k, generator=gen), 4, 128, sym=False)
    s, z = w.scales.to(dtype), w.zeros.to(dtype)
    x = torch.randn(m, k, generator=gen).to(dtype)
    got = mma.int4_mma_gemv(x, w.qweight, s, z, config).float()
    want = x.float() @ dequantize_int_ref(w.qweight, s, z, 4).float()
    torch.testing.assert_close(got, want.to(dtype).float(), rtol=1e-2, atol=1e-2)
