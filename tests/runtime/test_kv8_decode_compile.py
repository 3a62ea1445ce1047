"""kv8_decode.cu compiles, without a GPU, for sm_90 at every spec the runtime launches by default, within the
register budget its plans assume (<= 128 per thread: four 4-warp programs per SM, plan_mma's wave).

NVRTC comes from the nvidia-cuda-nvrtc-cu12 wheel (installed by the dev extras), ptxas from Triton's bundle;
the kernel's numerics run in the gpu tests (test_kv8_decode_cuda.py) and on the H200.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kvpilot.runtime.kernels.decode_plan import MmaPath
from kvpilot.runtime.kernels.kv8_decode_cuda import SOURCE, CudaDecodeSpec

from tests.runtime.nvrtc_offline import ptx, sm90_resources

MAX_SPILL_BYTES = 16  # e4m3 at 128 registers: 4-8 bytes with CUDA 12.9 (the H200's NVRTC 13: 128 registers)
DEFAULT = MmaPath()
SPECS = [
    CudaDecodeSpec(
        head_dim,
        group,
        kv_heads,
        16,
        int8=int8,
        bf16=True,
        split=split,
        warps=DEFAULT.warps,
        min_blocks=DEFAULT.min_blocks,
        prefetch=DEFAULT.prefetch,
    )
    for head_dim, group, kv_heads in ((128, 4, 8), (64, 3, 3))  # Qwen3-8B, SmolLM2-135M
    for int8 in (True, False)
    for split in (False, True)
]


def _id(s: CudaDecodeSpec) -> str:
    return f"d{s.head_dim}-g{s.group}-{'int8' if s.int8 else 'e4m3'}-{'split' if s.split else 'single'}"


@pytest.mark.parametrize("spec", SPECS, ids=_id)
def test_default_specs_fit_four_programs_per_sm(spec: CudaDecodeSpec, tmp_path: Path) -> None:
    registers, spills, report = sm90_resources(ptx(SOURCE, spec.macros()), tmp_path)
    assert registers <= 128, report
    assert spills <= MAX_SPILL_BYTES, report


def test_fp16_activations_and_other_shapes_compile(tmp_path: Path) -> None:
    for spec in (
        CudaDecodeSpec(128, 1, 8, 32, int8=True, bf16=False, split=True),
        CudaDecodeSpec(64, 8, 2, 32, int8=False, bf16=False, split=False, warps=2, prefetch=True),
    ):
        assert sm90_resources(ptx(SOURCE, spec.macros()), tmp_path)[0] > 0
