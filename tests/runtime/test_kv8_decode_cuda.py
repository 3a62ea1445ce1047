"""kv8_decode.cu, the mma.sync decode kernel for 8-bit pages (DecodeConfig.mma), against the reference on
the dequantized cache: single pass and split-KV, ragged contexts (chunks that end inside a page), padding
rows, GQA groups of 1-8, head_dim 64 and 128, pages of 16 and 32, bf16 and fp16 activations, every warp
count and both loading schemes, and inside a CUDA graph. The GPU tests' batches are small, so they set
min_programs=1 (the default sends batches of < 32 (sequence, KV head) pairs to the Triton kernels).

int8 caches quantize q per head to int8 for the QK dot (as the Triton kernel's native path: the error is
q's rounding, bounded by QK_NATIVE_TOL); e4m3 caches widen K exactly, so they get the 16-bit tolerance.
On CPU only the fallback runs: a config that selects the kernel still decodes, through the Triton kernels.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from kvpilot.runtime.kernels.triton_utils import interpret_without_gpu

INTERPRET = interpret_without_gpu()  # before anything imports triton

from kvpilot.runtime.kernels.decode_attention_triton import DecodePlan, default_decode_config  # noqa: E402
from kvpilot.runtime.kernels.decode_plan import MmaPath  # noqa: E402

from tests.runtime.test_kv_cache_8bit import EIGHT_BIT, IDS, TOL, _ref, quantized_batch  # noqa: E402
from tests.runtime.test_kv_cache_8bit_decode_variants import QK_NATIVE_TOL, _decode  # noqa: E402

gpu = pytest.mark.gpu


def _check(b: dict[str, torch.Tensor], dtype: torch.dtype, mma: MmaPath, plan: DecodePlan | None) -> None:
    out = _decode(b, replace(default_decode_config(dtype), mma=mma), plan).float()
    ref = _ref({**b, "q": b["q"].float()}, b["q"].shape[-1] ** -0.5)
    assert torch.isfinite(out).all()
    if dtype == torch.int8:
        err = (out - ref).abs().max().item()
        assert err < QK_NATIVE_TOL[dtype], err
    else:
        torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


def test_cpu_falls_back_to_the_triton_kernels() -> None:
    """A config selecting the mma kernel still decodes where it cannot run (here: no CUDA device)."""
    if not INTERPRET:
        pytest.skip("the fallback is the CPU path")
    from kvpilot.runtime.kernels.kv8_decode_cuda import unsupported

    b = quantized_batch([37, 5], [1, 1], 8, 2, 32, 16, torch.int8, seed=31)
    assert unsupported(b["q"], b["k_cache"]) == "needs a CUDA device"
    out = _decode(b, replace(default_decode_config(torch.int8), block_n=16, mma=MmaPath()), DecodePlan(1, 48))
    torch.testing.assert_close(out, _ref(b, 32**-0.5), **TOL)


def test_plan_fills_one_wave_of_programs() -> None:
    """plan_mma: one pass per (sequence, KV head) from one wave (4 programs x SMs) on; below, splits that
    fill the wave, never under MMA_MIN_PARTITION positions; split_plans=False: one pass always."""
    from kvpilot.runtime.kernels.decode_plan import MMA_MIN_PARTITION, plan_mma

    mma = MmaPath()
    assert plan_mma(64, 8, 4096, 132, mma) == DecodePlan(1, 4096, block_n=16)
    assert plan_mma(256, 8, 1030, 132, mma) == DecodePlan(1, 1040, block_n=16)
    assert plan_mma(16, 8, 8192, 132, mma) == DecodePlan(4, MMA_MIN_PARTITION, block_n=16)
    assert plan_mma(1, 8, 4096, 132, mma).num_splits == 4096 // MMA_MIN_PARTITION
    assert plan_mma(1, 8, 100, 132, mma).num_splits == 1
    assert plan_mma(16, 8, 8192, 132, MmaPath(split_plans=False)).num_splits == 1


def test_small_batches_keep_the_triton_kernels() -> None:
    assert not MmaPath().runs(1, 8) and not MmaPath().runs(2, 8)
    assert MmaPath().runs(4, 8) and MmaPath().runs(256, 8)
    assert MmaPath(min_programs=1).runs(1, 1)


def test_spec_macros_name_every_constant() -> None:
    from kvpilot.runtime.kernels.kv8_decode_cuda import SOURCE, CudaDecodeSpec

    macros = CudaDecodeSpec(128, 4, 8, 16, int8=True, bf16=True, split=False).macros()
    source = SOURCE.read_text()
    assert all(name in source for name in macros)
    assert macros["KV_INT8"] == 1 and macros["SPLIT"] == 0 and macros["WARPS"] == 4


CTX = [1000, 37, 16, 1, 515, 2049]


@gpu
@pytest.mark.parametrize("dtype", EIGHT_BIT, ids=IDS)
@pytest.mark.parametrize(
    "mma",
    [
        MmaPath(min_programs=1),
        MmaPath(warps=2, prefetch=True, min_blocks=1, min_programs=1),
        MmaPath(warps=8, min_blocks=2, min_programs=1),
        MmaPath(warps=1, min_programs=1),
    ],
    ids=str,
)
@pytest.mark.parametrize("plan", [None, DecodePlan(1, 2112), DecodePlan(3, 128), DecodePlan(8, 64)], ids=str)
def test_qwen3_8b_heads(dtype: torch.dtype, mma: MmaPath, plan: DecodePlan | None) -> None:
    b = quantized_batch(CTX, [1] * len(CTX), 32, 8, 128, 16, dtype, seed=32, act_dtype=torch.bfloat16)
    _check(b, dtype, mma, plan)


@gpu
@pytest.mark.parametrize("dtype", EIGHT_BIT, ids=IDS)
@pytest.mark.parametrize("act", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(
    ("heads", "kv_heads", "head_dim", "page"), [(9, 3, 64, 16), (8, 8, 128, 32), (16, 2, 64, 32)]
)
def test_other_shapes(
    dtype: torch.dtype, act: torch.dtype, heads: int, kv_heads: int, head_dim: int, page: int
) -> None:
    b = quantized_batch(CTX, [1] * len(CTX), heads, kv_heads, head_dim, page, dtype, seed=33, act_dtype=act)
    for plan in (None, DecodePlan(4, 128)):
        _check(b, dtype, MmaPath(min_programs=1), plan)


@gpu
@pytest.mark.parametrize("dtype", EIGHT_BIT, ids=IDS)
def test_large_activations_and_zero_context_rows(dtype: torch.dtype) -> None:
    """K/V of magnitude 300 (e4m3's codes and fp16's ranges both stressed) and padding rows (context 0,
    as a CUDA graph's unused slots), which must come out zero, not NaN."""
    b = quantized_batch([300, 1, 77], [1, 1, 1], 32, 8, 128, 16, dtype, seed=34, magnitude=300.0,
                        act_dtype=torch.bfloat16)  # fmt: skip
    b["q"] = b["q"] / 300.0
    b["context_lens"][1] = 0
    for plan in (None, DecodePlan(3, 64)):
        out = _decode(b, replace(default_decode_config(dtype), mma=MmaPath(min_programs=1)), plan).float()
        assert bool((out[1] == 0).all())
        ref = _ref({**b, "q": b["q"].float()}, 128**-0.5)
        scale = ref.abs().max().item()
        assert (out - ref)[[0, 2]].abs().max().item() < QK_NATIVE_TOL[torch.int8] * scale


@gpu
@pytest.mark.parametrize("dtype", EIGHT_BIT, ids=IDS)
def test_cuda_graph_replays_new_inputs(dtype: torch.dtype) -> None:
    """Captured after one eager call (the NVRTC compile), a graph replays the launch on new q and contexts."""
    b = quantized_batch([700, 64, 1500], [1, 1, 1], 32, 8, 128, 16, dtype, seed=35, act_dtype=torch.bfloat16)
    cfg = replace(default_decode_config(dtype), mma=MmaPath(min_programs=1))
    for plan in (DecodePlan(1, 1536), DecodePlan(4, 64)):
        out = _decode(b, cfg, plan)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = _decode(b, cfg, plan)
        b["q"].copy_(torch.randn_like(b["q"]))
        b["context_lens"].copy_(torch.tensor([650, 3, 1499], dtype=torch.int32))
        graph.replay()
        torch.testing.assert_close(out, _decode(b, cfg, plan), atol=0, rtol=0)
