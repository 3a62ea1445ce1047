"""Quantized weights shard across tensor-parallel ranks: each rank's dequantized weights are exactly its
slice of one GPU's (every format: int8/int4/fp8 quantized at load, AWQ, GPTQ, fp8 and compressed-tensors
checkpoints), and a split the packing cannot take is refused naming the numbers. In process: a rank's load
needs no peers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from kvpilot.runtime.config import ModelConfig
from kvpilot.runtime.distributed.comm import Comm
from kvpilot.runtime.distributed.topology import Rank
from kvpilot.runtime.errors import ModelLoadError
from kvpilot.runtime.fixtures.checkpoint import make_tiny_checkpoint
from kvpilot.runtime.fixtures.fp8_exports import make_fbgemm_fp8_checkpoint, make_modelopt_checkpoint
from kvpilot.runtime.fixtures.gguf_grids import make_grid_checkpoint
from kvpilot.runtime.fixtures.quantized import make_quantized_checkpoint
from kvpilot.runtime.kernels.quant_reference import dequantize_fp8_blocks_ref
from kvpilot.runtime.layers.kernel_ops import torch_ops
from kvpilot.runtime.layers.linear import Linear
from kvpilot.runtime.loader import load_model
from kvpilot.runtime.quant.fp8_block import Fp8BlockMethod
from kvpilot.runtime.quant.fp8_method import Fp8Method
from kvpilot.runtime.quant.int_weight import dense_weight as int_dense_weight
from kvpilot.runtime.quant.methods import IntWeightMethod
from torch import nn

CPU = torch.device("cpu")
# int4 at load picks its group from the layer's inputs: 256/512-wide row-parallel inputs keep group 128
# at tp 2 (a narrower layer would get a finer group on each rank than on one GPU)
WIDE = {"num_attention_heads": 8, "head_dim": 32, "hidden_size": 128, "intermediate_size": 512}
CASES: dict[str, tuple[str | None, str | None, dict[str, Any]]] = {
    # name: (checkpoint format or None for 16-bit, --quantization, options)
    "int8": (None, "int8", {}),
    "int4": (None, "int4", WIDE),
    "fp8-at-load": (None, "fp8", {}),
    "awq-g32": ("awq", None, {"group_size": 32}),
    "awq-g32-kv1": ("awq", None, {"group_size": 32, "num_key_value_heads": 1}),  # KV head replicated
    "gptq4-asym-g32": ("gptq", None, {"bits": 4, "group_size": 32, "sym": False}),
    "gptq8-g-1-v2": ("gptq", None, {"bits": 8, "group_size": -1, "v2": True}),
    "fp8-checkpoint": ("fp8", None, {}),
    "compressed-tensors-channel": ("compressed-tensors", None, {"per_channel": True}),
    "ct-int4-asym-g32": ("compressed-tensors-int", None, {"bits": 4, "group_size": 32, "sym": False}),
    "ct-int8-sym-channel": ("compressed-tensors-int", "gptq", {"bits": 8, "group_size": -1}),
    "ct-int8-w8a8-static-g32": (
        "compressed-tensors-int",
        None,
        {
            "bits": 8,
            "group_size": 32,
            "sym": False,
            "ct_format": "int-quantized",
            "int8_activations": "static",
        },
    ),
    "ct-int8-w8a8-dynamic-channel": (  # W8A8 int8: the plain int8 weight (Int8ChannelMethod)
        "compressed-tensors-int",
        None,
        {"bits": 8, "group_size": -1, "ct_format": "int-quantized", "int8_activations": "dynamic"},
    ),
    "fp8-block-32": ("fp8", None, {"block": (32, 32)}),
    "ct-fp8-block-16x32": ("compressed-tensors", "fp8", {"block": (16, 32)}),
    "modelopt-fp8": ("modelopt:FP8", None, {}),
    # ModelOpt's [N/128, 1, K/128, 1] block scales, split along axes 0 and 2: every split on a 128 block
    "modelopt-fp8-pb-wo": (
        "modelopt:FP8_PB_WO",
        None,
        {**WIDE, "hidden_size": 256, "num_key_value_heads": 8},
    ),
    "fbgemm-fp8": ("fbgemm_fp8", None, {}),
    # a GGUF Q4_1 grid kept under int4 (whole zeros + per-group offsets): each rank finds its blocks' grid
    "int4-q4_1-grid": ("gguf:q4_1", "int4", {}),
    # a GGUF Q8_0 grid kept under int8: whole rows read (int8 at load), the grid found, then cut on groups
    "int8-q8_0-grid": ("gguf:q8_0", "int8", {}),
}


def _checkpoint(root: Path, fmt: str | None, opts: dict[str, Any]) -> Path:
    if fmt is None:
        return make_tiny_checkpoint(root, "qwen3", seed=3, **opts)
    if fmt.startswith("modelopt:"):
        return make_modelopt_checkpoint(root, fmt.removeprefix("modelopt:"), seed=3, **opts)
    if fmt == "fbgemm_fp8":
        return make_fbgemm_fp8_checkpoint(root, seed=3, **opts)
    if fmt.startswith("gguf:"):
        return make_grid_checkpoint(root, fmt.removeprefix("gguf:"), seed=3, **opts)
    return make_quantized_checkpoint(root, fmt, "qwen3", seed=3, **opts)


def _load(path: Path, quantization: str | None, rank: Rank) -> nn.Module:
    return load_model(
        path,
        ModelConfig.from_dir(path),
        device=CPU,
        dtype=torch.float32,
        ops=torch_ops(),
        comm=Comm(rank, CPU),
        quantization=quantization,
    )


def dense_weight(layer: Linear) -> torch.Tensor:
    """The layer's dequantized W [N, K] (fused parts side by side), in the input order of x."""
    method = layer.quant_method
    if isinstance(method, Fp8Method):
        return method.weight.float() * method.weight_scale.view(-1, 1)
    if isinstance(method, Fp8BlockMethod):
        return dequantize_fp8_blocks_ref(method.weight, method.block_scale, method.scale_block)
    assert isinstance(method, IntWeightMethod)
    parts = []
    for part in method.parts:
        wt = int_dense_weight(part).float()  # [K, N], offsets included
        if part.perm is not None:  # rows in act order: put them back in x's order
            unsorted = torch.empty_like(wt)
            unsorted[part.perm] = wt
            wt = unsorted
        parts.append(wt.t())
    return torch.cat(parts)


def expected_slice(whole: torch.Tensor, layer: Linear, whole_sizes: tuple[int, ...]) -> torch.Tensor:
    """One GPU's W cut to what this rank's layer holds (its weight_splits of each fused part)."""
    out, start = [], 0
    for size, split in zip(whole_sizes, layer.weight_splits, strict=True):
        part = whole[start : start + size]
        start += size
        if split is not None:
            part = part.narrow(split.dim, split.start, split.length)
        out.append(part)
    return torch.cat(out)


@pytest.mark.parametrize("case", list(CASES))
def test_each_rank_holds_its_slice_of_one_gpus_weights(case: str, tmp_path: Path) -> None:
    fmt, quantization, opts = CASES[case]
    path = _checkpoint(tmp_path / case, fmt, opts)
    one = dict(_load(path, quantization, Rank(0)).named_modules())
    checked = 0
    for r in range(2):
        rank = _load(path, quantization, Rank(r, tp=2))
        for name, layer in rank.named_modules():
            if not isinstance(layer, Linear):
                continue
            whole = one[name]
            assert isinstance(whole, Linear)
            want = expected_slice(dense_weight(whole), layer, whole.shard_sizes)
            torch.testing.assert_close(dense_weight(layer), want, rtol=0, atol=0)
            checked += 1
            if case.endswith("-grid"):  # the grid was found on every rank, not re-rounded
                parts = layer.quant_method.parts
                assert all(p.scales.shape[0] * 32 == p.qweight.shape[0] * 32 // p.bits for p in parts), name
                assert case != "int4-q4_1-grid" or all(p.offsets is not None for p in parts), name
    assert checked == 2 * 2 * 4  # two ranks x two layers x (qkv, o, gate_up, down)


def test_act_order_groups_crossing_the_split_are_refused(tmp_path: Path) -> None:
    path = make_quantized_checkpoint(tmp_path / "g", "gptq", bits=4, group_size=32, desc_act=True, seed=3)
    _load(path, None, Rank(0))  # one GPU takes it
    with pytest.raises(ModelLoadError) as err:
        _load(path, None, Rank(1, tp=2))
    text = str(err.value)
    assert "_proj.g_idx" in text and "act-order (desc_act)" in text
    assert "inputs [64, 128) of 128" in text and "holds only groups 2..3 of 32 inputs" in text


def test_compressed_tensors_act_order_across_the_split_is_refused(tmp_path: Path) -> None:
    path = make_quantized_checkpoint(
        tmp_path / "c", "compressed-tensors-int", bits=4, group_size=32, desc_act=True, seed=3
    )
    _load(path, None, Rank(0))
    with pytest.raises(ModelLoadError) as err:
        _load(path, None, Rank(1, tp=2))
    assert "_proj.weight_g_idx" in str(err.value) and "act-order (desc_act)" in str(err.value)


def test_groups_straddling_the_split_are_refused(tmp_path: Path) -> None:
    # AWQ groups of 128 inputs, but tp 2 gives each rank 64 of o_proj's 128
    path = make_quantized_checkpoint(tmp_path / "a", "awq", group_size=128, hidden_size=128, seed=3)
    with pytest.raises(ModelLoadError) as err:
        _load(path, None, Rank(0, tp=2))
    text = str(err.value)
    assert "groups of 128" in text and "tensor parallel 2" in text and "[0, 64) of 128" in text


def test_fp8_blocks_straddling_the_split_are_refused(tmp_path: Path) -> None:
    # blocks of 64 output rows, but tp 2 gives each rank 32 of k_proj's 64
    path = make_quantized_checkpoint(tmp_path / "b", "fp8", block=(64, 32), seed=3)
    _load(path, None, Rank(0))
    with pytest.raises(ModelLoadError) as err:
        _load(path, None, Rank(1, tp=2))
    text = str(err.value)
    assert (
        "weight_scale_inv" in text
        and "output channels in blocks of 64" in text
        and "tensor parallel 2" in text
    )
