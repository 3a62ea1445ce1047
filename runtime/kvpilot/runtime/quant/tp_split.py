"""Tensor parallel hook: a row-parallel rank's input columns of a weight quantized over its whole rows.

int8 and fp8 quantized at load keep one scale per output channel over the whole input row. A
row-parallel rank holds only input columns [k0, k1); quantizing just those would give it its own scales,
different from one GPU's. So the loader hands the method the whole rows (the method's `input_split`), the
method quantizes them as one GPU does, and these functions keep the rank's columns: the rank's weights
are then exactly one GPU's, cut.
"""

from __future__ import annotations

import torch
from kvpilot.runtime.distributed.sharding import TensorSplit
from kvpilot.runtime.errors import ModelLoadError
from kvpilot.runtime.kernels.quant_reference import unpack_rows
from kvpilot.runtime.quant.int_weight import IntWeight, from_unpacked


def int_weight_columns(weight: IntWeight, split: TensorSplit) -> IntWeight:
    """Input rows [start, start + length) of an integer weight (W^T [K, N], one group or groups that the
    split does not cut)."""
    q = unpack_rows(weight.qweight, weight.bits)  # [K, N] (the packing's own unpacker: layout-agnostic)
    groups = int(weight.scales.shape[0])
    group = q.shape[0] // groups
    end = split.start + split.length
    if groups > 1 and (split.start % group or split.length % group):
        raise ModelLoadError(
            f"inputs [{split.start}, {end}) of {q.shape[0]} do not fall on groups of {group}"
        )
    rows = slice(None) if groups == 1 else slice(split.start // group, end // group)
    scales, zeros = weight.scales[rows], weight.zeros[rows]
    cut = from_unpacked(q[split.start : end], scales, zeros, weight.bits, scales.dtype)
    cut.offsets = None if weight.offsets is None else weight.offsets[rows].contiguous()
    return cut


def fp8_columns(weight: torch.Tensor, split: TensorSplit) -> torch.Tensor:
    """Input columns [start, start + length) of an fp8 weight [N, K] (its per-channel scales are kept)."""
    return weight[:, split.start : split.start + split.length].contiguous()
