"""Which slice of each checkpoint tensor a tensor-parallel rank holds (pure arithmetic, no torch).

A TensorSplit is read straight out of the safetensors file (the loader's get_slice), so a rank never
reads the rest. Attention heads split evenly; KV heads too when there are at least as many as ranks,
else each KV head is replicated on tp / kv_heads consecutive ranks (as vLLM does). The vocabulary is
split into equal blocks of ceil(vocab / tp) rows: the last rank's block is padded with zero rows.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorSplit:
    """Checkpoint rows (or columns, dim=1) [start, start + length) of one tensor. `padded_to`: the rank's
    parameter has this many rows along `dim`; the rows past `length` stay zero (vocab padding). `whole`:
    the unsplit size along `dim` (error messages; quantized layers quantized over whole rows)."""

    dim: int
    start: int
    length: int
    padded_to: int | None = None
    whole: int | None = None


def even_split(size: int, tp: int, tp_rank: int, dim: int = 0) -> TensorSplit | None:
    """Rank tp_rank's 1/tp of `size` (callers have checked divisibility); None when tp is 1."""
    if tp == 1:
        return None
    part = size // tp
    return TensorSplit(dim, tp_rank * part, part, whole=size)


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    return max(1, num_kv_heads // tp)


def kv_head_start(num_kv_heads: int, tp: int, tp_rank: int) -> int:
    """The first KV head rank tp_rank holds (replicated heads: tp / num_kv_heads ranks share one)."""
    if num_kv_heads >= tp:
        return tp_rank * (num_kv_heads // tp)
    return tp_rank // (tp // num_kv_heads)


def kv_split(num_kv_heads: int, head_dim: int, tp: int, tp_rank: int) -> TensorSplit | None:
    """Rows of k_proj / v_proj (weight and bias) rank tp_rank holds."""
    if tp == 1:
        return None
    heads = kv_heads_per_rank(num_kv_heads, tp)
    start = kv_head_start(num_kv_heads, tp, tp_rank) * head_dim
    return TensorSplit(0, start, heads * head_dim, whole=num_kv_heads * head_dim)


def vocab_rows(vocab_size: int, tp: int) -> int:
    """Rows of each rank's block of the (padded) vocabulary."""
    return -(-vocab_size // tp)


def vocab_split(vocab_size: int, tp: int, tp_rank: int) -> TensorSplit | None:
    """Rank tp_rank's block of the embedding / LM head rows; the last block may be short (padded)."""
    if tp == 1:
        return None
    rows = vocab_rows(vocab_size, tp)
    start = min(tp_rank * rows, vocab_size)
    return TensorSplit(0, start, min(rows, vocab_size - start), padded_to=rows)


def parallel_problems(
    *, num_heads: int, num_kv_heads: int, intermediate_size: int, num_layers: int, tp: int, pp: int
) -> list[str]:
    """Why a model cannot be split this way (empty when it can); each message names the numbers."""
    found = []
    if num_heads % tp:
        found.append(f"tensor parallel size {tp} does not divide the model's {num_heads} attention heads")
    if num_kv_heads % tp and tp % num_kv_heads:
        found.append(
            f"tensor parallel size {tp} and the model's {num_kv_heads} KV heads: one must divide the other"
        )
    if intermediate_size % tp:
        found.append(
            f"tensor parallel size {tp} does not divide the model's intermediate size {intermediate_size}"
        )
    if pp > num_layers:
        found.append(f"pipeline parallel size {pp} exceeds the model's {num_layers} layers")
    return found
