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


# where the sources' #include "..." headers are (a patched copy of a source may be elsewhere)
KERNELS = Path(__file__).parent


@functools.cache
def compile_cuda(source: Path, kernel: str, macros: tuple[tuple[str, int], ...]) -> Any:
    """The loaded `extern "C"` kernel of source built with -D macros (compiled on first use, a fraction of
    a second; memoized per process). Call it as kernel(grid=..., block=..., args=[...]) on the current
    stream: tensors pass as pointers, ints as 32-bit ints."""
    options = [f"-D{name}={value}" for name, value in macros] + ["-std=c++17", f"-I{KERNELS}"]
    return _compile_fn()(source.read_text(), kernel, nvcc_options=options)


def num_registers(kernel: Any) -> int:
    """Registers per thread of a compiled kernel (cuFuncGetAttribute; bench diagnostics)."""
    from torch.cuda._utils import _get_gpu_runtime_library

    regs = ctypes.c_int()
    _get_gpu_runtime_library().cuFuncGetAttribute(ctypes.byref(regs), 4, kernel.func)  # NUM_REGS
    return regs.value


MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CU_FUNC_ATTRIBUTE_*
NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14
PORTABLE_CLUSTER = 8  # CTAs; sm_90 takes up to 16 once the kernel allows it


def allow_shared_memory(kernel: Any, nbytes: int) -> None:
    """Let kernel launch with nbytes of dynamic shared memory (past the default 48 KB). The carveout is left
    to the driver: a kernel asking for all of it (CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT 100)
    between kernels that do not made W3 int4 2% slower on the H200 (tenth session)."""
    if nbytes < 48 * 1024:
        return
    if hasattr(kernel, "set_shared_memory_config"):  # torch's launcher checks its record of this
        if getattr(kernel, "_max_shared_mem_bytes", 0) < nbytes:  # only ever raised: once per size at most
            kernel.set_shared_memory_config(nbytes)
        return
    from torch.cuda._utils import _get_gpu_runtime_library

    result = _get_gpu_runtime_library().cuFuncSetAttribute(kernel.func, MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)
    if result != 0:
        raise RuntimeError(f"cuFuncSetAttribute failed with CUresult {result}")


def allow_cluster(kernel: Any, size: int) -> None:
    """Let kernel launch in clusters of size CTAs: past PORTABLE_CLUSTER the driver wants the kernel's
    consent (CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED)."""
    if size <= PORTABLE_CLUSTER or getattr(kernel, "_non_portable_cluster", False):
        return
    from torch.cuda._utils import _get_gpu_runtime_library

    result = _get_gpu_runtime_library().cuFuncSetAttribute(kernel.func, NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
    if result != 0:
        raise RuntimeError(f"cuFuncSetAttribute failed with CUresult {result}")
    kernel._non_portable_cluster = True  # once per loaded kernel


class _LaunchAttribute(ctypes.Structure):  # CUlaunchAttribute: an id, padding to 8, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_int * 16)]


class _LaunchConfig(ctypes.Structure):  # CUlaunchConfig
    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared_mem", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_LaunchAttribute)),
        ("num_attrs", ctypes.c_uint),
    ]


PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_*
CLUSTER_DIMENSION = 4


def launch_pdl(
    kernel: Any,
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    args: list[Any],
    shared_mem: int = 0,
    cluster: tuple[int, int, int] | None = None,
) -> None:
    """kernel(grid, block, args) on the current stream with programmatic dependent launch (sm_90+): it may
    start while its predecessor drains, and must `griddepcontrol.wait` before reading what that wrote.
    torch's launcher (cuLaunchKernel) takes no attributes, so this calls cuLaunchKernelEx. Tensors pass as
    pointers, ints as 32-bit ints (as kernel(...) does). cluster: thread block cluster dims (sm_90)."""
    from torch.cuda._utils import _get_gpu_runtime_library

    values = [ctypes.c_void_p(a.data_ptr()) if isinstance(a, torch.Tensor) else ctypes.c_int(a) for a in args]
    params = (ctypes.c_void_p * len(values))(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p) for v in values])
    attrs = (_LaunchAttribute * 2)()
    attrs[0].id, attrs[0].value[0] = PROGRAMMATIC_STREAM_SERIALIZATION, 1
    if cluster is not None:  # the value is the cluster's dims, three unsigned ints
        attrs[1].id = CLUSTER_DIMENSION
        attrs[1].value[0], attrs[1].value[1], attrs[1].value[2] = cluster
    config = _LaunchConfig(
        (ctypes.c_uint * 3)(*grid),
        (ctypes.c_uint * 3)(*block),
        shared_mem,
        ctypes.c_void_p(torch.cuda.current_stream().cuda_stream),
        ctypes.cast(attrs, ctypes.POINTER(_LaunchAttribute)),
        1 if cluster is None else 2,
    )
    result = _get_gpu_runtime_library().cuLaunchKernelEx(ctypes.byref(config), kernel.func, params, None)
    if result != 0:
        raise RuntimeError(f"cuLaunchKernelEx failed with CUresult {result}")
