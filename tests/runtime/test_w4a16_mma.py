"""The weight-only tensor-core GEMM for M > 16 (kernels/w4a16_mma_triton.py) against its torch reference.

Without CUDA it runs under TRITON_INTERPRET=1 at tiny shapes (float32 activations: IEEE dots, so the
tolerance is tight); tests marked `gpu` run Qwen3-8B layer shapes in bf16.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from kvpilot.runtime.kernels.triton_utils import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before anything imports triton

from kvpilot.runtime.kernels.quant_reference import int_gemm_ref  # noqa: E402
from kvpilot.runtime.kernels.split_k_triton import split_counters  # noqa: E402
from kvpilot.runtime.kernels.w4a16_mma_triton import (  # noqa: E402
    MMA_BUCKETS,
    MMA_MIN_M,
    MmaGemmConfig,
    auto_split_k,
    bucket_config,
    int_gemm_mma,
    mma_dispatched,
    mma_supported,
    w4a16_mma,
)
from kvpilot.runtime.quant.int_weight import quantize_rtn  # noqa: E402

DEVICE = torch.device("cpu" if INTERPRET else "cuda")
TOL = {"rtol": 1e-4, "atol": 1e-4}


def weights(
    n: int, k: int, bits: int, group: int, dtype: torch.dtype, sym: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=DEVICE).manual_seed(n + k + bits + group)  # on the GPU: 50M values
    w = quantize_rtn(torch.randn(n, k, generator=gen, device=DEVICE), bits, group, sym=sym)
    return w.qweight.to(DEVICE), w.scales.to(DEVICE, dtype), w.zeros.to(DEVICE, dtype)


# (M, bits, group, sym, config): ragged M (17, 40) against 16/32-row blocks, N = 48 not a multiple of
# BLOCK_N (masked columns), K = 256: two pack tiles, split in two by the fixup / workspace reduce
CASES = [
    (17, 4, 32, False, MmaGemmConfig(block_m=16, block_n=32, split_k=2)),
    (40, 4, 64, True, MmaGemmConfig(block_m=32, block_n=32, split_k=1)),
    (40, 4, 128, False, MmaGemmConfig(block_m=32, block_n=16, split_k=2, swap=True)),
    (17, 4, 128, False, MmaGemmConfig(block_m=16, block_n=32, split_k=2, swap=True, reduce="workspace")),
    (40, 8, -1, True, MmaGemmConfig(block_m=16, block_n=32, split_k=2)),
    (17, 8, 32, True, MmaGemmConfig(block_m=32, block_n=16, split_k=1, swap=True)),
    (40, 8, 128, True, MmaGemmConfig(block_m=16, block_n=16, split_k=2, swap=True, reduce="fixup_wide")),
]


@pytest.mark.parametrize(("m", "bits", "group", "sym", "config"), CASES)
def test_matches_reference(m: int, bits: int, group: int, sym: bool, config: MmaGemmConfig) -> None:
    n, k = 48, 256
    qweight, scales, zeros = weights(n, k, bits, group, torch.float32, sym)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(DEVICE)
    got = w4a16_mma(x, qweight, scales, zeros, bits, config, split_counters(n, DEVICE, max_m=64))
    torch.testing.assert_close(got, int_gemm_ref(x, qweight, scales, zeros, bits), **TOL)


def test_fp16_activations_use_the_magic_operand() -> None:
    """16-bit x: the operand is (OFFSET + q) - (OFFSET + z) times s in x's dtype, the reference's
    dequantized value exactly, so only the float32 accumulation order differs."""
    n, k, m = 32, 128, 20
    qweight, scales, zeros = weights(n, k, 4, 32, torch.float16, False)
    x = (0.5 * torch.randn(m, k, generator=torch.Generator().manual_seed(1))).to(DEVICE, torch.float16)
    got = w4a16_mma(x, qweight, scales, zeros, 4, MmaGemmConfig(block_m=32, block_n=32, split_k=1))
    want = int_gemm_ref(x.float(), qweight, scales.float(), zeros.float(), 4)
    torch.testing.assert_close(got.float(), want, rtol=1e-2, atol=1e-2)


def test_rejects_what_it_cannot_tile() -> None:
    assert mma_supported(4096, 128, 4) and mma_supported(4096, 4096, 8)
    assert not mma_supported(4096, 8, 4)  # a dot of 16 rows would span two groups
    qweight, scales, zeros = weights(16, 256, 4, 128, torch.float32, False)
    with pytest.raises(ValueError, match="split_k"):
        w4a16_mma(torch.zeros(20, 256, device=DEVICE), qweight, scales, zeros, 4, MmaGemmConfig(split_k=3))


def test_auto_split_k_fills_the_sms_with_whole_tiles() -> None:
    # Qwen3-8B at M = 64, 64 x 128 tiles, 2 programs per SM on 132 SMs: qkv 48 tiles x 8 splits,
    # gate_up 192 tiles alone, down (96 pack tiles) 32 x 12
    assert auto_split_k(48, 32, 132, 2) == 8
    assert auto_split_k(192, 32, 132, 2) == 2
    assert auto_split_k(32, 96, 132, 2) == 12
    assert auto_split_k(1, 3, 132, 2) == 1  # nothing divides: no split


def test_dispatch_takes_the_buckets_with_a_shape_above_16_tokens() -> None:
    assert not mma_dispatched(64, 4096, 8, 4)  # groups smaller than a dot: the GEMV / dequantize path
    for bits, buckets in MMA_BUCKETS.items():
        lo = 1
        for top, cfg in buckets:  # M's bucket alone picks the shape: Triton compiles them all at load
            ms = range(max(lo, MMA_MIN_M), top + 1)
            assert all(mma_dispatched(m, 4096, 128, bits) == (cfg is not None) for m in ms), (bits, top)
            if cfg is not None:
                assert len({bucket_config(m, 6144, 4096, bits, 132) for m in ms}) == 1, (bits, top)
            lo = top + 1
        assert not any(mma_dispatched(m, 4096, 128, bits) for m in (*range(1, MMA_MIN_M), lo))


@pytest.mark.parametrize("bits", [4, 8])
def test_dispatched_gemm_takes_leading_dims_and_act_order(bits: int) -> None:
    n, k = 40, 256
    qweight, scales, zeros = weights(n, k, bits, 128, torch.float32, bits == 8)
    perm = torch.randperm(k, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    x = torch.randn(2, 20, k, generator=torch.Generator().manual_seed(4)).to(DEVICE)  # M = 40
    got = int_gemm_mma(x, qweight, scales, zeros, bits, perm, split_counters(n, DEVICE))
    want = int_gemm_ref(x.reshape(40, k), qweight, scales, zeros, bits, perm).reshape(2, 20, n)
    torch.testing.assert_close(got, want, **TOL)


COMPILE = """
import dataclasses, json
from kvpilot.runtime.kernels import w4a16_mma_triton as mm
from kvpilot.runtime.kernels.triton_compile import KernelSpec, compile_kernel

types = {"x_ptr": "*bf16", "qw_ptr": "*i32", "s_ptr": "*bf16", "z_ptr": "*bf16", "out_ptr": "*bf16",
         "ws_ptr": "*fp32", "counter_ptr": "*i32"}
reports = []
for bits, buckets in mm.MMA_BUCKETS.items():
    for top, c in [b for b in buckets if b[1] is not None]:
        consts = {"GROUP": 128 if bits == 4 else 4096, "BITS": bits, "BLOCK_M": c.block_m,
                  "BLOCK_N": c.block_n, "TILE": 128, "MAGIC16": 0x4300 if bits == 4 else 0,
                  "OFFSET": 128.0 if bits == 4 else 0.0, "SWAP": c.swap,
                  "PAIR_ASM": c.pair_asm and bits == 4,
                  "SPLIT_MODE": 3, "PREC": None}
        spec = KernelSpec(f"w{bits}_m{top}", mm._w4_mma_kernel, types, consts, c.num_warps, c.num_stages,
                          ("M", "split_k"))
        reports.append(dataclasses.asdict(compile_kernel(spec, 90)))
print(json.dumps(reports))
"""


def test_dispatched_shapes_compile_for_sm90_without_spilling() -> None:
    """Every bucket's launch shape lowers to Hopper code through the real compiler (no GPU needed):
    no register spills, and the weight / activation loads are software-pipelined (async copies)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", COMPILE], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    reports = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(reports) == sum(c is not None for b in MMA_BUCKETS.values() for _, c in b)
    for r in reports:
        assert (r["stack_bytes"] or 0) <= 32, f"{r['name']} spills registers: {r}"
        assert r["async_copies"] > 0, f"{r['name']}: loads are not pipelined: {r}"


@pytest.mark.gpu
@pytest.mark.parametrize("m", [17, 64, 256])
@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (4096, 12288)])
@pytest.mark.parametrize(
    "config",
    [
        MmaGemmConfig(),
        MmaGemmConfig(swap=True),
        MmaGemmConfig(swap=True, pair_asm=False, num_warps=8),
        MmaGemmConfig(32, 64, swap=True),
        MmaGemmConfig(128, 64, swap=True),
    ],
    ids=["default", "swap", "swap-w8-noasm", "swap-m32-n64", "swap-m128-n64"],
)
def test_qwen3_8b_shapes_bf16(m: int, n: int, k: int, config: MmaGemmConfig) -> None:
    """Qwen3-8B's qkv and down projections, int4 group 128 and int8 per channel, bf16."""
    for bits, group, sym in ((4, 128, False), (8, -1, True)):
        qweight, scales, zeros = weights(n, k, bits, group, torch.bfloat16, sym)
        x = (0.1 * torch.randn(m, k)).to(DEVICE, torch.bfloat16)
        got = w4a16_mma(x, qweight, scales, zeros, bits, config, split_counters(n, DEVICE)).float()
        want = int_gemm_ref(x.float(), qweight, scales.float(), zeros.float(), bits)
        err = (got - want).norm() / want.norm()
        assert float(err) < 1e-2, (bits, m, n, k, float(err))


@pytest.mark.gpu
@pytest.mark.parametrize("m", [17, 32, 48, 64, 100, 128])
@pytest.mark.parametrize(("n", "k"), [(6144, 4096), (4096, 12288)])
def test_dispatched_shapes_bf16(m: int, n: int, k: int) -> None:
    """The buckets' launch shapes (int_gemm_mma, as quant/methods.py calls it) at Qwen3-8B's shapes."""
    for bits, group, sym in ((4, 128, False), (8, -1, True)):
        qweight, scales, zeros = weights(n, k, bits, group, torch.bfloat16, sym)
        x = (0.1 * torch.randn(m, k)).to(DEVICE, torch.bfloat16)
        got = int_gemm_mma(x, qweight, scales, zeros, bits, None, split_counters(n, DEVICE)).float()
        want = int_gemm_ref(x.float(), qweight, scales.float(), zeros.float(), bits)
        err = (got - want).norm() / want.norm()
        assert float(err) < 1e-2, (bits, m, n, k, float(err))
