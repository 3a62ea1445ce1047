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
def compile_cuda(
    source: Path, kernel: str, macros: tuple[tuple[str, int], ...], arch: str | None = None
) -> Any:
    """The loaded `extern "C"` kernel of source built with -D macros (compiled on first use, a fraction of
    a second; memoized per process). Call it as kernel(grid=..., block=..., args=[...]) on the current
    stream: tensors pass as pointers, ints as 32-bit ints. arch: the target (e.g. "90a" for wgmma, which
    only the architecture-specific target has); None: the current device's."""
    options = [f"-D{name}={value}" for name, value in macros] + ["-std=c++17", f"-I{KERNELS}"]
    target = {} if arch is None else {"compute_capability": arch}
    return _compile_fn()(source.read_text(), kernel, nvcc_options=options, **target)


def num_registers(kernel: Any) -> int:
    """Registers per thread of a compiled kernel (cuFuncGetAttribute; bench diagnostics)."""
    from torch.cuda._utils import _get_gpu_runtime_library

    regs = ctypes.c_int()
    _get_gpu_runtime_library().cuFuncGetAttribute(ctypes.byref(regs), 4, kernel.func)  # NUM_REGS
    return regs.value


MAX_DYNAMIC_SHARED_SIZE_BYTES = 8  # CU_FUNC_ATTRIBUTE_*
NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14
PORTABLE_CLUSTER = 8  # CTAs; sm_90 takes up to 16 once the kernel allows it


def set_attribute(kernel: Any, attribute: int, value: int) -> None:
    """cuFuncSetAttribute(kernel, attribute, value) (CU_FUNC_ATTRIBUTE_*), raising on a driver error."""
    from torch.cuda._utils import _get_gpu_runtime_library

    result = _get_gpu_runtime_library().cuFuncSetAttribute(kernel.func, attribute, value)
    if result != 0:
        raise RuntimeError(f"cuFuncSetAttribute failed with CUresult {result}")


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
    set_attribute(kernel, MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)


PREFERRED_SHARED_MEMORY_CARVEOUT = 9  # CU_FUNC_ATTRIBUTE_*: percent of the unified L1 / shared memory


def prefer_carveout(kernel: Any, percent: int) -> None:
    """Ask that SMs running kernel split their unified L1 / shared memory percent% as shared memory (-1: the
    driver's choice). A kernel whose grid must sit beside the next launch's needs the room for both."""
    set_attribute(kernel, PREFERRED_SHARED_MEMORY_CARVEOUT, percent)


def max_active_ctas(kernel: Any, threads: int, shared_mem: int) -> int:
    """CTAs of kernel an SM holds at once with threads each and shared_mem bytes of dynamic shared memory
    (cuOccupancyMaxActiveBlocksPerMultiprocessor)."""
    from torch.cuda._utils import _get_gpu_runtime_library

    count = ctypes.c_int()
    result = _get_gpu_runtime_library().cuOccupancyMaxActiveBlocksPerMultiprocessor(
        ctypes.byref(count), kernel.func, threads, ctypes.c_size_t(shared_mem)
    )
    if result != 0:
        raise RuntimeError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor failed with CUresult {result}")
    return count.value


def allow_cluster(kernel: Any, size: int) -> None:
    """Let kernel launch in clusters of size CTAs: past PORTABLE_CLUSTER the driver wants the kernel's
    consent (CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED)."""
    if size <= PORTABLE_CLUSTER or getattr(kernel, "_non_portable_cluster", False):
        return
    set_attribute(kernel, NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
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


def _launch_config(
    grid: tuple[int, int, int],
    block: tuple[int, int, int],
    shared_mem: int,
    cluster: tuple[int, int, int] | None,
    stream: int,
    pdl: bool = True,
) -> tuple[_LaunchConfig, Any]:
    """A CUlaunchConfig with PDL (pdl) and the cluster dims (if given), and the attribute array it points
    into, which must outlive it."""
    attrs = (_LaunchAttribute * 2)()
    used = 0
    if pdl:
        attrs[used].id, attrs[used].value[0] = PROGRAMMATIC_STREAM_SERIALIZATION, 1
        used += 1
    if cluster is not None:  # the value is the cluster's dims, three unsigned ints
        attrs[used].id = CLUSTER_DIMENSION
        attrs[used].value[0], attrs[used].value[1], attrs[used].value[2] = cluster
        used += 1
    config = _LaunchConfig(
        (ctypes.c_uint * 3)(*grid),
        (ctypes.c_uint * 3)(*block),
        shared_mem,
        ctypes.c_void_p(stream),
        ctypes.cast(attrs, ctypes.POINTER(_LaunchAttribute)),
        used,
    )
    return config, attrs


def max_active_clusters(
    kernel: Any, block: tuple[int, int, int], shared_mem: int, cluster: tuple[int, int, int]
) -> int:
    """How many clusters of this launch the GPU holds at once (cuOccupancyMaxActiveClusters): a cluster's
    CTAs must share a GPC, so a size that does not divide a GPC's CTA slots leaves slots empty, and a grid
    of more clusters than this runs in more than one wave. The kernel must allow shared_mem and the cluster
    size first (allow_shared_memory, allow_cluster)."""
    from torch.cuda._utils import _get_gpu_runtime_library

    config, _attrs = _launch_config(cluster, block, shared_mem, cluster, 0, pdl=False)
    count = ctypes.c_int()
    result = _get_gpu_runtime_library().cuOccupancyMaxActiveClusters(
        ctypes.byref(count), kernel.func, ctypes.byref(config)
    )
    if result != 0:
        raise RuntimeError(f"cuOccupancyMaxActiveClusters failed with CUresult {result}")
    return count.value


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
    config, _attrs = _launch_config(grid, block, shared_mem, cluster, torch.cuda.current_stream().cuda_stream)
    result = _get_gpu_runtime_library().cuLaunchKernelEx(ctypes.byref(config), kernel.func, params, None)
    if result != 0:
        raise RuntimeError(f"cuLaunchKernelEx failed with CUresult {result}")
