"""Sizing the KV cache on a GPU: profile the peak of one worst-case step, give the rest to the cache.

The arithmetic is a pure function (tested on CPU); the profile is the only part that touches the device.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from kvpilot.runtime.errors import ModelLoadError


@dataclass(frozen=True)
class MemoryProfile:
    total_bytes: int  # the device's memory
    peak_torch_bytes: int  # this process's peak allocation in the profiled step (weights included)
    non_torch_bytes: int  # used outside PyTorch's allocator: CUDA context, other processes


def kv_cache_blocks(
    profile: MemoryProfile,
    *,
    gpu_memory_utilization: float,
    block_bytes: int,
    blocks_per_seq: int,
    max_model_len: int,
) -> int:
    """Blocks that fit in total * utilization after the step's peak and non-torch memory."""
    budget = (
        int(profile.total_bytes * gpu_memory_utilization) - profile.peak_torch_bytes - profile.non_torch_bytes
    )
    blocks = budget // block_bytes
    if blocks < blocks_per_seq:
        raise ModelLoadError(
            f"not enough GPU memory for the KV cache: {max(budget, 0) / 2**30:.2f} GiB left of "
            f"{profile.total_bytes / 2**30:.1f} GiB at gpu_memory_utilization={gpu_memory_utilization} "
            f"(peak step {profile.peak_torch_bytes / 2**30:.2f} GiB with the weights, "
            f"{profile.non_torch_bytes / 2**30:.2f} GiB outside PyTorch); one sequence of max_model_len="
            f"{max_model_len} needs {blocks_per_seq * block_bytes / 2**30:.2f} GiB"
        )
    return blocks


def profile_peak(device: torch.device, run_worst_step: Callable[[], None]) -> MemoryProfile:
    """Run the worst-case step once and read the allocator's peak. The step must free what it allocates."""
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    run_worst_step()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    non_torch = max(0, (total - free) - torch.cuda.memory_reserved(device))
    return MemoryProfile(total_bytes=total, peak_torch_bytes=peak, non_torch_bytes=non_torch)
