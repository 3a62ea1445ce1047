"""W8A8 int8 checkpoints (compressed-tensors int-quantized: int8 weights with one symmetric scale per
output channel, int8 activations per token), run as their authors meant: W8A8 above decode sizes, on the
int8 tensor cores (kernels/int8_gemm_triton.py), and weight-only at decode sizes, where the weight stream is
the whole cost and 16-bit activations are more accurate.

The weight stays as the checkpoint stores it, int8 [N, K] with scales [N]: the layout of a per-channel fp8
weight, so everything but the W8A8 GEMM is Fp8Method's (loading, fused shards, the decode GEMV with its
norm and SiLU prologues, whose loads convert any 8-bit type). The CPU and the torch kernel set run the
references (quant_reference.fp8_weight_only_ref at decode sizes, int8_gemm_ref above).
"""

from __future__ import annotations

import torch
from kvpilot.runtime.errors import ModelLoadError
from kvpilot.runtime.kernels.quant_reference import int8_gemm_ref, quantize_int8_rows_ref
from kvpilot.runtime.layers.linear import Linear
from kvpilot.runtime.quant.config import QuantConfig
from kvpilot.runtime.quant.fp8_method import Fp8Method


def takes_int8_activations(quant: QuantConfig) -> bool:
    """Whether a checkpoint's int8 activations are honoured (Int8ChannelMethod): int8 weights stored
    unpacked with one symmetric scale per output channel, which the int8 GEMM's epilogue applies. Others
    (W4A8, group scales, zero points) run weight-only through IntWeightMethod, with 16-bit activations."""
    return (
        quant.int8_activations
        and quant.bits == 8
        and quant.group_size == -1
        and quant.sym
        and quant.packing == "compressed-tensors-unpacked"
        and not quant.desc_act
    )


class Int8ChannelMethod(Fp8Method):
    """int8 [N, K] weights, float32 scales [N]: weight-only GEMV at decode sizes, W8A8 int8 above."""

    format_name = "W8A8 int8"
    checkpoint_dtype = torch.int8
    # static activation scales and zero points: read and left unused (activations are scaled per token);
    # weight_zero_point: older compressed-tensors versions write it for symmetric weights too, all zero
    unused_suffixes = ("input_scale", "input_zero_point", "weight_zero_point")

    def _require_device(self, device: torch.device) -> None:
        """int8 tensor cores: every GPU this runtime runs on (sm80+), and the CPU runs the references."""

    def _quantize(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Dummy weights of this format (benchmarks): round-to-nearest per output channel."""
        return quantize_int8_rows_ref(weight)

    def _checkpoint_shard(self, t: dict[str, torch.Tensor], rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        zero_point = t.get("weight_zero_point")
        if zero_point is not None and bool(zero_point.any()):
            raise ModelLoadError(
                "weight_zero_point holds nonzero values, but config.json quantization_config says the "
                "weights are symmetric (config_groups.*.weights.symmetric true)"
            )
        return super()._checkpoint_shard(t, rows)

    def finish(self, layer: Linear) -> None:
        super().finish(layer)
        if self.use_scaled_mm and self.backend == "triton":  # compile the W8A8 launch shapes now
            from kvpilot.runtime.kernels.int8_gemm_triton import warm_up_int8_linear

            warm_up_int8_linear(self.weight, self.weight_scale, self.dtype)

    def _w8a8(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if not (self.use_scaled_mm and self.backend == "triton"):
            return int8_gemm_ref(x, self.weight, self.weight_scale, bias)
        from kvpilot.runtime.kernels.int8_gemm_triton import int8_linear

        return int8_linear(x, self.weight, self.weight_scale, bias)
