"""Small host-side helpers shared by the Triton kernel wrappers (no kernels here)."""

from __future__ import annotations

import functools
import os
import sys

import torch

# H200 (and H100 SXM) multiprocessor count; used when no CUDA device can be asked (the CPU interpreter).
DEFAULT_NUM_SMS = 132


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


@functools.lru_cache(maxsize=16)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """Multiprocessor count of `device`; DEFAULT_NUM_SMS off CUDA (interpreter runs)."""
    if device.type != "cuda":
        return DEFAULT_NUM_SMS
    return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())


def require_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    """Kernels take strides for every dim but the last, which must be dense (vector loads)."""
    if t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension, got strides {tuple(t.stride())}")


def require_same_device(**tensors: torch.Tensor) -> torch.device:
    devices = {t.device for t in tensors.values()}
    if len(devices) != 1:
        names = ", ".join(f"{k}={v.device}" for k, v in tensors.items())
        raise ValueError(f"tensors must share one device, got {names}")
    return devices.pop()


def interpret_without_gpu() -> bool:
    """Switch Triton to its CPU interpreter when no CUDA device exists (tests, CI); returns whether it did.

    Triton decides at @triton.jit decoration time (its own standard library included) whether a kernel
    is compiled or interpreted, so this must run before the first `import triton` in the process.
    """
    if torch.cuda.is_available():
        return False
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError(
            "triton was imported before TRITON_INTERPRET=1 was set, so its kernels cannot be interpreted on "
            "CPU: export TRITON_INTERPRET=1 (or set it before anything imports triton) when there is no GPU"
        )
    os.environ["TRITON_INTERPRET"] = "1"
    return True


def scale_launch_args(
    k_cache: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, int, int, int]:
    """(k_scale, v_scale, stride block, stride slot, stride head) for an attention kernel; without scales
    (16-bit caches) the cache itself stands in for the pointers, unread by the SCALED=False kernels."""
    if k_scale is None or v_scale is None:
        return k_cache, k_cache, 0, 0, 0
    sb, ss, sh = k_scale.stride()
    return k_scale, v_scale, sb, ss, sh


@functools.lru_cache(maxsize=16)
def _cuda_major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch (Hopper and newer): a kernel launched with launch_pdl=True may start
    while its predecessor drains, once every program of that one has called gdc_launch_dependents; it must
    call gdc_wait before reading or writing anything its predecessors touch."""
    if device.type != "cuda":
        return False
    return _cuda_major(device.index if device.index is not None else torch.cuda.current_device()) >= 9


def pdl_launch(enabled: bool) -> dict[str, bool]:
    """The launch keyword of a kernel with a PDL constexpr (pdl_supported decides `enabled`)."""
    return {"launch_pdl": True} if enabled else {}
