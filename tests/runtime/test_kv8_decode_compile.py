"""kv8_decode.cu compiles, without a GPU, for sm_90 at every spec the runtime launches by default, within the
register budget its plans assume (<= 128 per thread: four 4-warp programs per SM, plan_mma's wave).

NVRTC comes from the nvidia-cuda-nvrtc-cu12 wheel (installed by the dev extras), ptxas from Triton's bundle;
the kernel's numerics run in the gpu tests (test_kv8_decode_cuda.py) and on the H200.
"""

from __future__ import annotations

import ctypes
import re
import subprocess
from pathlib import Path

import pytest
import triton
from kvpilot.runtime.kernels.decode_plan import MmaPath
from kvpilot.runtime.kernels.kv8_decode_cuda import SOURCE, CudaDecodeSpec

PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
MAX_SPILL_BYTES = 16  # e4m3 at 128 registers: 4-8 bytes with CUDA 12.9 (the H200's NVRTC 13: 128 registers)


def _nvrtc() -> ctypes.CDLL:
    nvrtc = pytest.importorskip("nvidia.cuda_nvrtc", reason="the dev extras install nvidia-cuda-nvrtc-cu12")
    lib = next(Path(next(iter(nvrtc.__path__)), "lib").glob("libnvrtc.so.*"))
    return ctypes.CDLL(str(lib))


def _ptx(spec: CudaDecodeSpec) -> bytes:
    lib = _nvrtc()
    prog = ctypes.c_void_p()
    assert (
        lib.nvrtcCreateProgram(ctypes.byref(prog), SOURCE.read_bytes(), b"kv8_decode.cu", 0, None, None) == 0
    )
    opts = [b"--gpu-architecture=compute_90", b"-std=c++17"]
    opts += [f"-D{k}={v}".encode() for k, v in spec.macros().items()]
    result = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    assert result == 0, log.value.decode()
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, ptx)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx.value


def _ptxas(ptx: bytes, tmp_path: Path) -> str:
    src = tmp_path / "kv8.ptx"
    src.write_bytes(ptx)
    run = subprocess.run(
        [str(PTXAS), "-arch=sm_90", "-v", str(src), "-o", str(tmp_path / "kv8.cubin")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout + run.stderr


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
    report = _ptxas(_ptx(spec), tmp_path)
    registers = int(re.search(r"Used (\d+) registers", report).group(1))  # type: ignore[union-attr]
    spills = int(re.search(r"(\d+) bytes spill stores", report).group(1))  # type: ignore[union-attr]
    assert registers <= 128, report
    assert spills <= MAX_SPILL_BYTES, report


def test_fp16_activations_and_other_shapes_compile(tmp_path: Path) -> None:
    for spec in (
        CudaDecodeSpec(128, 1, 8, 32, int8=True, bf16=False, split=True),
        CudaDecodeSpec(64, 8, 2, 32, int8=False, bf16=False, split=False, warps=2, prefetch=True),
    ):
        assert "Used" in _ptxas(_ptx(spec), tmp_path)
