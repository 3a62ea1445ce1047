"""Block-wise fp8 checkpoints: `quant_method: fp8` with `weight_block_size` (DeepSeek-V3, Qwen3-FP8:
weight float8_e4m3fn [N, K] and weight_scale_inv float32 [ceil(N / bn), ceil(K / bk)], W = weight *
weight_scale_inv of its block) and compressed-tensors float8 with strategy block (the same tensors, the
scale named weight_scale).

Up to FP8_WEIGHT_ONLY_MAX_M tokens they run weight-only (W8A16: x stays 16-bit; one Triton GEMM,
kernels/fp8_block_gemm_triton.py), a weight stream. Above, a layer in DeepSeek's 128 x 128 blocks runs as
its authors' recipe does, W8A8: activations quantized per token and 128 inputs, then torch._scaled_mm's
block scaling (cuBLASLt; H100, torch 2.11 + CUDA 13: 0.95-1.75x bf16 at 64-4096 tokens, where the Triton
GEMM ran 0.3-0.9x). Other block shapes, or a torch without that scaling (found out at load), stay
weight-only. The CPU runs the references of the same split.
"""

from __future__ import annotations

import logging

import torch
from kvpilot.runtime.errors import ModelLoadError
from kvpilot.runtime.kernels.quant_reference import (
    FP8_MAX,
    FP8_WEIGHT_ONLY_MAX_M,
    dequantize_fp8_blocks_ref,
    fp8_block_gemm_ref,
    fp8_block_w8a8_ref,
)
from kvpilot.runtime.layers.linear import Linear
from kvpilot.runtime.quant.collecting import CollectingMethod, require_fp8_gpu
from kvpilot.runtime.quant.config import QuantConfig

log = logging.getLogger(__name__)
W8A8_BLOCK = (128, 128)  # the weight blocks of torch._scaled_mm's block scaling (and its 1 x 128 inputs)
SCALED_MM_ROWS = 16  # its token rows, padded to a multiple of this


def runs_w8a8(block: tuple[int, int], k: int, heights: list[int]) -> bool:
    """Whether a layer runs W8A8 above decode sizes: 128 x 128 blocks, a multiple of 4 of them along K, and
    fused shards that each start on a block row (so one [N / 128, K / 128] scale grid covers them all). With
    1-2 blocks along K (K = 128, 256) cuBLASLt read the weight scales wrongly and torch did not refuse it
    (H100, torch 2.11 + CUDA 13: 12x the reference's error norm); at 4, 32 and 96 blocks the outputs match."""
    return block == W8A8_BLOCK and k % (4 * 128) == 0 and all(h % 128 == 0 for h in heights)


def block_scaled_mm(x: torch.Tensor, weight: torch.Tensor, mm_scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] dense rows @ (weight [N, K] fp8 * mm_scale [N / 128, K / 128])^T -> [M, N] in x's dtype:
    W8A8 with DeepSeek's 1 x 128 activation and 128 x 128 weight scales (GPU; fp8_block_w8a8_ref)."""
    from kvpilot.runtime.kernels.fp8_quant_triton import quantize_fp8_groups_triton

    m = x.shape[0]
    # cuBLASLt refuses the block scaling at M = 17 (not at 64 or 300, H100): the rows go in padded to 16
    rows = -(-m // SCALED_MM_ROWS) * SCALED_MM_ROWS
    xq, sx = quantize_fp8_groups_triton(x, rows=rows)  # [rows, K] fp8, [rows, K / 128] (strides (1, rows))
    y = torch._scaled_mm(xq, weight.t(), scale_a=sx, scale_b=mm_scale.t(), out_dtype=torch.bfloat16)[:m]
    return y if x.dtype == torch.bfloat16 else y.to(x.dtype)


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


class Fp8BlockMethod(CollectingMethod):
    """weight float8_e4m3fn [N, K] (fused shards stacked) with block_scale float32 [ceil(N / sn), ceil(K /
    bk)], scale_block = (sn, bk): the checkpoint's blocks (sn = bn) where every shard starts on a block row,
    else each block row repeated over its rows (sn = 1), so shards of any height stack (q/k/v, gate/up)."""

    def __init__(self, quant: QuantConfig, dtype: torch.dtype, device: torch.device, backend: str) -> None:
        super().__init__(quant, dtype, device, backend)
        require_fp8_gpu(device)
        if quant.fp8_block is None:
            raise ValueError("Fp8BlockMethod needs a block-wise fp8 QuantConfig")
        self.block_n, self.block_k = quant.fp8_block
        # DeepSeek / Qwen3-FP8 name it weight_scale_inv; compressed-tensors and ModelOpt weight_scale
        self.scale_suffix = "weight_scale_inv" if quant.packing == "" else "weight_scale"
        self.required_suffixes = ("weight", self.scale_suffix)
        self.use_kernel = device.type == "cuda" and backend == "triton"
        self.quantized: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # shard -> dummy (benchmarks)
        self.weight = torch.empty(0)
        self.block_scale = torch.empty(0)
        self.scale_block = (self.block_n, self.block_k)
        self.dense: torch.Tensor | None = None
        self.counters = torch.empty(0)
        self.w8a8 = False  # above decode sizes: W8A8 through torch._scaled_mm (runs_w8a8)

    def expected_shape(self, layer: Linear, suffix: str, out: int) -> tuple[int, ...] | None:
        k = layer.in_features
        if suffix == "weight":
            return (out, k)
        return (-(-out // self.block_n), -(-k // self.block_k))

    def load(self, layer: Linear, suffix: str, tensor: torch.Tensor, shard: int | None) -> None:
        """ModelOpt writes block scales [N / bn, 1, K / bk, 1]: taken as [N / bn, K / bk]."""
        if suffix == self.scale_suffix and tensor.dim() == 4 and tensor.shape[1] == tensor.shape[3] == 1:
            tensor = tensor[:, 0, :, 0]
        super().load(layer, suffix, tensor, shard)

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
            scales.append(s.float().to(self.device))
        heights = [w.shape[0] for w in weights]
        if any(h % self.block_n for h in heights[:-1]):  # a shard ends inside a block row
            scales = [
                s.repeat_interleave(self.block_n, dim=0)[:h] for s, h in zip(scales, heights, strict=True)
            ]
            self.scale_block = (1, self.block_k)
        self.weight = torch.cat(weights).contiguous()
        self.block_scale = torch.cat(scales).contiguous()
        k = self.weight.shape[1]
        self.w8a8 = runs_w8a8((self.block_n, self.block_k), k, heights)
        if not self.use_kernel:  # the reference's dequantized weight, made once
            self.dense = dequantize_fp8_blocks_ref(self.weight, self.block_scale, self.scale_block)
            return
        from kvpilot.runtime.kernels.fp8_block_gemm_triton import fp8_block_gemm, warm_up_ms
        from kvpilot.runtime.kernels.split_k_triton import split_counters

        self.counters = split_counters(self.weight.shape[0], self.device)
        for m in warm_up_ms():  # compile every launch shape now, not mid-serving
            x = torch.zeros(m, k, device=self.device, dtype=self.dtype)
            fp8_block_gemm(x, self.weight, self.block_scale, self.scale_block, self.counters)
        if self.w8a8:  # block_scale is [N / 128, K / 128] there (runs_w8a8: every shard on block rows)
            self.w8a8 = self._scaled_mm_takes_blocks(k)

    def _scaled_mm_takes_blocks(self, k: int) -> bool:
        """Run the W8A8 path once (compiling its quantizer); False, logged, where torch refuses."""
        try:
            x = torch.zeros(FP8_WEIGHT_ONLY_MAX_M + 1, k, device=self.device, dtype=self.dtype)
            block_scaled_mm(x, self.weight, self.block_scale)
        except RuntimeError as exc:
            log.warning(
                "torch._scaled_mm lacks block scaling here (%s): block-wise fp8 runs weight-only", exc
            )
            return False
        return True

    def _checkpoint_shard(self, t: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if t["weight"].dtype != torch.float8_e4m3fn:
            raise ModelLoadError(
                f"block-wise fp8 weight has dtype {t['weight'].dtype}; supported: float8_e4m3fn"
            )
        return t["weight"], t[self.scale_suffix]

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        w8a8 = self.w8a8 and x.numel() // x.shape[-1] > FP8_WEIGHT_ONLY_MAX_M
        if self.dense is not None:  # the references, split as the GPU's dispatch
            if w8a8:
                return fp8_block_w8a8_ref(x, self.weight, self.block_scale, bias, dense=self.dense)
            return fp8_block_gemm_ref(
                x, self.weight, self.block_scale, self.scale_block, bias, dense=self.dense
            )
        from kvpilot.runtime.kernels.fp8_block_gemm_triton import fp8_block_gemm

        x2 = x.reshape(-1, x.shape[-1])
        x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
        if w8a8:
            y = block_scaled_mm(x2, self.weight, self.block_scale)
        else:
            y = fp8_block_gemm(x2, self.weight, self.block_scale, self.scale_block, self.counters)
        y = y if bias is None else y + bias
        return y.reshape(*x.shape[:-1], y.shape[-1])
