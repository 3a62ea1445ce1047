"""Shared pieces of the int4 / int8 kernel tests (test_w4a16_cuda.py, test_w4a16_gemm_cuda.py,
test_w8a16_gemm.py, test_w4a16_gemm_groups.py, test_w4a16_resident.py): a quantized case, its reference
GEMM, plans varied (K slices, waits) and run side by side, the GPU's SM count and the H200's held-cluster
counts."""

from __future__ import annotations

import dataclasses

import torch
from kvpilot.runtime.kernels.quant_reference import dequantize_int_ref
from kvpilot.runtime.kernels.w4a16_gemm_plan import GemmLaunch, GemmSpec
from kvpilot.runtime.quant.int_weight import quantize_rtn

# cuOccupancyMaxActiveClusters on the H200 (fourteenth session) for the 4-warp builds at 33-64 tokens:
# clusters of 2..8 CTAs held at once where 3 and where 2 CTAs fit an SM (less what the GPCs leave unused)
H200_HELD = {
    3: {2: 198, 3: 124, 4: 92, 5: 69, 6: 62, 7: 47, 8: 45},
    2: {2: 132, 3: 79, 4: 62, 5: 47, 6: 39, 7: 32, 8: 30},
}


def h200_held(spec: GemmSpec, slices: int) -> int:
    return H200_HELD[min(3, (227 * 1024) // (spec.shared_bytes() + 1024))][slices]


def int4_case(
    m: int, n: int, k: int, group: int, sym: bool, seed: int, bits: int = 4
) -> tuple[torch.Tensor, ...]:
    """x [m, k] and an int4 (or int8) weight of [n, k] (round-to-nearest, group; -1 one per column) on the
    GPU, from a seed."""
    gen = torch.Generator().manual_seed(seed)
    w = quantize_rtn(torch.randn(n, k, generator=gen) * 0.05, bits, group, sym=sym)
    x = torch.randn(m, k, generator=gen).bfloat16()
    return x.cuda(), w.qweight.cuda(), w.scales.bfloat16().cuda(), w.zeros.bfloat16().cuda()


def reference_gemm(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, biased: bool = False
) -> torch.Tensor:
    """fp32 products of x and the weight the kernel's mmas take: the bf16 dequantized weight, or in biased
    builds the exact (q - z) s (never rounded to bf16)."""
    dtype = torch.float32 if biased else scales.dtype
    bits = 32 * qweight.shape[0] // x.shape[1]
    return x.float() @ dequantize_int_ref(qweight, scales.to(dtype), zeros.to(dtype), bits).float()


def sms() -> int:
    return torch.cuda.get_device_properties(0).multi_processor_count


def with_wait(plan: GemmLaunch, steps: int) -> GemmLaunch:
    """plan whose WGMMA build waits every `steps` k-steps (GemmSpec.wait_steps)."""
    return dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, wait_steps=steps))


def assert_every_plan_computes(
    want: torch.Tensor, case: tuple[torch.Tensor, ...], plans: list[GemmLaunch]
) -> None:
    """Each plan, in one K slice and (on sm_90) in 4, gives want from case (x, qweight, scales, zeros)."""
    from kvpilot.runtime.kernels.w4a16_gemm_cuda import w4a16_gemm

    hopper = torch.cuda.get_device_capability() >= (9, 0)
    for slices in (1, 4) if hopper else (1,):
        for plan in plans:
            out = w4a16_gemm(*case, sms(), plan.sliced(slices))
            torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2, msg=str(plan))
