"""The LinearMethod of the integer formats (the seam in layers/linear.py): it checks and collects a layer's
checkpoint tensors, repacks them into the kernels' layout once all are in, and runs the GEMM.

Integer formats (int8, int4, awq, gptq, compressed-tensors int) end in one layout
(kernels/quant_reference.py) and one GEMM: the Triton/CUDA kernels on a GPU with the triton kernel set,
the dequantize-then-matmul reference elsewhere. fp8 has its own methods (quant/fp8_method.py, per tensor
or channel; quant/fp8_block.py, block-wise).
"""

from __future__ import annotations

import torch
from kvpilot.runtime.errors import ModelLoadError
from kvpilot.runtime.kernels.quant_reference import int_gemm_ref
from kvpilot.runtime.layers.linear import Linear
from kvpilot.runtime.quant.checkpoint_formats import (
    unpack_awq,
    unpack_compressed_tensors,
    unpack_compressed_unpacked,
    unpack_gptq,
)
from kvpilot.runtime.quant.collecting import CollectingMethod
from kvpilot.runtime.quant.config import QuantConfig, int4_group_size
from kvpilot.runtime.quant.gguf_grid import gguf_weight
from kvpilot.runtime.quant.int_weight import IntWeight, add_offsets, dense_weight, merge_parts, quantize_rtn
from kvpilot.runtime.quant.tp_split import int_weight_columns


class IntWeightMethod(CollectingMethod):
    """int8 / int4 quantized at load, AWQ, GPTQ and compressed-tensors int checkpoints: all W{4,8}A16 in the
    canonical layout."""

    def __init__(self, quant: QuantConfig, dtype: torch.dtype, device: torch.device, backend: str) -> None:
        super().__init__(quant, dtype, device, backend)
        if quant.packing.startswith("compressed-tensors"):
            weight = "weight_packed" if quant.packing == "compressed-tensors" else "weight"
            zero_point = () if quant.sym else ("weight_zero_point",)
            self.required_suffixes = (weight, "weight_scale", *zero_point)
            # weight_shape: the loader skips it; input_scale / input_zero_point (static int8 activations):
            # collected and left unused, the activations stay 16-bit; a symmetric checkpoint's zero points
            # (older compressed-tensors versions write them, all zero) are used as given
            sym_zero_point = ("weight_zero_point",) if quant.sym else ()
            self.optional_suffixes = ("weight_g_idx", "input_scale", "input_zero_point", *sym_zero_point)
        elif quant.from_checkpoint:
            self.required_suffixes = ("qweight", "qzeros", "scales")
            self.optional_suffixes = ("g_idx",) if quant.method == "gptq" else ()
        self.quantized: dict[int, IntWeight] = {}  # shard -> quantized at load (16-bit checkpoints)
        self.parts: list[IntWeight] = []
        self.dense: list[torch.Tensor] = []
        self.counters: list[torch.Tensor] = []  # per part: the decode GEMV's split-K counters (GPU)

    def expected_shape(self, layer: Linear, suffix: str, out: int) -> tuple[int, ...] | None:
        if suffix == "weight":
            return (out, self.weight_inputs(layer))
        k, q = layer.in_features, self.quant
        per_word = 32 // q.bits
        group = k if q.group_size == -1 else q.group_size
        if k % group or k % per_word or out % per_word:
            raise ModelLoadError(
                f"a layer of {k} inputs and {out} outputs cannot hold {q.method} {q.bits}-bit weights in "
                f"groups of {q.group_size} (config.json quantization_config.group_size)"
            )
        shapes: dict[str, tuple[int, ...]]
        if q.packing.startswith("compressed-tensors"):
            shapes = {
                "weight_packed": (out, k // per_word),
                "weight_scale": (out, k // group),
                "weight_zero_point": (out // per_word, k // group)
                if q.packing == "compressed-tensors"
                else (out, k // group),
                "weight_g_idx": (k,),
            }  # input_scale / input_zero_point: any shape (unused)
        elif q.method == "awq":
            shapes = {"qweight": (k, out // 8), "qzeros": (k // group, out // 8), "scales": (k // group, out)}
        else:
            shapes = {
                "qweight": (k // per_word, out),
                "qzeros": (k // group, out // per_word),
                "scales": (k // group, out),
                "g_idx": (k,),
            }
        return shapes.get(suffix)

    def load(self, layer: Linear, suffix: str, tensor: torch.Tensor, shard: int | None) -> None:
        """A 16-bit weight is quantized on arrival (on the device), so the float model is never held."""
        super().load(layer, suffix, tensor, shard)
        if suffix == "weight" and not self.quant.from_checkpoint:
            key = (shard or 0, "weight")
            weight = self._quantize(layer, self.pending.pop(key))
            self.quantized[key[0]] = (
                weight if self.input_split is None else int_weight_columns(weight, self.input_split)
            )

    def init_dummy(self, layer: Linear, generator: torch.Generator) -> None:
        super().init_dummy(layer, generator)
        for shard in range(len(layer.shard_sizes)):
            self.quantized[shard] = self._quantize(layer, self.pending.pop((shard, "weight")))

    def _quantize(self, layer: Linear, weight: torch.Tensor) -> IntWeight:
        q, weight = self.quant, weight.to(self.device)
        if q.method in ("int4", "int8"):  # a dequantized GGUF keeps its grid (quant/gguf_grid.py)
            grid = gguf_weight(weight, q.method, self.dtype)
            if grid is not None:
                return _to(grid, self.device, self.dtype)
        group = int4_group_size(layer.in_features) if q.method == "int4" else q.group_size
        return _to(quantize_rtn(weight, q.bits, group, sym=q.sym), self.device, self.dtype)

    def finish(self, layer: Linear) -> None:
        tensors = self.shard_tensors(layer)
        parts = [
            self.quantized.pop(i) if i in self.quantized else self._build(t) for i, t in enumerate(tensors)
        ]
        self.parts = merge_parts(parts)
        if self.device.type != "cuda":  # CPU: the reference's dequantized W^T, made once (quality runs)
            self.dense = [dense_weight(p) for p in self.parts]
        else:
            from kvpilot.runtime.kernels.split_k_triton import split_counters

            self.counters = [split_counters(p.out_features, self.device) for p in self.parts]
            self._warm_up()

    def _warm_up(self) -> None:
        """Compile the GEMM's launch shapes now, not on the first request of a new size."""
        if self.backend != "triton":
            return
        from kvpilot.runtime.kernels.w4a16_mma_triton import warm_up_mma
        from kvpilot.runtime.kernels.w4a16_triton import fused_supported, warm_up_int_gemm

        for p, counters in zip(self.parts, self.counters, strict=True):
            k = p.qweight.shape[0] * (32 // p.bits)
            if fused_supported(k, k // p.scales.shape[0], p.bits) and k % 16 == 0:
                warm_up_int_gemm(p.qweight, p.scales, p.zeros, p.bits, self.dtype, counters, p.offsets)
                warm_up_mma(p.qweight, p.scales, p.zeros, p.bits, self.dtype, counters, p.offsets)

    def _build(self, t: dict[str, torch.Tensor]) -> IntWeight:
        q = self.quant
        if q.packing.startswith("compressed-tensors"):
            packed = q.packing == "compressed-tensors"
            unpack = unpack_compressed_tensors if packed else unpack_compressed_unpacked
            weight = unpack(
                t["weight_packed" if packed else "weight"],
                t["weight_scale"],
                t.get("weight_zero_point"),
                t.get("weight_g_idx"),
                bits=q.bits,
                dtype=self.dtype,
            )
        elif q.method == "awq":
            weight = unpack_awq(t["qweight"], t["qzeros"], t["scales"], self.dtype)
        else:
            weight = unpack_gptq(
                t["qweight"],
                t["qzeros"],
                t["scales"],
                t.get("g_idx"),
                bits=q.bits,
                zeros_v2=q.zeros_v2,
                dtype=self.dtype,
            )
        return _to(weight, self.device, self.dtype)

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        outs = [self._gemm(x, part, i) for i, part in enumerate(self.parts)]
        y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        return y if bias is None else y + bias

    def _gemm(self, x: torch.Tensor, w: IntWeight, index: int) -> torch.Tensor:
        """x W^T, with the offsets of fractional zero points (quant/int_weight.py, from_affine) where the
        weight has them: the GPU dispatch adds them (in its int4 GEMM where that runs), else add_offsets."""
        if self.dense:  # exactly int_gemm_ref (+ the offsets), with W^T dequantized at load
            return (x if w.perm is None else x[..., w.perm]) @ self.dense[index].to(x.dtype)
        k, groups = x.shape[-1], w.scales.shape[0]
        if self.backend == "triton" and x.is_cuda and k % 16 == 0 and (k // groups) % 16 == 0:
            from kvpilot.runtime.kernels.w4a16_mma_triton import int_gemm_mma, mma_dispatched
            from kvpilot.runtime.kernels.w4a16_triton import int_gemm

            gemm = int_gemm_mma if mma_dispatched(x.numel() // k, k, k // groups, w.bits) else int_gemm
            return gemm(  # int_gemm_mma at 16 < M <= 256: the tensor-core GEMM's buckets
                x, w.qweight, w.scales, w.zeros, w.bits, w.perm, self.counters[index], offsets=w.offsets
            )  # fmt: skip
        y = int_gemm_ref(x, w.qweight, w.scales, w.zeros, w.bits, w.perm)
        if w.offsets is None:
            return y
        return add_offsets(y, x if w.perm is None else x[..., w.perm], w.offsets)


def _to(w: IntWeight, device: torch.device, dtype: torch.dtype) -> IntWeight:
    perm = None if w.perm is None else w.perm.to(device)
    offsets = None if w.offsets is None else w.offsets.to(device, dtype)
    return IntWeight(
        w.qweight.to(device), w.scales.to(device, dtype), w.zeros.to(device, dtype), w.bits, perm, offsets
    )
