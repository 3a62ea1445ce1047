"""The tensors of a GGUF file as a Hugging Face checkpoint's (gguf_model.convert_gguf): renamed, Llama's Q/K
rows un-permuted, every type dequantized to float32 by the gguf package; and which ggml types the
projections were stored in (quant/gguf_grid.py keeps their grids under int4 / int8)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvpilot.runtime.errors import ModelLoadError, UnsupportedModelError

# GGUF tensor name (after "blk.N.") -> Hugging Face name (after "model.layers.N.")
_LAYER_TENSORS: dict[str, str] = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_TENSORS: dict[str, str] = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def require_int(meta: dict[str, Any], key: str) -> int:
    value = meta.get(key)
    if not isinstance(value, int):
        raise ModelLoadError(f"GGUF metadata lacks the integer field {key}")
    return value


def projection_types(reader: Any) -> dict[str, int]:
    """How many of the layers' 2-D tensors (the projections) the file stores in each ggml type."""
    from gguf import GGMLQuantizationType

    counts: dict[str, int] = {}
    for tensor in reader.tensors:
        if tensor.name.startswith("blk.") and len(tensor.shape) == 2:
            name = GGMLQuantizationType(tensor.tensor_type).name
            counts[name] = counts.get(name, 0) + 1
    return counts


def hf_tensor_name(name: str) -> str | None:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight'; None for unknown names."""
    base, dot, kind = name.rpartition(".")
    if not dot or kind not in ("weight", "bias"):
        return None
    if base in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[base]}.{kind}"
    parts = base.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{_LAYER_TENSORS[parts[2]]}.{kind}"
    return None


def unpermute_rotary(weight: Any, n_head: int) -> Any:
    """Undo llama.cpp's convert_hf_to_gguf `permute` of q_proj/k_proj rows (n_head: the heads of that
    projection): per head it moved the rows [first half | second half] into interleaved pairs."""
    rows = weight.shape[0]
    return (
        weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def convert_tensors(
    reader: Any, meta: dict[str, Any], arch: str, torch_dtype: Any, gguf_file: Path
) -> dict[str, Any]:
    """Every tensor dequantized to float32 by the gguf package, renamed, un-permuted, cast."""
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    heads = require_int(meta, f"{arch}.attention.head_count")
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv") or heads)
    out: dict[str, Any] = {}
    unknown: list[str] = []
    for tensor in reader.tensors:
        if tensor.name.startswith("rope_freqs"):
            raise UnsupportedModelError(
                f"{gguf_file.name}: rope frequency factors ({tensor.name}, Llama 3.1 rope scaling) "
                "are not supported for GGUF models yet"
            )
        name = hf_tensor_name(tensor.name)
        if name is None:
            unknown.append(tensor.name)
            continue
        qtype = GGMLQuantizationType(tensor.tensor_type)
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))  # GGUF lists dims fastest first
        try:
            values = np.array(dequantize(tensor.data, qtype), dtype=np.float32).reshape(shape)
        except NotImplementedError as exc:
            raise UnsupportedModelError(
                f"{gguf_file.name}: tensor {tensor.name} has type {qtype.name}, which the gguf package "
                f"cannot dequantize ({exc})"
            ) from exc
        except (ValueError, TypeError) as exc:
            raise ModelLoadError(
                f"{gguf_file.name}: tensor {tensor.name} ({qtype.name}, shape {shape}) is unreadable: {exc} "
                "(is the file truncated or corrupted?)"
            ) from exc
        if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            values = unpermute_rotary(values, heads)
        elif arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            values = unpermute_rotary(values, kv_heads)
        out[name] = torch.from_numpy(np.ascontiguousarray(values)).to(torch_dtype)
    if unknown:
        more = f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else ""
        raise UnsupportedModelError(
            f"{gguf_file.name}: tensors this runtime does not know for architecture {arch!r}: "
            f"{', '.join(unknown[:5])}{more}"
        )
    if "model.embed_tokens.weight" not in out:
        raise ModelLoadError(f"{gguf_file.name}: no token_embd.weight tensor")
    return out
