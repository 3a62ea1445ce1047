"""The kernels a model runs, chosen once per model runner and handed to every layer.

"torch" is the plain-PyTorch references in runtime/kernels (the oracle); "cpu" the same ops rewritten for
serving on a CPU (kernels/cpu.py: batched decode attention, SDPA, oneDNN GEMMs with prepacked weights,
tested against the references); "triton" the GPU kernels. Each entry has the same signature in every set,
so a layer calls its kernel directly: one hop from forward() to the kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.nn.functional as F

KERNEL_SETS = ("torch", "cpu", "triton")


@dataclass(frozen=True)
class KernelOps:
    name: str
    linear: Callable[..., Any]  # (x, weight, bias) -> x W^T + b; also the LM head's GEMM (triton: a GEMV
    #                             at <= kernels/gemv.GEMV_MAX_M rows, cuBLAS above)
    rms_norm: Callable[..., Any]  # (x, weight, eps, residual=None) -> y | (y, x + residual)
    silu_and_mul: Callable[..., Any]  # ([T, 2I]) -> [T, I]
    qkv_prepare: Callable[..., Any]  # fused q/k norm + rotary + K/V store -> q [T, H, D]; (qkv,
    #                   positions, cos_sin, k_cache, v_cache, slots, q_norm, k_norm, eps, *, k_scale, v_scale)
    paged_attention: Callable[..., Any]  # (q, k_cache, v_cache, cu_seqlens_q, context_lens, block_tables,
    #                                      scale, *, max_q_len, k_scale, v_scale) -> [T, H, D]
    # k_scale/v_scale: [num_blocks, block_size, KVH] fp32 for 8-bit caches (kernels/kv_cache.py), else None
    # Decode (<= kernels/gemv.GEMV_MAX_M tokens, float weights, no bias, tp 1): the op before a projection
    # fused into its GEMV ("triton": one kernel; "torch"/"cpu": the same composition as unfused).
    norm_linear: Callable[..., Any]  # (hidden, residual | None, norm_weight, eps, weight) -> (y, h)
    silu_linear: Callable[..., Any]  # (gate_up [T, 2I], weight [N, I]) -> silu(gate) * up @ W^T
    # step_kv: qkv_prepare takes k_to_qkv=True and paged_attention step_kv=(k_rows, v_rows) for
    # prefill steps (PagedAttention.uses_step_kv says which)
    step_kv: bool = False


def torch_ops() -> KernelOps:
    from kvpilot.runtime.kernels.activation import silu_and_mul_ref
    from kvpilot.runtime.kernels.attention import paged_attention_ref
    from kvpilot.runtime.kernels.gemv import norm_linear_ref, silu_linear_ref
    from kvpilot.runtime.kernels.norm import rms_norm_ref
    from kvpilot.runtime.kernels.qkv_prepare import qkv_prepare_ref

    return KernelOps(
        "torch",
        F.linear,
        rms_norm_ref,
        silu_and_mul_ref,
        qkv_prepare_ref,
        paged_attention_ref,
        norm_linear_ref,
        silu_linear_ref,
        step_kv=True,  # the triton set's semantics, so tests can compare the two on 8-bit caches
    )


def cpu_ops() -> KernelOps:
    from kvpilot.runtime.kernels import cpu
    from kvpilot.runtime.kernels.gemv import composed_norm_linear, composed_silu_linear

    return KernelOps(
        "cpu",
        cpu.linear_cpu,
        cpu.rms_norm_cpu,
        cpu.silu_and_mul_cpu,
        cpu.qkv_prepare_cpu,
        cpu.paged_attention_cpu,
        composed_norm_linear(cpu.rms_norm_cpu, cpu.linear_cpu),
        composed_silu_linear(cpu.silu_and_mul_cpu, cpu.linear_cpu),
    )


def triton_ops() -> KernelOps:
    """Imports triton: only called when the runner runs on a GPU (or a test asks for it)."""
    from kvpilot.runtime.kernels.activation_triton import silu_and_mul_triton
    from kvpilot.runtime.kernels.attention_triton import paged_attention_triton
    from kvpilot.runtime.kernels.gemv_dispatch import linear_triton, norm_linear_triton, silu_linear_triton
    from kvpilot.runtime.kernels.norm_triton import rms_norm_triton
    from kvpilot.runtime.kernels.qkv_prepare_triton import qkv_prepare_triton

    return KernelOps(
        "triton",
        linear_triton,
        rms_norm_triton,
        silu_and_mul_triton,
        qkv_prepare_triton,
        paged_attention_triton,
        norm_linear_triton,
        silu_linear_triton,
        step_kv=True,
    )


def kernel_ops(name: str) -> KernelOps:
    if name == "torch":
        return torch_ops()
    if name == "cpu":
        return cpu_ops()
    if name == "triton":
        return triton_ops()
    raise ValueError(f"unknown kernel set {name!r}; choose one of {', '.join(KERNEL_SETS)}")
