"""fp8 weights with per-tensor or per-channel scales (checkpoints, or quantized at load): a weight-only
GEMV at decode sizes, W8A8 torch._scaled_mm above (quant/fp8_gemm.py), emulated on the CPU."""

from __future__ import annotations

import torch
from kvpilot.runtime.errors import ModelLoadError
from kvpilot.runtime.kernels.quant_reference import FP8_WEIGHT_ONLY_MAX_M, fp8_gemm_ref, fp8_weight_only_ref
from kvpilot.runtime.layers.linear import Linear
from kvpilot.runtime.quant.collecting import CollectingMethod, require_fp8_gpu
from kvpilot.runtime.quant.config import QuantConfig
from kvpilot.runtime.quant.fp8_weight import quantize_fp8_weight
from kvpilot.runtime.quant.tp_split import fp8_columns


class Fp8Method(CollectingMethod):
    """fp8 weights float8_e4m3fn [N, K] with per-output-channel scales [N]: a weight-only GEMV at decode
    sizes, W8A8 (activations quantized per token) above them (quant/fp8_gemm.py)."""

    fuses = True
    format_name = "fp8"
    checkpoint_dtype = torch.float8_e4m3fn  # the weight's dtype in a checkpoint
    # static activation scales: read and left unused (activations are scaled per token)
    unused_suffixes: tuple[str, ...] = ("input_scale",)

    def __init__(self, quant: QuantConfig, dtype: torch.dtype, device: torch.device, backend: str) -> None:
        super().__init__(quant, dtype, device, backend)
        if quant.from_checkpoint:
            self.required_suffixes = ("weight", "weight_scale")
            self.optional_suffixes = self.unused_suffixes
        self.use_scaled_mm = device.type == "cuda"  # the GPU kernels (else the CPU references)
        self._require_device(device)
        self.weight = torch.empty(0)
        self.weight_scale = torch.empty(0)
        self.quantized: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # shard -> (fp8 rows, scales)
        self.dense: torch.Tensor | None = None
        self.counters = torch.empty(0)  # the decode GEMV's split-K counters (GPU)

    def _require_device(self, device: torch.device) -> None:
        require_fp8_gpu(device)

    def _quantize(self, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A 16-bit W [N, K] -> (8-bit [N, K], float32 scales [N])."""
        return quantize_fp8_weight(weight)

    def expected_shape(self, layer: Linear, suffix: str, out: int) -> tuple[int, ...] | None:
        return (out, self.weight_inputs(layer)) if suffix == "weight" else None

    def load(self, layer: Linear, suffix: str, tensor: torch.Tensor, shard: int | None) -> None:
        """A 16-bit weight is quantized on arrival (on the device), so the float model is never held."""
        super().load(layer, suffix, tensor, shard)
        if suffix == "weight" and not self.quant.from_checkpoint:
            index = shard or 0
            weight, scale = self._quantize(self.pending.pop((index, "weight")).to(self.device))
            if self.input_split is not None:
                weight = fp8_columns(weight, self.input_split)
            self.quantized[index] = (weight, scale)

    def init_dummy(self, layer: Linear, generator: torch.Generator) -> None:
        super().init_dummy(layer, generator)
        for shard in range(len(layer.shard_sizes)):
            self.quantized[shard] = self._quantize(self.pending.pop((shard, "weight")))

    def finish(self, layer: Linear) -> None:
        weights, scales = [], []
        for shard, t in enumerate(self.shard_tensors(layer)):
            if shard in self.quantized:
                w, s = self.quantized.pop(shard)
            else:
                w, s = self._checkpoint_shard(t, layer.shard_sizes[shard])
            weights.append(w)
            scales.append(s)
        self.weight = torch.cat(weights).contiguous()
        self.weight_scale = torch.cat(scales).contiguous()
        if not self.use_scaled_mm:  # CPU: the emulation's dequantized weight, made once
            self.dense = self.weight.float() * self.weight_scale.view(-1, 1)
        else:
            from kvpilot.runtime.kernels.split_k_triton import split_counters

            self.counters = split_counters(self.weight.shape[0], self.device)
            if self.backend == "triton":  # compile the GEMV's launch shapes now, not mid-serving
                from kvpilot.runtime.quant.fp8_gemm import warm_up_fp8_gemv

                warm_up_fp8_gemv(self.weight, self.weight_scale, self.dtype, self.counters)

    def _checkpoint_shard(self, t: dict[str, torch.Tensor], rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A checkpoint's weight and its per-tensor or per-channel scale, as per-channel scales."""
        if t["weight"].dtype != self.checkpoint_dtype:
            raise ModelLoadError(
                f"{self.format_name} checkpoint weight has dtype {t['weight'].dtype}; supported: "
                f"{str(self.checkpoint_dtype).removeprefix('torch.')}"
            )
        s = t["weight_scale"].float().reshape(-1)
        if s.numel() not in (1, rows):
            raise ModelLoadError(
                f"weight_scale has {s.numel()} values; supported: 1 (per tensor) or {rows} (per channel)"
            )
        return t["weight"].to(self.device), s.expand(rows).contiguous().to(self.device)

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Decode sizes: weight-only (the GEMV, or its reference); above them W8A8 (_w8a8). The references
        follow the GPU's dispatch by token count."""
        if x.numel() // x.shape[-1] > FP8_WEIGHT_ONLY_MAX_M:
            return self._w8a8(x, bias)
        if not (self.backend == "triton" and self.use_scaled_mm):
            return fp8_weight_only_ref(x, self.weight, self.weight_scale, bias, dense=self.dense)
        from kvpilot.runtime.quant.fp8_gemm import fp8_linear

        return fp8_linear(x, self.weight, self.weight_scale, bias, counters=self.counters)

    def _w8a8(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """W8A8 with per-token activation scales: torch._scaled_mm on a GPU (either kernel set)."""
        if not self.use_scaled_mm:
            return fp8_gemm_ref(x, self.weight, self.weight_scale, bias, dense=self.dense)
        from kvpilot.runtime.quant.fp8_gemm import fp8_scaled_mm

        return fp8_scaled_mm(x, self.weight, self.weight_scale, bias)

    def apply_norm(
        self,
        layer: Linear,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        norm_weight: torch.Tensor,
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.backend != "triton":
            return None
        from kvpilot.runtime.quant.fused_gemv import fp8_norm_linear

        w, s, c = self.weight, self.weight_scale, self._counters()
        return fp8_norm_linear(hidden, residual, norm_weight, eps, w, s, c)

    def apply_silu(self, layer: Linear, gate_up: torch.Tensor) -> torch.Tensor | None:
        if self.backend != "triton":
            return None
        from kvpilot.runtime.quant.fused_gemv import fp8_silu_linear

        return fp8_silu_linear(gate_up, self.weight, self.weight_scale, self._counters())

    def _counters(self) -> torch.Tensor | None:
        """The GEMV's split-K counters (GPU; None: the kernel makes zeroed ones per call)."""
        return self.counters if self.counters.numel() else None
