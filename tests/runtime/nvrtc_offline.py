"""Offline CUDA C++ compiles for the tests: NVRTC from the nvidia-cuda-nvrtc-cu12 wheel (the dev extras) to
PTX, Triton's bundled ptxas to sm_90 SASS, and the resource report (registers, spills) it prints."""

from __future__ import annotations

import ctypes
import re
import subprocess
from pathlib import Path

import pytest
import triton

PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


def _nvrtc() -> ctypes.CDLL:
    nvrtc = pytest.importorskip("nvidia.cuda_nvrtc", reason="the dev extras install nvidia-cuda-nvrtc-cu12")
    lib = next(Path(next(iter(nvrtc.__path__)), "lib").glob("libnvrtc.so.*"))
    return ctypes.CDLL(str(lib))


def ptx(source: Path, macros: dict[str, int], arch: str = "90") -> bytes:
    """source compiled by NVRTC for compute_<arch> (90, or 90a for wgmma) with -D macros."""
    lib = _nvrtc()
    prog = ctypes.c_void_p()
    assert (
        lib.nvrtcCreateProgram(ctypes.byref(prog), source.read_bytes(), source.name.encode(), 0, None, None)
        == 0
    )
    opts = [f"--gpu-architecture=compute_{arch}".encode(), b"-std=c++17", f"-I{source.parent}".encode()]
    opts += [f"-D{k}={v}".encode() for k, v in macros.items()]
    result = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    assert result == 0, log.value.decode()
    lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
    text = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetPTX(prog, text)
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return text.value


def sm90_resources(code: bytes, tmp_path: Path, arch: str = "90") -> tuple[int, int, str]:
    """(registers, spill-store bytes, ptxas's report) of PTX assembled for sm_<arch> (90 or 90a)."""
    src = tmp_path / "kernel.ptx"
    src.write_bytes(code)
    run = subprocess.run(
        [str(PTXAS), f"-arch=sm_{arch}", "-v", str(src), "-o", str(tmp_path / "kernel.cubin")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    report = run.stdout + run.stderr
    registers = int(re.search(r"Used (\d+) registers", report).group(1))  # type: ignore[union-attr]
    spills = int(re.search(r"(\d+) bytes spill stores", report).group(1))  # type: ignore[union-attr]
    return registers, spills, report
