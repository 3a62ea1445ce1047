"""CUDA C++ kernels compiled at run time by NVRTC (torch's `compile_kernel`: CUDA builds of torch ship
NVRTC, so no CUDA toolkit is needed where the runtime runs), loaded once per source and macro set."""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path
from typing import Any

import torch


def _compile_fn() -> Any:
    fn = getattr(torch.cuda, "compile_kernel", None) or getattr(torch.cuda, "_compile_kernel", None)
    if fn is None:
        raise RuntimeError(f"torch {torch.__version__} has no torch.cuda.compile_kernel (NVRTC)")
    return fn


@functools.cache
def compile_cuda(source: Path, kernel: str, macros: tuple[tuple[str, int], ...]) -> Any:
    """The loaded `extern "C"` kernel of source built with -D macros (compiled on first use, a fraction of
    a second; memoized per process). Call it as kernel(grid=..., block=..., args=[...]) on the current
    stream: tensors pass as pointers, ints as 32-bit ints."""
    options = [f"-D{name}={value}" for name, value in macros] + ["-std=c++17"]
    return _compile_fn()(source.read_text(), kernel, nvcc_options=options)


def num_registers(kernel: Any) -> int:
    """Registers per thread of a compiled kernel (cuFuncGetAttribute; bench diagnostics)."""
    from torch.cuda._utils import _get_gpu_runtime_library

    regs = ctypes.c_int()
    _get_gpu_runtime_library().cuFuncGetAttribute(ctypes.byref(regs), 4, kernel.func)  # NUM_REGS
    return regs.value
