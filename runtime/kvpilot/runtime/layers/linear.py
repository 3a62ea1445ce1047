"""Dense projections. A fused projection (q|k|v, gate|up) is one weight made of row shards that the
loader fills from the checkpoint's separate tensors, so the GPU path runs one GEMM instead of several.
The GEMM comes from the runner's kernel set (cuBLAS on GPU).

Quantized weights plug in through a LinearMethod (kvpilot.runtime.quant): it replaces the float `weight`
with its own tensors, receives each checkpoint tensor of the layer (`load(layer, suffix, tensor, shard)`,
suffix = weight/qweight/qzeros/scales/g_idx/weight_scale/...), repacks them into its kernel's layout in
`finish`, and runs the GEMM in `apply`. Models build the same Linear for every format.
"""

from __future__ import annotations

from typing import Protocol

import torch
from kvpilot.runtime.distributed.sharding import TensorSplit
from kvpilot.runtime.layers.kernel_ops import KernelOps
from torch import nn


class LinearMethod(Protocol):
    """How a quantized Linear holds, loads and multiplies its weight."""

    required_suffixes: tuple[str, ...]  # checkpoint tensors every shard needs (the bias aside)
    optional_suffixes: tuple[str, ...]  # tensors read when present (e.g. GPTQ g_idx, fp8 input_scale)
    # tensor parallel: a row-parallel rank's input columns when the loader hands it whole rows (int8/fp8
    # quantized at load: scales over whole rows), else None
    input_split: TensorSplit | None

    def create_weights(self, layer: Linear) -> None: ...
    def load(self, layer: Linear, suffix: str, tensor: torch.Tensor, shard: int | None) -> None: ...
    def init_dummy(self, layer: Linear, generator: torch.Generator) -> None: ...
    def finish(self, layer: Linear) -> None: ...
    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor: ...

    # The decode entries (Linear.norm_linear / silu_linear; bias-free layers): `fuses` says the method has
    # them; each returns None where it has no fused kernel for the call (the layer then runs the ops apart).
    fuses: bool

    def apply_norm(
        self,
        layer: Linear,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        norm_weight: torch.Tensor,
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor] | None: ...
    def apply_silu(self, layer: Linear, gate_up: torch.Tensor) -> torch.Tensor | None: ...


class Linear(nn.Module):
    """y = x W^T (+ b). shard_sizes: output rows of each fused part, in order (one part when not fused)."""

    def __init__(
        self, in_features: int, shard_sizes: tuple[int, ...] | int, ops: KernelOps, *, bias: bool = False
    ) -> None:
        super().__init__()
        self.shard_sizes = (shard_sizes,) if isinstance(shard_sizes, int) else tuple(shard_sizes)
        self.in_features = in_features
        out_features = sum(self.shard_sizes)
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self._op = ops.linear
        self._ops = ops
        # the slice of each fused part's checkpoint weight this tensor-parallel rank holds (None: all of
        # it); set by the parallel subclasses in parallel_linear.py
        self.weight_splits: tuple[TensorSplit | None, ...] = (None,) * len(self.shard_sizes)
        self.quant_method: LinearMethod | None = None  # None: the float weight above

    def checkpoint_split(self, param: str, shard: int | None) -> TensorSplit | None:
        """The slice of checkpoint tensor `param` ("weight"/"bias") of part `shard` this rank loads. A
        bias follows the weight's output rows; a split along the input (dim 1) leaves the bias whole."""
        split = self.weight_splits[shard or 0]
        return None if param == "bias" and split is not None and split.dim != 0 else split

    def set_quant_method(self, method: LinearMethod) -> None:
        """Replace the float weight by the method's tensors (before the model is materialised)."""
        del self.weight
        self.quant_method = method
        method.create_weights(self)

    def shard_rows(self, shard: int) -> slice:
        """The rows of the fused weight that hold part `shard`."""
        start = sum(self.shard_sizes[:shard])
        return slice(start, start + self.shard_sizes[shard])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matmul(x, self.bias)

    @property
    def fusable(self) -> bool:
        """Whether norm_linear / silu_linear take this projection: no bias, and a float weight or a quant
        method with the fused entries."""
        return self.bias is None and (self.quant_method is None or self.quant_method.fuses)

    def norm_linear(
        self, hidden: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(rmsnorm(h) W^T, h), h = hidden + residual (hidden without one), for any weight format: one
        fused GEMV where the kernel set (float weights) or the quant method has one, else RMSNorm and the
        GEMM apart. Decode steps of one rank only (no all-reduce, no bias)."""
        method = self.quant_method
        if method is None:
            return self._ops.norm_linear(hidden, residual, norm_weight, eps, self.weight)
        fused = method.apply_norm(self, hidden, residual, norm_weight, eps)
        if fused is not None:
            return fused
        if residual is None:
            return self.matmul(self._ops.rms_norm(hidden, norm_weight, eps), None), hidden
        normed, h = self._ops.rms_norm(hidden, norm_weight, eps, residual)
        return self.matmul(normed, None), h

    def silu_linear(self, gate_up: torch.Tensor) -> torch.Tensor:
        """(silu(gate) * up) W^T of gate_up [T, 2I], as norm_linear: fused where a kernel has it."""
        method = self.quant_method
        if method is None:
            return self._ops.silu_linear(gate_up, self.weight)
        fused = method.apply_silu(self, gate_up)
        return fused if fused is not None else self.matmul(self._ops.silu_and_mul(gate_up), None)

    def matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x W^T + bias through the float GEMM or the quant method (parallel subclasses pick the bias)."""
        if self.quant_method is None:
            return self._op(x, self.weight, bias)
        return self.quant_method.apply(self, x, bias)
