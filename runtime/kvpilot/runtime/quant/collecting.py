"""What every weight format's LinearMethod shares (the seam in layers/linear.py): checkpoint tensors
collected per (shard, suffix) and shape-checked on arrival, random weights for benchmarks, and no fused
prologues unless the format has them."""

from __future__ import annotations

import torch
from kvpilot.runtime.distributed.sharding import TensorSplit
from kvpilot.runtime.errors import ModelLoadError, UnsupportedModelError
from kvpilot.runtime.layers.linear import Linear
from kvpilot.runtime.quant.config import QuantConfig


class CollectingMethod:
    """Shared by the methods: checkpoint tensors of each (shard, suffix), shape-checked on arrival."""

    required_suffixes: tuple[str, ...] = ("weight",)
    optional_suffixes: tuple[str, ...] = ()
    # apply_norm / apply_silu: quant/fused_gemv.py's kernels at batch-1 decode; none here (the int formats'
    # fused GEMVs lost to the separate ops and were removed: kernels/int_gemv_triton.py), fp8 has them
    fuses = False
    # Tensor parallel (set by the loader on a row-parallel int8/fp8-at-load layer): this rank's input
    # columns; the 16-bit weight arrives with whole rows and is cut after quantizing (quant/tp_split.py)
    input_split: TensorSplit | None = None

    def __init__(self, quant: QuantConfig, dtype: torch.dtype, device: torch.device, backend: str) -> None:
        self.quant, self.dtype, self.device, self.backend = quant, dtype, device, backend
        self.pending: dict[tuple[int, str], torch.Tensor] = {}

    def create_weights(self, layer: Linear) -> None:
        self.pending = {}

    def expected_shape(self, layer: Linear, suffix: str, out: int) -> tuple[int, ...] | None:
        """The shape `suffix` must have for a shard of `out` rows (None: any number of elements)."""
        return (out, self.weight_inputs(layer)) if suffix == "weight" else None

    def weight_inputs(self, layer: Linear) -> int:
        """Columns of an arriving 16-bit weight: the layer's, or the whole rows (input_split)."""
        split = self.input_split
        return layer.in_features if split is None or split.whole is None else split.whole

    def load(self, layer: Linear, suffix: str, tensor: torch.Tensor, shard: int | None) -> None:
        index = shard or 0
        expected = self.expected_shape(layer, suffix, layer.shard_sizes[index])
        if expected is not None and tuple(tensor.shape) != expected:
            raise ModelLoadError(
                f"has shape {tuple(tensor.shape)}, expected {expected} for this config.json "
                f"({self.quant.method}{self._describe()})"
            )
        self.pending[(index, suffix)] = tensor

    def _describe(self) -> str:
        q = self.quant
        if q.fp8_block is not None:
            return f", weight_block_size {list(q.fp8_block)}"
        return f", {q.bits}-bit, group_size {q.group_size}" if q.method in ("awq", "gptq") else ""

    def init_dummy(self, layer: Linear, generator: torch.Generator) -> None:
        """Random float weights quantized like a 16-bit checkpoint at load (benchmarks)."""
        for shard, rows in enumerate(layer.shard_sizes):
            weight = torch.empty(rows, layer.in_features, device=self.device, dtype=self.dtype)
            self.pending[(shard, "weight")] = weight.normal_(0.0, 0.02, generator=generator)

    def shard_tensors(self, layer: Linear) -> list[dict[str, torch.Tensor]]:
        tensors = [
            {suffix: t for (s, suffix), t in self.pending.items() if s == shard}
            for shard in range(len(layer.shard_sizes))
        ]
        self.pending = {}
        return tensors

    def apply_norm(
        self,
        layer: Linear,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        norm_weight: torch.Tensor,
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        return None

    def apply_silu(self, layer: Linear, gate_up: torch.Tensor) -> torch.Tensor | None:
        return None


def require_fp8_gpu(device: torch.device) -> None:
    """fp8 weights run on the CPU (emulated) or a GPU with fp8; refuse any other GPU at start."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        major, minor = torch.cuda.get_device_capability(device)
        raise UnsupportedModelError(
            f"fp8 weights need a GPU with fp8 (compute capability 8.9+: Ada, Hopper, Blackwell); this "
            f"GPU is sm{major}{minor}; use --quantization int8 or int4"
        )
