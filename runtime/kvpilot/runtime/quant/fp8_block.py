"""Block-wise fp8 checkpoints: `quant_method: fp8` with `weight_block_size` (DeepSeek-V3, Qwen3-FP8:
weight float8_e4m3fn [N, K] and weight_scale_inv float32 [ceil(N / bn), ceil(K / bk)], W = weight *
weight_scale_inv of its block) and compressed-tensors float8 with strategy block (the same tensors, the
scale named weight_scale).

They run weight-only (W8A16): the activations stay 16-bit, where the checkpoints' authors quantize them
per token and group of 128 (the numbers are at least as close to the float model's). One Triton GEMM
takes every token count (kernels/fp8_block_gemm_triton.py); the CPU runs its reference.
"""

from __future__ import annotations

import torch
from kvpilot.runtime.errors import ModelLoadError
from kvpilot.runtime.kernels.quant_reference import FP8_MAX, dequantize_fp8_blocks_ref, fp8_block_gemm_ref
from kvpilot.runtime.layers.linear import Linear
from kvpilot.runtime.quant.config import QuantConfig
from kvpilot.runtime.quant.methods import _Collecting, require_fp8_gpu


def quantize_fp8_blocks(weight: torch.Tensor, bn: int, bk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """W [N, K] -> (float8_e4m3fn [N, K], float32 scales [ceil(N / bn), ceil(K / bk)]): each block's absmax
    onto 448 (random weights of benchmarks; real ones come quantized)."""
    n, k = weight.shape
    rows, cols = -(-n // bn), -(-k // bk)
    padded = torch.zeros(rows * bn, cols * bk, device=weight.device, dtype=torch.float32)
    padded[:n, :k] = weight.float()
    blocks = padded.view(rows, bn, cols, bk)
    scale = (blocks.abs().amax(dim=(1, 3)) / FP8_MAX).clamp(min=1e-12)  # [rows, cols]
    q = (blocks / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q.view(rows * bn, cols * bk)[:n, :k].contiguous(), scale


class Fp8BlockMethod(_Collecting):
    """weight float8_e4m3fn [N, K] (fused shards stacked) with block_scale float32 [N, ceil(K / bk)]: each
    checkpoint block row repeated over its bn rows, so shards of any height stack (q/k/v, gate/up)."""

    def __init__(self, quant: QuantConfig, dtype: torch.dtype, device: torch.device, backend: str) -> None:
        super().__init__(quant, dtype, device, backend)
        require_fp8_gpu(device)
        if quant.fp8_block is None:
            raise ValueError("Fp8BlockMethod needs a block-wise fp8 QuantConfig")
        self.block_n, self.block_k = quant.fp8_block
        self.scale_suffix = "weight_scale" if quant.packing == "compressed-tensors" else "weight_scale_inv"
        self.required_suffixes = ("weight", self.scale_suffix)
        self.use_kernel = device.type == "cuda" and backend == "triton"
        self.quantized: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # shard -> dummy (benchmarks)
        self.weight = torch.empty(0)
        self.block_scale = torch.empty(0)
        self.dense: torch.Tensor | None = None
        self.counters = torch.empty(0)

    def expected_shape(self, layer: Linear, suffix: str, out: int) -> tuple[int, ...] | None:
        k = layer.in_features
        if suffix == "weight":
            return (out, k)
        return (-(-out // self.block_n), -(-k // self.block_k))

    def init_dummy(self, layer: Linear, generator: torch.Generator) -> None:
        super().init_dummy(layer, generator)
        for shard in range(len(layer.shard_sizes)):
            weight = self.pending.pop((shard, "weight"))
            self.quantized[shard] = quantize_fp8_blocks(weight, self.block_n, self.block_k)

    def finish(self, layer: Linear) -> None:
        weights, scales = [], []
        for shard, t in enumerate(self.shard_tensors(layer)):
            w, s = self.quantized.pop(shard) if shard in self.quantized else self._checkpoint_shard(t)
            weights.append(w.to(self.device))
            scales.append(s.float().to(self.device).repeat_interleave(self.block_n, dim=0)[: w.shape[0]])
        self.weight = torch.cat(weights).contiguous()
        self.block_scale = torch.cat(scales).contiguous()
        if not self.use_kernel:  # the reference's dequantized weight, made once
            self.dense = dequantize_fp8_blocks_ref(self.weight, self.block_scale, self.block_k)
            return
        from kvpilot.runtime.kernels.fp8_block_gemm_triton import fp8_block_gemm, warm_up_ms
        from kvpilot.runtime.kernels.split_k_triton import split_counters

        self.counters = split_counters(self.weight.shape[0], self.device)
        for m in warm_up_ms():  # compile every launch shape now, not mid-serving
            x = torch.zeros(m, self.weight.shape[1], device=self.device, dtype=self.dtype)
            fp8_block_gemm(x, self.weight, self.block_scale, self.block_k, self.counters)

    def _checkpoint_shard(self, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if t["weight"].dtype != torch.float8_e4m3fn:
            raise ModelLoadError(
                f"block-wise fp8 weight has dtype {t['weight'].dtype}; supported: float8_e4m3fn"
            )
        return t["weight"], t[self.scale_suffix]

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.dense is not None:
            return fp8_block_gemm_ref(x, self.weight, self.block_scale, self.block_k, bias, dense=self.dense)
        from kvpilot.runtime.kernels.fp8_block_gemm_triton import fp8_block_gemm

        x2 = x.reshape(-1, x.shape[-1])
        x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
        y = fp8_block_gemm(x2, self.weight, self.block_scale, self.block_k, self.counters)
        y = y if bias is None else y + bias
        return y.reshape(*x.shape[:-1], y.shape[-1])
