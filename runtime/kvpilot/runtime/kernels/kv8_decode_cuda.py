"""Host side of kv8_decode.cu: paged decode attention over 8-bit pages on mma.sync (sm_89+, CUDA only).

The kernel is compiled at run time by NVRTC (nvrtc.py), once per CudaDecodeSpec, and launched with the grid
and outputs of decode_attention_triton._decode_kernel, so split plans reuse its reduce kernel. The CPU
interpreter cannot run it: decode_attention_triton keeps the Triton kernels as the portable path, and
tests/runtime's gpu tests hold this one to the same reference.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .decode_plan import DecodePlan, MmaPath
from .nvrtc import compile_cuda

SOURCE = Path(__file__).with_name("kv8_decode.cu")
HEAD_DIMS = (64, 128)
MAX_GROUP = 8  # query heads per KV head: the mma's rows 0..7


@dataclass(frozen=True)
class CudaDecodeSpec:
    """The compile-time constants of one kv8_decode.cu build."""

    head_dim: int
    group: int
    kv_heads: int  # the cache's (its strides are compile-time constants)
    page: int
    int8: bool
    bf16: bool
    split: bool
    warps: int = 4
    min_blocks: int = 1
    prefetch: bool = True

    def macros(self) -> dict[str, int]:
        return {
            "HEAD_DIM": self.head_dim,
            "GROUP": self.group,
            "KVH": self.kv_heads,
            "PAGE": self.page,
            "KV_INT8": int(self.int8),
            "OUT_BF16": int(self.bf16),
            "SPLIT": int(self.split),
            "WARPS": self.warps,
            "MIN_BLOCKS": self.min_blocks,
            "PREFETCH": int(self.prefetch),
        }


def unsupported(q: torch.Tensor, k_cache: torch.Tensor, *caches: torch.Tensor) -> str | None:
    """Why this kernel cannot run these tensors (None: it can). caches: k_cache's companions (v_cache and
    the scales), which must be contiguous like it."""
    if q.device.type != "cuda" or torch.version.cuda is None:
        return "needs a CUDA device"
    if torch.cuda.get_device_capability(q.device) < (8, 9):
        return "needs sm_89+ (e4m3 conversions)"
    if k_cache.dtype not in (torch.int8, torch.float8_e4m3fn):
        return f"cache dtype {k_cache.dtype}"
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"activations {q.dtype}"
    head_dim, page, kv_heads = q.shape[2], k_cache.shape[1], k_cache.shape[2]
    if head_dim not in HEAD_DIMS or q.stride(2) != 1:
        return f"head_dim {head_dim} (supported: {HEAD_DIMS}, contiguous)"
    if q.data_ptr() % 4 or q.stride(0) % 2 or q.stride(1) % 2:
        return "q must be 4-byte aligned per head (the kernel reads it in pairs)"
    if not all(t.is_contiguous() for t in (k_cache, *caches)):
        return "caches and scales must be contiguous (the kernel's strides are compile-time constants)"
    if page % 16:
        return f"page size {page} (a multiple of 16)"
    if q.shape[1] % kv_heads or q.shape[1] // kv_heads > MAX_GROUP:
        return f"{q.shape[1]} query heads over {kv_heads} KV heads (at most {MAX_GROUP} per KV head)"
    return None


def compiled(spec: CudaDecodeSpec) -> Any:
    """The loaded kernel for spec (nvrtc.compile_cuda: compiled on first use, memoized)."""
    return compile_cuda(SOURCE, "kv8_decode", tuple(spec.macros().items()))


def _f32_bits(x: float) -> int:
    """x as the int32 of its float32 bits (the launcher passes Python floats as doubles or floats, by
    torch version; an int is unambiguous)."""
    return struct.unpack("<i", struct.pack("<f", x))[0]


def launch(
    spec: CudaDecodeSpec,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    out: torch.Tensor,
    part_out: torch.Tensor,
    part_lse: torch.Tensor,
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    qk_scale: float,  # softmax scale * log2(e)
    partition_size: int,
    num_splits: int,
    block_n: int,  # the tile partitions are rounded to (the reduce kernel's BLOCK_N)
) -> None:
    """One launch on the current stream (CUDA-graph capturable once compiled: compile before capture)."""
    num_seqs, num_heads = q.shape[0], q.shape[1]
    kernel = compiled(spec)
    args = [
        q, k_cache.view(torch.uint8), v_cache.view(torch.uint8), k_scale, v_scale, out, part_out, part_lse,
        context_lens, block_tables, _f32_bits(qk_scale), partition_size, num_splits, block_n, num_heads,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), block_tables.stride(0),
    ]  # fmt: skip
    kernel(grid=(num_splits, k_cache.shape[2], num_seqs), block=(spec.warps * 32, 1, 1), args=args)


def launch_plan(
    mma: MmaPath,
    plan: DecodePlan,
    q: torch.Tensor,
    cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None],  # k, v, scales
    out: torch.Tensor,
    partials: tuple[torch.Tensor, torch.Tensor],  # split plans' part_out, part_lse
    context_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    block_n: int,  # the tile plan's partitions are rounded to (as the caller's reduce kernel's BLOCK_N)
) -> None:
    """Launch plan's main kernel (the caller checked unsupported() and runs the split reduce)."""
    k_cache, v_cache, k_scale, v_scale = cache
    if k_scale is None or v_scale is None:
        raise ValueError("kv8_decode.cu reads 8-bit caches with their scales")
    spec = CudaDecodeSpec(
        head_dim=q.shape[2], group=q.shape[1] // k_cache.shape[2], kv_heads=k_cache.shape[2],
        page=k_cache.shape[1], int8=k_cache.dtype == torch.int8, bf16=q.dtype == torch.bfloat16,
        split=plan.num_splits > 1, warps=mma.warps, min_blocks=mma.min_blocks, prefetch=mma.prefetch,
    )  # fmt: skip
    launch(
        spec, q, k_cache, v_cache, k_scale, v_scale, out, *partials, context_lens, block_tables,
        scale * math.log2(math.e), plan.partition_size, plan.num_splits, block_n,
    )  # fmt: skip
