"""Which slice of a quantized checkpoint tensor a tensor-parallel rank reads.

A column-parallel layer holds output channels [n0, n1) of W [N, K], a row-parallel one input channels
[k0, k1) (sharding.py). Each format packs N and K differently (quant/checkpoint_formats.py), so the same
split lands on a different axis, in different units, per tensor (ct: compressed-tensors pack-quantized):

    tensor                 shape            output split (N)        input split (K)
    awq qweight            [K, N/8]         axis 1, 8 per word      axis 0
    awq qzeros             [K/G, N/8]       axis 1, 8 per word      axis 0, G per group
    awq/gptq scales        [K/G, N]         axis 1                  axis 0, G per group
    gptq qweight           [K/pw, N]        axis 1                  axis 0, pw = 32/bits per word
    gptq qzeros            [K/G, N/pw]      axis 1, pw per word     axis 0, G per group
    gptq g_idx             [K]              whole                   axis 0 (values re-based)
    ct weight_packed       [N, K/pw]        axis 0                  axis 1, pw per word
    ct weight_scale        [N, K/G]         axis 0                  axis 1, G per group (channel: whole)
    ct weight_zero_point   [N/pw, K/G]      axis 0, pw per word     axis 1, G per group
    ct weight_g_idx        [K]              whole                   axis 0 (values re-based)
    ct int8 weight         [N, K]           axis 0                  axis 1   (int-/naive-quantized: the
                                                                             zero points [N, K/G] unpacked)
    fp8 weight, 16-bit     [N, K]           axis 0                  axis 1
    fp8 weight_scale       [N] / [N, 1]     axis 0                  whole   (per tensor: whole)
    block fp8 scale        [N/bn, K/bk]     axis 0, bn per block    axis 1, bk per block
                           (ModelOpt: [N/bn, 1, K/bk, 1], K on axis 2)

A split must fall on word and group boundaries, or the rank would hold half a word or half a group: then
a ModelLoadError names the layer and the numbers. A group spanning all of K (group_size -1) is kept whole
by every rank. GPTQ act-order (desc_act) checkpoints split along K only when each rank's rows fall in
that rank's own groups; otherwise loading is refused (the groups cross the ranks).

16-bit weights quantized at load keep the float split, except int8 and fp8 on a row-parallel layer: their
one scale per output channel spans the whole row, so the rank reads whole rows, the method quantizes them
exactly as one GPU does and keeps its columns (the method's `input_split`, quant/tp_split.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from kvpilot.runtime.distributed.sharding import TensorSplit
from kvpilot.runtime.errors import ModelLoadError
from kvpilot.runtime.quant.config import QuantConfig, int4_group_size

WHOLE_ROW_SCALE_METHODS = ("int8", "fp8")  # load-time formats with one scale per whole output channel


@dataclass(frozen=True)
class PackedAxes:
    """Where a tensor holds N and K: the axis (None: the tensor does not vary along it, keep it whole) and
    how many channels one index along that axis covers (None along K: one group spans all of K)."""

    n_axis: int | None
    n_per_index: int
    k_axis: int | None
    k_per_index: int | None


def packed_axes(quant: QuantConfig, suffix: str, shape: tuple[int, ...]) -> PackedAxes:
    """The layout of checkpoint tensor `suffix` (of `shape`) of a quantized layer."""
    group = None if quant.group_size == -1 else quant.group_size
    per_word = 32 // quant.bits if quant.bits < 16 else 1
    if quant.fp8_block is not None and suffix in ("weight_scale", "weight_scale_inv"):
        k_axis = 2 if len(shape) == 4 else 1  # ModelOpt's [N/bn, 1, K/bk, 1]
        return PackedAxes(0, quant.fp8_block[0], k_axis, quant.fp8_block[1])
    if suffix in ("weight", "bias") or quant.method == "fp8":
        if suffix == "weight_scale":
            return PackedAxes(None if _numel(shape) == 1 else 0, 1, None, None)
        if suffix == "input_scale":
            return PackedAxes(None, 1, None, None)
        return PackedAxes(0, 1, 1, 1) if suffix == "weight" else PackedAxes(0, 1, None, None)
    if quant.packing.startswith("compressed-tensors"):
        zero_rows = per_word if quant.packing == "compressed-tensors" else 1  # packed along N, or int8
        table = {
            "weight_packed": PackedAxes(0, 1, 1, per_word),
            "weight_scale": PackedAxes(0, 1, 1, group),
            "weight_zero_point": PackedAxes(0, zero_rows, 1, group),
            "weight_g_idx": PackedAxes(None, 1, 0, 1),
        }
        return table.get(suffix, PackedAxes(None, 1, None, None))  # input_scale / _zero_point: whole
    if quant.method == "awq":
        n_per = 1 if suffix == "scales" else 8
        return PackedAxes(1, n_per, 0, 1 if suffix == "qweight" else group)
    table = {
        "qweight": PackedAxes(1, 1, 0, per_word),
        "qzeros": PackedAxes(1, per_word, 0, group),
        "scales": PackedAxes(1, 1, 0, group),
        "g_idx": PackedAxes(None, 1, 0, 1),
    }
    return table[suffix]


def _numel(shape: tuple[int, ...]) -> int:
    out = 1
    for size in shape:
        out *= size
    return out


def quantized_split(
    quant: QuantConfig, suffix: str, shape: tuple[int, ...], split: TensorSplit | None
) -> TensorSplit | None:
    """The slice of a quantized layer's checkpoint tensor `suffix` (of `shape`) that the rank holding
    `split` of the layer reads; None: all of it."""
    if split is None:
        return None
    axes = packed_axes(quant, suffix, shape)
    grouped = quant.method in ("awq", "gptq") and quant.group_size != -1
    if split.dim == 1 and grouped:  # every tensor of the layer: groups must not straddle two ranks
        _check_boundary(split, quant.group_size, "inputs", "groups", quant)
    axis, per = (axes.n_axis, axes.n_per_index) if split.dim == 0 else (axes.k_axis, axes.k_per_index)
    if axis is None or per is None:
        return None
    unit = "blocks" if quant.fp8_block is not None else "words"
    _check_boundary(split, per, "output channels" if split.dim == 0 else "inputs", unit, quant)
    return TensorSplit(axis, split.start // per, split.length // per, whole=shape[axis] if shape else None)


def _check_boundary(split: TensorSplit, per: int, what: str, unit: str, quant: QuantConfig) -> None:
    if split.start % per == 0 and split.length % per == 0:
        return
    whole = split.whole or 0
    tp = whole // split.length if split.length else 0
    raise ModelLoadError(
        f"{quant.method} {quant.bits}-bit stores its {what} in {unit} of {per}, and tensor parallel {tp} "
        f"gives this rank {what} [{split.start}, {split.start + split.length}) of {whole}, which does not "
        f"fall on that boundary; use a tensor parallel size that splits the layer into multiples of {per}"
    )


def local_g_idx(g_idx: torch.Tensor, split: TensorSplit, quant: QuantConfig) -> torch.Tensor:
    """A row-parallel rank's slice of a GPTQ g_idx (its rows [k0, k1)), re-based onto the groups it holds
    ([k0 / G, k1 / G)); refused when act order put its rows in other ranks' groups."""
    if quant.group_size == -1:
        return g_idx
    group = quant.group_size
    first = split.start // group
    local = g_idx.to(torch.int64) - first
    groups = split.length // group
    if g_idx.numel() and (int(local.min()) < 0 or int(local.max()) >= groups):
        end = split.start + split.length
        held = f"{first}..{first + groups - 1}"
        raise ModelLoadError(
            f"this GPTQ act-order (desc_act) checkpoint puts inputs [{split.start}, {end}) of {split.whole} "
            f"(this tensor-parallel rank's) in groups {int(g_idx.min())}..{int(g_idx.max())}, but the rank "
            f"holds only groups {held} of {group} inputs; act-order groups that cross the tensor-parallel "
            "split are not supported: use tensor parallel 1 or a desc_act false checkpoint"
        )
    return local.to(g_idx.dtype)


def whole_rows_at_load(quant: QuantConfig | None, split: TensorSplit | None) -> bool:
    """Whether a 16-bit weight quantized at load is read whole (then cut after quantizing): int8 and fp8
    on a row-parallel layer, whose per-channel scales span the whole input row."""
    return (
        quant is not None
        and not quant.from_checkpoint
        and quant.method in WHOLE_ROW_SCALE_METHODS
        and split is not None
        and split.dim == 1
    )


def int4_group_notes(row_inputs: dict[str, int], tp: int) -> list[str]:
    """int4 at load picks its group from a layer's inputs: a row-parallel rank sees K / tp of them and may
    get a finer group than one GPU (more scales, not worse quality). One note per such layer kind."""
    notes = []
    for layer, k in row_inputs.items():
        if tp == 1 or k % tp or (k // tp) % 16:
            continue  # unsplit, or refused elsewhere with the numbers
        whole, local = int4_group_size(k), int4_group_size(k // tp)
        if whole != local:
            notes.append(
                f"int4 at load: {layer} ({k} inputs, {k // tp} per tensor-parallel rank) is quantized in "
                f"groups of {local} per rank, one GPU would use {whole}"
            )
    return notes
