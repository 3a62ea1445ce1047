"""The LinearMethods of each weight format (the seam in layers/linear.py): they check and collect a
layer's checkpoint tensors, repack them into the kernels' layout once all are in, and run the GEMM.

Integer formats (int8, int4, awq, gptq) end in one layout (kernels/quant_reference.py) and one GEMM:
the Triton kernel on a GPU with the triton kernel set, the dequantize-then-matmul reference elsewhere.
fp8 (load-time or checkpoint) ends as an fp8 weight with per-output-channel float32 scales, run at decode
sizes by a weight-only Triton GEMV (x stays 16-bit) and above them by torch._scaled_mm with dynamic
per-token activation scales (sm89+), or emulated on the CPU.
"""

from __future__ import annotations

import torch
from kvpilot.runtime.distributed.sharding import TensorSplit
from kvpilot.runtime.errors import ModelLoadError, UnsupportedModelError
from kvpilot.runtime.kernels.quant_reference import (
    FP8_WEIGHT_ONLY_MAX_M,
    dequantize_int_ref,
    fp8_gemm_ref,
    fp8_weight_only_ref,
    int_gemm_ref,
)
from kvpilot.runtime.layers.linear import Linear
from kvpilot.runtime.quant.checkpoint_formats import (
    unpack_awq,
    unpack_compressed_tensors,
    unpack_compressed_unpacked,
    unpack_gptq,
)
from kvpilot.runtime.quant.config import QuantConfig, int4_group_size
from kvpilot.runtime.quant.fp8_weight import quantize_fp8_weight
from kvpilot.runtime.quant.int_weight import IntWeight, merge_parts, quantize_rtn
from kvpilot.runtime.quant.tp_split import fp8_columns, int_weight_columns


class _Collecting:
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


class IntWeightMethod(_Collecting):
    """int8 / int4 quantized at load, AWQ, GPTQ and compressed-tensors int checkpoints: all W{4,8}A16 in the
    canonical layout."""

    def __init__(self, quant: QuantConfig, dtype: torch.dtype, device: torch.device, backend: str) -> None:
        super().__init__(quant, dtype, device, backend)
        if quant.packing.startswith("compressed-tensors"):
            weight = "weight_packed" if quant.packing == "compressed-tensors" else "weight"
            zero_point = () if quant.sym else ("weight_zero_point",)
            self.required_suffixes = (weight, "weight_scale", *zero_point)
            # weight_shape: the loader skips it; input_scale / input_zero_point (static int8 activations):
            # collected and left unused, the activations stay 16-bit
            self.optional_suffixes = ("weight_g_idx", "input_scale", "input_zero_point")
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
                "weight": (out, k),
                "weight_packed": (out, k // per_word),
                "weight_scale": (out, k // group),
                "weight_zero_point": (out // per_word, k // group)
                if q.packing == "compressed-tensors"
                else (out, k // group),
                "weight_g_idx": (k,),
            }
            if suffix in ("input_scale", "input_zero_point"):
                return None
        elif q.method == "awq":
            shapes = {"qweight": (k, out // 8), "qzeros": (k // group, out // 8), "scales": (k // group, out)}
        else:
            shapes = {
                "qweight": (k // per_word, out),
                "qzeros": (k // group, out // per_word),
                "scales": (k // group, out),
                "g_idx": (k,),
            }
        return shapes[suffix]

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
        q = self.quant
        group = int4_group_size(layer.in_features) if q.method == "int4" else q.group_size
        return _to(quantize_rtn(weight.to(self.device), q.bits, group, sym=q.sym), self.device, self.dtype)

    def finish(self, layer: Linear) -> None:
        tensors = self.shard_tensors(layer)
        parts = [
            self.quantized.pop(i) if i in self.quantized else self._build(t) for i, t in enumerate(tensors)
        ]
        self.parts = merge_parts(parts)
        if self.device.type != "cuda":  # CPU: the reference's dequantized W^T, made once (quality runs)
            self.dense = [dequantize_int_ref(p.qweight, p.scales, p.zeros, p.bits) for p in self.parts]
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
                warm_up_int_gemm(p.qweight, p.scales, p.zeros, p.bits, self.dtype, counters)
                warm_up_mma(p.qweight, p.scales, p.zeros, p.bits, self.dtype, counters)

    def _build(self, t: dict[str, torch.Tensor]) -> IntWeight:
        q = self.quant
        if q.packing == "compressed-tensors":
            weight = unpack_compressed_tensors(
                t["weight_packed"],
                t["weight_scale"],
                t.get("weight_zero_point"),
                t.get("weight_g_idx"),
                bits=q.bits,
                dtype=self.dtype,
            )
        elif q.packing == "compressed-tensors-unpacked":
            weight = unpack_compressed_unpacked(
                t["weight"],
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
        if self.dense:  # exactly int_gemm_ref, with W^T dequantized at load
            return (x if w.perm is None else x[..., w.perm]) @ self.dense[index].to(x.dtype)
        k, groups = x.shape[-1], w.scales.shape[0]
        if self.backend == "triton" and x.is_cuda and k % 16 == 0 and (k // groups) % 16 == 0:
            from kvpilot.runtime.kernels.w4a16_mma_triton import int_gemm_mma, mma_dispatched

            if mma_dispatched(x.numel() // k, k, k // groups, w.bits):  # 16 < M <= 256: tensor-core GEMM
                return int_gemm_mma(x, w.qweight, w.scales, w.zeros, w.bits, w.perm, self.counters[index])
            from kvpilot.runtime.kernels.w4a16_triton import int_gemm

            return int_gemm(x, w.qweight, w.scales, w.zeros, w.bits, w.perm, self.counters[index])
        return int_gemm_ref(x, w.qweight, w.scales, w.zeros, w.bits, w.perm)


def _to(w: IntWeight, device: torch.device, dtype: torch.dtype) -> IntWeight:
    perm = None if w.perm is None else w.perm.to(device)
    return IntWeight(
        w.qweight.to(device), w.scales.to(device, dtype), w.zeros.to(device, dtype), w.bits, perm
    )


def require_fp8_gpu(device: torch.device) -> None:
    """fp8 weights run on the CPU (emulated) or a GPU with fp8; refuse any other GPU at start."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        major, minor = torch.cuda.get_device_capability(device)
        raise UnsupportedModelError(
            f"fp8 weights need a GPU with fp8 (compute capability 8.9+: Ada, Hopper, Blackwell); this "
            f"GPU is sm{major}{minor}; use --quantization int8 or int4"
        )


class Fp8Method(_Collecting):
    """fp8 weights float8_e4m3fn [N, K] with per-output-channel scales [N]: a weight-only GEMV at decode
    sizes, W8A8 (activations quantized per token) above them (quant/fp8_gemm.py)."""

    fuses = True

    def __init__(self, quant: QuantConfig, dtype: torch.dtype, device: torch.device, backend: str) -> None:
        super().__init__(quant, dtype, device, backend)
        if quant.from_checkpoint:
            self.required_suffixes = ("weight", "weight_scale")
            self.optional_suffixes = ("input_scale",)  # static activation scales: we scale per token
        self.use_scaled_mm = device.type == "cuda"
        require_fp8_gpu(device)
        self.weight = torch.empty(0)
        self.weight_scale = torch.empty(0)
        self.quantized: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # shard -> (fp8 rows, scales)
        self.dense: torch.Tensor | None = None
        self.counters = torch.empty(0)  # the decode GEMV's split-K counters (GPU)

    def expected_shape(self, layer: Linear, suffix: str, out: int) -> tuple[int, ...] | None:
        return (out, self.weight_inputs(layer)) if suffix == "weight" else None

    def load(self, layer: Linear, suffix: str, tensor: torch.Tensor, shard: int | None) -> None:
        """A 16-bit weight is quantized on arrival (on the device), so the float model is never held."""
        super().load(layer, suffix, tensor, shard)
        if suffix == "weight" and not self.quant.from_checkpoint:
            index = shard or 0
            weight, scale = quantize_fp8_weight(self.pending.pop((index, "weight")).to(self.device))
            if self.input_split is not None:
                weight = fp8_columns(weight, self.input_split)
            self.quantized[index] = (weight, scale)

    def init_dummy(self, layer: Linear, generator: torch.Generator) -> None:
        super().init_dummy(layer, generator)
        for shard in range(len(layer.shard_sizes)):
            self.quantized[shard] = quantize_fp8_weight(self.pending.pop((shard, "weight")))

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
        """An fp8 checkpoint's weight and its per-tensor or per-channel scale, as per-channel scales."""
        if t["weight"].dtype != torch.float8_e4m3fn:
            raise ModelLoadError(
                f"fp8 checkpoint weight has dtype {t['weight'].dtype}; supported: float8_e4m3fn"
            )
        s = t["weight_scale"].float().reshape(-1)
        if s.numel() not in (1, rows):
            raise ModelLoadError(
                f"weight_scale has {s.numel()} values; supported: 1 (per tensor) or {rows} (per channel)"
            )
        return t["weight"].to(self.device), s.expand(rows).contiguous().to(self.device)

    def apply(self, layer: Linear, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        gemv = self.backend == "triton"
        if not (gemv and self.use_scaled_mm):  # a reference: it follows the GPU's dispatch by token count
            if x.numel() // x.shape[-1] <= FP8_WEIGHT_ONLY_MAX_M:
                return fp8_weight_only_ref(x, self.weight, self.weight_scale, bias, dense=self.dense)
            if not self.use_scaled_mm:
                return fp8_gemm_ref(x, self.weight, self.weight_scale, bias, dense=self.dense)
        from kvpilot.runtime.quant.fp8_gemm import fp8_linear

        return fp8_linear(x, self.weight, self.weight_scale, bias, gemv=gemv, counters=self.counters)

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
